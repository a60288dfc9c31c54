"""The raw echo peers of the transport floors (bench/floors.py), each a process of its own as edgeinfer's nodes
are, so that neither side shares a GIL with the other; started through procs (procs/peers.py):

    python -m edgeinfer.bench.echo_peers rep                      a REP socket that sends every request back
    python -m edgeinfer.bench.echo_peers pubsub ENDPOINT echo     a SUB on ENDPOINT, every message back on a PUB
    python -m edgeinfer.bench.echo_peers pubsub ENDPOINT codec    the same, each message through the minimal codec

Each prints the port it bound, then echoes until it gets the one-frame b"stop", its starter is gone
(core.lifecycle.ParentWatch) or SILENCE_S pass without a message. Plain pyzmq on the echo path: no edgeinfer code
but the minimal codec's, when asked for; a message the codec refuses is dropped and counted (the count goes to
stderr at exit), never fatal. Bad arguments: the usage line and exit code 2.
"""
from __future__ import annotations

import sys

import zmq

from edgeinfer.core.lifecycle import ParentWatch

SILENCE_S = 60  # an orphan whose starter's pid was reused still exits after this long without a message
WAKE_MS = 1000  # how often a peer waiting for a message looks at its starter


def _recv(sock: zmq.Socket, watch: ParentWatch):
    """The next message (frames, not copied), or None when the starter is gone or SILENCE_S pass without one."""
    for _ in range(SILENCE_S * 1000 // WAKE_MS):
        try:
            return sock.recv_multipart(copy=False)
        except zmq.Again:
            if watch.parent_gone():
                return None
    return None


def rep_echo(watch: ParentWatch) -> None:
    """A REP socket on a free loopback port (printed): every request straight back; b"stop" is answered, then
    it exits."""
    ctx = zmq.Context()
    rep = ctx.socket(zmq.REP)
    rep.setsockopt(zmq.LINGER, 0)
    rep.setsockopt(zmq.RCVTIMEO, WAKE_MS)
    port = rep.bind_to_random_port("tcp://127.0.0.1")
    print(port, flush=True)
    while (frames := _recv(rep, watch)) is not None:
        if len(frames) == 1 and frames[0].bytes == b"stop":
            rep.send(b"stop")
            break
        rep.send_multipart(frames, copy=False)
    ctx.destroy(linger=0)


def pubsub_echo(endpoint: str, codec: bool, watch: ParentWatch) -> None:
    """A SUB connected to `endpoint`, a PUB on a free loopback port (printed): every message straight back
    (codec: decoded and encoded again, floors.minimal_decode / minimal_encode, but a one-frame probe of the
    handshake goes back as it came); b"stop" ends it."""
    from edgeinfer.bench.floors import minimal_decode, minimal_encode

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, WAKE_MS)
    try:
        sub.connect(endpoint)
    except zmq.ZMQError as e:
        ctx.destroy(linger=0)
        raise ValueError(f"ENDPOINT {endpoint!r}: {e}") from None
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    print(pub.bind_to_random_port("tcp://127.0.0.1"), flush=True)
    refused = 0
    while (frames := _recv(sub, watch)) is not None:
        if len(frames) == 1 and frames[0].bytes == b"stop":
            break
        if codec and len(frames) > 1:
            try:
                frames = minimal_encode(*minimal_decode(frames))
            except ValueError:  # malformed or non-finite: dropped, counted
                refused += 1
                continue
        pub.send_multipart(frames, copy=False)
    ctx.destroy(linger=0)
    if refused:
        print(f"echo_peers: {refused} message(s) refused by the codec", file=sys.stderr)


USAGE = ("usage: python -m edgeinfer.bench.echo_peers rep\n"
         "       python -m edgeinfer.bench.echo_peers pubsub ENDPOINT {echo,codec}   (ENDPOINT: tcp://HOST:PORT)")


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(f"{USAGE}\n\n{__doc__}")
        return 0
    watch = ParentWatch()
    try:
        if argv == ["rep"]:
            rep_echo(watch)
        elif argv[:1] == ["pubsub"] and len(argv) == 3 and argv[2] in ("echo", "codec"):
            pubsub_echo(argv[1], argv[2] == "codec", watch)
        else:
            raise ValueError(f"got {argv}")
    except ValueError as e:  # bad arguments, or an endpoint zmq cannot connect to
        print(f"{USAGE}\necho_peers: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
