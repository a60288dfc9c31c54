"""A real control loop process (`edgeinfer control`) whose stdout nobody reads, flooded on its observation socket at
the highest rate this test can send, with unknown-schema frames among the observations (a 20 KB schema name,
whose error line once quoted it whole; the wire now quotes its start): it still commands every tick on time (the
flood costs superseded observations, obs_read_capped; the log lines wait in the queue of edgeinfer.core.logwriter,
each at most its maximum length; cutting itself: tests/test_logwriter.py)."""
import fcntl
import os
import subprocess
import sys
import threading
import time

import msgpack
import numpy as np
import zmq

from edgeinfer.control.loop import ControlConfig
from edgeinfer.core import transport
from edgeinfer.core.clock import now_ns
from edgeinfer.core.config import to_argv
from edgeinfer.core.logwriter import MAX_LINE_CHARS
from edgeinfer.core.wire import Hello, JointCommand, Observation, Start, Stats, Stop, encode

PERIOD_NS = 4_000_000  # 250 Hz
N_TICKS = 750  # 3 s
STALL_TICKS = 25  # a 100 ms host stall skips this many ticks


def full_pipe() -> tuple[int, int]:
    """A pipe (read, write) of one page, already full: a write to it blocks until someone reads."""
    r, w = os.pipe()
    fcntl.fcntl(w, 1031, 4096)  # F_SETPIPE_SZ
    os.set_blocking(w, False)
    try:
        while True:
            os.write(w, b"." * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(w, True)
    return r, w


def read_for(fd: int, seconds: float) -> str:
    """What arrives on fd within `seconds`."""
    os.set_blocking(fd, False)
    out, end = b"", time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            out += os.read(fd, 1 << 16)
        except BlockingIOError:
            time.sleep(0.01)
    return out.decode(errors="replace")


def handshake(obs_pub, chunk_pub, ready_rx, timeout_s=60.0):
    """Hellos on both of the control loop's SUBs until it reports ready."""
    deadline = time.monotonic() + timeout_s
    i = 0
    while time.monotonic() < deadline:
        for pub in (obs_pub, chunk_pub):
            transport.send(pub, Hello("test", i, now_ns()))
        i += 1
        msg = ready_rx.recv(10)
        if isinstance(msg, Hello) and msg.sender == "control":
            return
    raise TimeoutError("the control loop never reported ready")


def flood(obs_pub, until_ns: int, sent: list) -> None:
    q = np.zeros(6)
    unknown = [msgpack.packb({"schema": "S" * 20_000, "version": 1})]
    n = 0
    while now_ns() < until_ns:
        frames = unknown if n % 500 == 0 else encode(Observation(n, now_ns(), q, q, q))
        try:
            obs_pub.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            pass
        n += 1
    sent.append(n)


def test_a_flood_and_an_unread_stdout_cost_no_tick(tmp_path):
    ep = transport.Endpoints.free_loopback()
    ep.status = transport.Endpoints.free_loopback().status
    ctx = zmq.Context()
    r, w = full_pipe()
    cmd = [sys.executable, "-m", "edgeinfer", "control", *to_argv(ControlConfig()), *to_argv(ep)]
    with open(tmp_path / "control.err", "wb") as err:
        proc = subprocess.Popen(cmd, stdout=w, stderr=err)
    os.close(w)
    try:
        obs_pub = transport.pub(ctx, ep.obs, hwm=10_000)
        chunk_pub = transport.pub(ctx, ep.chunks)
        cmd_rx = transport.Receiver(transport.pull(ctx, ep.commands, hwm=10_000))
        ready_rx = transport.Receiver(transport.pull(ctx, ep.ready))
        status_rx = transport.Receiver(transport.sub(ctx, ep.status, hwm=10_000))
        handshake(obs_pub, chunk_pub, ready_rx)
        t0 = now_ns() + 300_000_000
        transport.send(obs_pub, Start(t0, PERIOD_NS, N_TICKS))
        q = np.zeros(6)
        transport.send(obs_pub, Observation(0, now_ns(), q, q, q))  # a state to hold from tick 0
        sent = []
        flooder = threading.Thread(target=flood, args=(obs_pub, t0 + (N_TICKS - 50) * PERIOD_NS, sent))
        flooder.start()
        flooder.join()
        stats = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            transport.send(obs_pub, Stop("end of test"))
            for msg in status_rx.drain(10_000):
                if isinstance(msg, Stats) and msg.sender == "control":
                    stats = msg.counters
            if stats is not None and stats["ticks"] + stats["overruns"] >= N_TICKS - 1:
                break
            time.sleep(0.05)
        commands = [m for m in cmd_rx.drain(10_000) if isinstance(m, JointCommand)]
        out = read_for(r, 1.0)  # now the writer thread gets its lines out
    finally:
        proc.kill()
        proc.wait()
        os.close(r)
        ctx.destroy(linger=0)
    assert stats is not None, (tmp_path / "control.err").read_text()[-2000:]
    late_ms = np.array([(c.t_ns - (t0 + c.seq * PERIOD_NS)) / 1e6 for c in commands])
    print(f"sent {sent[0]} observations; control: {stats}; lateness p50 {np.median(late_ms):.2f} ms")
    assert stats["malformed.schema"] >= 1  # error lines were provoked
    assert stats["obs_read_capped"] > 0 and stats["obs_superseded"] > 1000  # the flood outran the reader
    assert stats["overruns"] <= STALL_TICKS
    assert len({c.seq for c in commands}) >= N_TICKS - 1 - STALL_TICKS  # every tick commanded (its last: maybe)
    assert np.median(late_ms) < 3.0  # on its tick: 1 ms phase, the read budget (0.5 ms) and the tick's own work
    assert stats["log_dropped"] == 0  # the queue holds a few lines a second: none had to go
    # the node's log lines (not the command's summary, printed whole after the run), cut to their maximum
    lines = [line.lstrip(".") for line in out.splitlines() if "ControlStats(" not in line]
    assert any("unknown schema" in line for line in lines)
    assert all(len(line.split(" (")[0]) <= MAX_LINE_CHARS for line in lines)
