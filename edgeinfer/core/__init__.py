"""Core: the wire format, clocks, transport and liveliness, and the decoding algorithms (acceptance rules,
speculative decoding, the deadline planner). Imports nothing else of edgeinfer."""
