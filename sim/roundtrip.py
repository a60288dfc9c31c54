"""Bare network round trips to the runtime host, for `edgeinfer hil` (sim/hil.py).

A DEALER sends a numbered 8-byte probe to the runtime node's echo (edgeinfer.node.echo.start_echo, a ROUTER that
libzmq's proxy answers without the GIL) and times the reply on this host's monotonic clock: both timestamps are
ours, so no clock of the other host enters the figure. During a replay the probes come from a child process of
their own (`python -m edgeinfer.sim.roundtrip`, started through procs/peers.py), so that neither the replayer's
pacing loop nor its GIL delays a reply's receipt, and the replayer's timing is not disturbed by the probes.

This module stays light (zmq, numpy and core): the child must start in a fraction of a second.
"""
from __future__ import annotations

import select
import sys
from pathlib import Path

import numpy as np
import zmq

from edgeinfer.core.clock import now_ns, sleep_until
from edgeinfer.core.lifecycle import ParentWatch
from edgeinfer.core.transport import CurveKeys

PROBE_BYTES = 8  # a sequence number: the figure is the network's fixed cost, not a bandwidth
WARMUP_PROBES = 5  # untimed, first: the TCP connect and ZMTP (and CURVE) handshakes ride on the first probe


def connect(ctx: zmq.Context, endpoint: str, keys: CurveKeys | None) -> zmq.Socket:
    """A DEALER connected to the echo at `endpoint` (a CURVE client when keys are given)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 10)
    sock.setsockopt(zmq.RCVHWM, 10)
    if keys is not None:
        sock.curve_serverkey = keys.server_public
        sock.curve_publickey, sock.curve_secretkey = keys.client_public, keys.client_secret
    sock.connect(endpoint)
    return sock


def probe_once(sock: zmq.Socket, seq: int, timeout_ns: int) -> tuple[int, int]:
    """Send probe `seq`, wait up to timeout_ns for its echo. Returns (t_sent_ns, round_trip_ns), round trip -1
    when no echo came in time (a late echo of an earlier probe is recognised by its number and dropped)."""
    t_sent = now_ns()
    try:
        sock.send(seq.to_bytes(PROBE_BYTES, "little"), flags=zmq.NOBLOCK)
    except zmq.Again:  # not connected yet, or the queue is full: a lost probe
        return t_sent, -1
    deadline = t_sent + timeout_ns
    while (left_ns := deadline - now_ns()) > 0:
        if not sock.poll(max(1, left_ns // 1_000_000)):
            continue
        reply = sock.recv()
        t = now_ns()
        if int.from_bytes(reply[:PROBE_BYTES], "little") == seq:
            return t_sent, t - t_sent
    return t_sent, -1


def round_trips(sock: zmq.Socket, n: int, period_ns: int, timeout_ns: int, first_seq: int = 0,
                stop=None) -> np.ndarray:
    """Up to n probes at absolute times t0 + k * period_ns (a late probe does not shift the later ones); stop(),
    when given, is asked before each and ends the series early. Returns (k, 2) int64: t_sent_ns, round_trip_ns
    (-1 = lost)."""
    out = []
    t0 = now_ns()
    for k in range(n):
        if stop is not None and stop():
            break
        sleep_until(t0 + k * period_ns)
        out.append(probe_once(sock, first_seq + k, timeout_ns))
    return np.array(out, dtype=np.int64).reshape(-1, 2)


def warm_up(sock: zmq.Socket, timeout_ns: int) -> bool:
    """WARMUP_PROBES untimed probes; True when at least one was echoed."""
    return bool(np.any(round_trips(sock, WARMUP_PROBES, 1_000_000, timeout_ns, first_seq=1 << 60)[:, 1] >= 0))


def _child(argv: list[str]) -> int:
    """`python -m edgeinfer.sim.roundtrip ENDPOINT PERIOD_MS TIMEOUT_MS OUT.npy [CURVE_DIR]`: print `ready` once
    connected and warmed up, wait for a line on stdin, then probe every PERIOD_MS until stdin has another line
    (or closes); write the (k, 2) int64 samples to OUT.npy. Exits 1, writing nothing, when its starter dies
    before the echo answers (core.lifecycle.ParentWatch)."""
    endpoint, period_ms, timeout_ms, out = argv[0], float(argv[1]), float(argv[2]), Path(argv[3])
    keys = CurveKeys.load(Path(argv[4])) if len(argv) > 4 else None
    ctx = zmq.Context()
    try:
        sock = connect(ctx, endpoint, keys)
        watch = ParentWatch()  # its starter (procs/peers.py) names itself; an orphan stops waiting
        while not warm_up(sock, int(timeout_ms * 1e6)):  # the runtime may start after us
            if watch.parent_gone():
                return 1
        print("ready", flush=True)
        sys.stdin.readline()  # go
        stop = lambda: bool(select.select([sys.stdin], [], [], 0)[0])  # noqa: E731 (a line or EOF: stop)
        samples = round_trips(sock, 1 << 40, int(period_ms * 1e6), int(timeout_ms * 1e6), stop=stop)
        np.save(out, samples)
    finally:
        ctx.destroy(linger=0)
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
