"""Process wiring: starting node processes (fresh or forked from a preloaded server), handshakes, supervision
and teardown. spec.NodeSpec describes a node (and renders a graph of them as a launch file); nodes.NodeGroup
starts, checks, supervises and tears them down; forkserver forks them from a server that imported edgeinfer once;
peers starts and tears down the helper processes that are not nodes (`python -m MODULE ARGS`: measuring peers)."""
