"""Measurement floors: what the bare transport costs, so edgeinfer's own overhead can be read against it.

`raw_zmq_round_trip_ns` is the floor for an observation -> command round trip: a plain pyzmq REQ/REP
echo over loopback TCP between two processes, with no edgeinfer code on the path.
`raw_pubsub_round_trip_ns` is the same echo over the pattern edgeinfer's nodes use (a PUB out, a SUB back, on
each side) with edgeinfer's own frames: the floor of that pattern, still with no edgeinfer code on the path.
With codec=True each side also decodes and encodes every message with `minimal_decode` / `minimal_encode`
(a msgpack header and one frame of all arrays, one finite check): the floor of any Python node that
looks at its messages, and what edgeinfer's own codec and node loop are measured against.
"""
from __future__ import annotations

import math
import time
import warnings

import msgspec
import numpy as np
import zmq

from edgeinfer.procs.peers import Peer, spawn_peer

# inf * 0 is NaN by design in the finite checks below (the value is then refused): not a warning to print
warnings.filterwarnings("ignore", "invalid value encountered in dot", RuntimeWarning, module=__name__)

def minimal_decode(frames) -> tuple[object, np.ndarray]:
    """(header, all arrays as one fresh float64 vector) of [msgpack header, array frames...]: the least a node
    can do with a message and still trust it (the header parsed, the arrays copied out and checked finite).
    Raises ValueError on a malformed header, arrays that are not whole float64s, or a non-finite value."""
    try:
        header = msgspec.msgpack.decode(frames[0])
    except msgspec.DecodeError as e:
        raise ValueError(f"malformed header: {e}") from None
    flat = np.frombuffer(b"".join(frames[1:]), dtype="<f8").copy()  # ValueError unless whole float64s
    if not math.isfinite(flat.dot(np.zeros(flat.size))):
        raise ValueError("non-finite array value")
    return header, flat


def minimal_encode(header, flat: np.ndarray) -> list:
    """[msgpack header, one frame of all arrays], the arrays checked finite first (ValueError otherwise)."""
    if not math.isfinite(flat.dot(np.zeros(flat.size))):
        raise ValueError("non-finite array value")
    return [msgspec.msgpack.encode(header), flat]


def _start_echo(args: list[str]) -> Peer:
    """An echo peer (bench/echo_peers.py: a process of its own, as edgeinfer's nodes are, so that neither side
    shares a GIL with the other), started through procs (procs/peers.py); it prints its port first."""
    return spawn_peer("edgeinfer.bench.echo_peers", args, name="raw zmq echo")


def raw_pubsub_round_trip_ns(frames: list[bytes], n: int, idle_gap_ms: float = 0.0, warmup: int = 50,
                             timeout_s: float = 10.0, codec: bool = False) -> np.ndarray:
    """Round-trip times (ns, shape (n,), int64) of a raw pyzmq PUB/SUB echo over tcp://127.0.0.1: this process
    publishes `frames` (one multipart message) and a child process publishes them straight back, each side
    reading with a SUB. codec: this side encodes before each send and decodes each reply, the child decodes
    and encodes (minimal_decode / minimal_encode; frames must then be [msgpack header, float64 arrays...]).
    Otherwise as raw_zmq_round_trip_ns. Raises ValueError for bad arguments, RuntimeError
    when the echo process does not start or its subscription does not come up within timeout_s."""
    if not frames or n < 1 or idle_gap_ms < 0 or warmup < 0:
        raise ValueError(f"need frames, n >= 1, idle_gap_ms >= 0, warmup >= 0; got {len(frames)} frames, {n}, "
                         f"{idle_gap_ms}, {warmup}")
    ctx = zmq.Context()
    pub, sub = ctx.socket(zmq.PUB), ctx.socket(zmq.SUB)
    peer = None
    try:
        for s in (pub, sub):
            s.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        peer = _start_echo(["pubsub", f"tcp://127.0.0.1:{port}", "codec" if codec else "echo"])
        line = peer.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError(f"raw zmq PUB/SUB echo process did not start (exit code {peer.poll()})")
        sub.connect(f"tcp://127.0.0.1:{int(line)}")
        deadline = time.monotonic() + timeout_s
        while not sub.poll(10):  # both subscriptions are up once a probe comes back (PUB drops until then)
            if time.monotonic() > deadline:
                raise RuntimeError(f"raw zmq PUB/SUB echo: no reply within {timeout_s} s")
            pub.send(b"probe")
        time.sleep(0.05)
        while sub.poll(0):  # the probes still in flight
            sub.recv_multipart()
        if codec:
            header, flat = minimal_decode(frames)  # what this side sends

            def round_trip():
                pub.send_multipart(minimal_encode(header, flat), copy=False)
                minimal_decode(sub.recv_multipart(copy=False))
        else:
            def round_trip():
                pub.send_multipart(frames, copy=False)
                sub.recv_multipart(copy=False)
        out = _timed(round_trip, n, idle_gap_ms, warmup)
        pub.send(b"stop")
        return out
    finally:
        ctx.destroy(linger=0)
        if peer is not None:
            peer.finish(timeout_s=2.0, term_s=1.0)  # told to stop: a straggler is terminated


def raw_zmq_round_trip_ns(payload_bytes: int, n: int, idle_gap_ms: float = 0.0, warmup: int = 50) -> np.ndarray:
    """Round-trip times (ns, shape (n,), int64) of a raw pyzmq REQ/REP echo over tcp://127.0.0.1.

    Each request is one frame of `payload_bytes` bytes, echoed back by a REP socket in a child process;
    `idle_gap_ms` of sleep separates consecutive requests (0: back to back), which exposes the wake-up
    cost after idle. `warmup` untimed round trips come first (connection set-up, page faults).
    Timed with time.perf_counter_ns (CLOCK_MONOTONIC). Raises ValueError for a negative size/gap or
    n < 1, RuntimeError when the echo process does not start.
    """
    if payload_bytes < 0 or n < 1 or idle_gap_ms < 0 or warmup < 0:
        raise ValueError(f"need payload_bytes >= 0, n >= 1, idle_gap_ms >= 0, warmup >= 0; got "
                         f"{payload_bytes}, {n}, {idle_gap_ms}, {warmup}")
    peer = _start_echo(["rep"])
    ctx = zmq.Context()
    try:
        line = peer.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError(f"raw zmq echo process did not start (exit code {peer.poll()})")
        req = ctx.socket(zmq.REQ)
        req.setsockopt(zmq.LINGER, 0)
        req.connect(f"tcp://127.0.0.1:{int(line)}")
        payload = np.random.default_rng(0).integers(0, 256, payload_bytes, dtype=np.uint8).tobytes()
        out = _timed(lambda: (req.send(payload, copy=False), req.recv(copy=False)), n, idle_gap_ms, warmup)
        req.send(b"stop")
        req.recv()
        return out
    finally:
        ctx.destroy(linger=0)
        peer.finish(timeout_s=2.0, term_s=1.0)  # told to stop: a straggler is terminated


def _timed(round_trip, n: int, idle_gap_ms: float, warmup: int) -> np.ndarray:
    """(n,) int64 ns of round_trip() calls, after `warmup` untimed ones, with idle_gap_ms of sleep before each
    timed one."""
    out = np.empty(n, dtype=np.int64)
    for i in range(-warmup, n):
        if idle_gap_ms > 0 and i >= 0:
            time.sleep(idle_gap_ms / 1000)
        t = time.perf_counter_ns()
        round_trip()
        if i >= 0:
            out[i] = time.perf_counter_ns() - t
    return out
