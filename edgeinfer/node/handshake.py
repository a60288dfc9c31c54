"""The runtime node's handshake: warm up, announce itself until the run starts, and (restarted mid-run) wait for
the control loop to hear it before serving."""
from __future__ import annotations

import os
from typing import Callable

from edgeinfer.core import transport
from edgeinfer.core.clock import now_ns
from edgeinfer.core.lifecycle import ParentWatch
from edgeinfer.core.liveliness import Lease
from edgeinfer.core.logwriter import emit
from edgeinfer.core.protocols import Runtime
from edgeinfer.core.wire import Heartbeat, Hello, Message, Start, Stop


def await_start(runtime: Runtime, obs_rx, out, ready, timeout_s: float, parent: ParentWatch,
                stopped: Callable[[], bool] = lambda: False,
                heard: Callable[[Message], None] = lambda msg: None,
                accept: Callable[[Start], bool] = lambda start: True,
                watch: tuple = ()) -> tuple[Start | None, bool]:
    """Warm up, then publish Hellos on the chunk PUB (for its subscribers) until Start arrives; heard(msg) gets each
    message of the source (its timestamps: edgeinfer/node/source.py). A Start (or schedule) accept() refuses is
    passed over: the handshake goes on until a valid one.

    Returns (start, mid_run). A runtime (re)started after the run began never sees the Start: the
    replayer's Heartbeat carries the same schedule, and mid_run is then True. (None, False) when a Stop
    arrives or stopped() (SIGTERM) turns true first. Raises TimeoutError after timeout_s, RuntimeError when
    the parent process is gone, transport.HandshakeError when a peer's handshake with one of the sockets `watch`
    failed for good (CURVE on one side only: transport.check_handshakes)."""
    runtime.warmup(runtime.warmup_observation())
    announced, i = False, 0
    deadline = now_ns() + int(timeout_s * 1e9)
    while now_ns() < deadline and not stopped():
        parent.check()
        transport.check_handshakes(*watch)
        out.send(Hello("runtime", i, now_ns()))
        i += 1
        msg = obs_rx.recv(transport.HELLO_PERIOD_MS)
        if msg is not None:
            heard(msg)
        if isinstance(msg, Hello) and not announced:
            announced = transport.announce_ready(ready, "runtime")
        elif isinstance(msg, Start) and accept(msg):
            return msg, False
        elif isinstance(msg, Heartbeat) and msg.sender == "replayer" and msg.t0_ns >= 0:
            if accept(start := Start(msg.t0_ns, msg.period_ns, msg.n_ticks)):
                return start, True
        elif isinstance(msg, Stop):
            return None, False
    if stopped():
        return None, False
    raise TimeoutError("runtime: no Start message")


def await_control(status_rx, obs_rx, control: Lease, timeout_s: float, parent: ParentWatch,
                  stopped: Callable[[], bool] = lambda: False, heard: Callable[[Message], None] = lambda msg: None,
                  watch: tuple = ()) -> bool:
    """Re-handshake of a runtime that joined mid-run: until the control loop's Heartbeat names this process as
    the runtime it hears (so its chunk SUB is subscribed here and no chunk is lost to the slow joiner).
    Observations meanwhile are stale and dropped (heard(msg) gets each). Gives up with a warning after timeout_s
    (True). False when a Stop arrives or stopped() (SIGTERM) turns true first: the run ended before this runtime
    served. Raises transport.HandshakeError as await_start."""
    deadline = now_ns() + int(timeout_s * 1e9)
    me = os.getpid()
    while now_ns() < deadline:
        parent.check()
        transport.check_handshakes(*watch)
        msg = status_rx.recv(transport.HELLO_PERIOD_MS)
        drained = obs_rx.drain()
        for m in drained:
            heard(m)
        if stopped() or any(isinstance(m, Stop) for m in drained):
            return False
        if isinstance(msg, Heartbeat):
            control.beat(msg, now_ns())
            if msg.peer_instance == me:
                return True
    emit(f"runtime: the control loop did not acknowledge this runtime within {timeout_s} s; serving anyway")
    return True
