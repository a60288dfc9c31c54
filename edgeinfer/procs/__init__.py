"""Process wiring: starting node processes (fresh or forked from a preloaded server), handshakes, supervision
and teardown."""
