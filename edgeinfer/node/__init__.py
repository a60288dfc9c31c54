"""Nodes that run the policy: the runtime node (`edgeinfer serve`) and the embedded Controller."""
