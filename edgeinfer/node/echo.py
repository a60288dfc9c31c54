"""The runtime node's round-trip echo: the bare network's round trip, for `edgeinfer hil` (sim/roundtrip.py)."""
from __future__ import annotations

import threading
from typing import Callable

import zmq

from edgeinfer.core import transport


def start_echo(endpoint: str, keys: transport.CurveKeys | None) -> Callable[[], None]:
    """A ROUTER bound at `endpoint` that sends every message straight back to its sender (the network round-trip
    probe of sim/hil.py), CURVE server when `keys` are given. libzmq's proxy (frontend = backend) runs it in C with
    the GIL released, on a context of its own, so a decode on the main thread never delays a reply. Returns
    stop(). Raises zmq.ZMQError when the endpoint cannot be bound."""
    ctx = zmq.Context()
    auth = transport.start_authenticator(ctx, keys)
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, 4096)  # probes are a few bytes
    if keys is not None:
        sock.curve_server = True
        sock.curve_publickey, sock.curve_secretkey = keys.server_public, keys.server_secret
    sock.bind(endpoint)

    def run() -> None:
        try:
            zmq.proxy(sock, sock)
        except zmq.ContextTerminated:  # stop(): ctx.term() ends the proxy
            pass
        finally:
            sock.close(linger=0)
    thread = threading.Thread(target=run, name="echo", daemon=True)
    thread.start()

    def stop() -> None:
        if auth is not None:
            auth.stop()
        ctx.term()  # returns once run() has closed the socket
        thread.join()
    return stop
