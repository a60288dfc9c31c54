"""The replayer's pacing over real ZeroMQ sockets (no runtime or control process): absolute schedule with a
time scale, skip-ahead after a stall (or a burst when catching up), as fast as possible, faults on the way,
and the send-timing error it reports about itself. Timings are recorded, never held to a speed bar."""
from __future__ import annotations

import time

import numpy as np
import pytest
import zmq
from delivery import received

from edgeinfer.core import transport
from edgeinfer.core.clock import SpinTail
from edgeinfer.core.wire import Observation, Start
from edgeinfer.logs.arm_log import ArmLog, synthetic_log
from edgeinfer.sim.network_faults import NetworkFaultConfig
from edgeinfer.sim.pacing import scaled_period_ns, send_timing_report, should_skip
from edgeinfer.sim.replay import stream
from edgeinfer.sim.run_config import ReplayConfig
from edgeinfer.sim.schedule import tick_grid

STRIDE = 5


@pytest.fixture
def sockets():
    ctx = zmq.Context()
    ep = transport.Endpoints.free_loopback()
    pub = transport.pub(ctx, ep.obs, bind=True, hwm=100_000)
    sub = transport.sub(ctx, ep.obs, hwm=100_000)
    cmd_rx = transport.Receiver(transport.pull(ctx, ep.commands, bind=True))
    chunk_rx = transport.Receiver(transport.sub(ctx, ep.chunks))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # PUB/SUB slow joiner: wait until a probe gets through
        transport.send(pub, Start(0, 1, 1))
        if sub.poll(50):
            while sub.poll(20):
                sub.recv_multipart()
            break
    yield pub, transport.Receiver(sub), cmd_rx, chunk_rx
    ctx.destroy(linger=0)


def _replay(sockets, log: ArmLog, stall_at: int | None = None, stall_ms: float = 40.0, **pacing):
    pub, sub, cmd_rx, chunk_rx = sockets

    def progress(i):  # called from the replayer loop every 128 rows: a stand-in for a slow moment
        if i == stall_at:
            time.sleep(stall_ms / 1e3)

    rec = stream(log, tick_grid(log), STRIDE, pub, cmd_rx, chunk_rx, 1.0, 50.0, pacing=ReplayConfig(**pacing),
                  progress=progress)
    counts = (rec.faults or {}).get("counts", {})
    arriving = rec.pacing["rows_sent"] + counts.get("duplicated", 0) - sum(
        counts.get(k, 0) for k in ("dropped", "burst_dropped", "malformed"))
    msgs = _received(sub, 1 + arriving)
    assert isinstance(msgs[0], Start) and msgs[0].period_ns == rec.period_ns
    return rec, [m for m in msgs if isinstance(m, Observation)]


def _received(sub, expected: int) -> list:
    """Messages from `sub` until `expected` have come, then whatever else is queued (tests/delivery.py); the
    fixture's slow-joiner probes (Start(0, 1, 1)) that straggle in are left out."""
    return received(sub, expected, keep=lambda m: not (isinstance(m, Start) and m.t0_ns == 0 and m.period_ns == 1))


def test_time_scale_keeps_an_absolute_schedule(sockets):
    log = synthetic_log(seconds=0.4, seed=1)  # 100 rows at 250 Hz
    rec, got = _replay(sockets, log, time_scale=4.0)
    assert rec.period_ns == scaled_period_ns(log.period_ns, 4.0) == 1_000_000
    np.testing.assert_array_equal(np.diff(rec.t_sched_ns), 1_000_000)
    assert (rec.t_sent_ns >= rec.t_sched_ns).all()  # never early
    p = rec.pacing
    assert p["time_scale"] == 4.0 and p["rows_sent"] + p["rows_skipped"] == len(log)
    assert p["send_error_us"]["n"] == p["rows_sent"] and p["send_error_us"]["p50"] <= p["send_error_us"]["max"]
    # what arrived is the stream: seq = tick, t_ns = scheduled time, q/qd from the log
    sent = ~rec.skipped
    assert [o.seq for o in got] == tick_grid(log)[sent].tolist()
    assert [o.t_ns for o in got] == rec.t_sched_ns[sent].tolist()
    np.testing.assert_array_equal(np.stack([o.q_rad for o in got]), log.q_rad[sent])


def test_after_a_stall_stale_rows_are_skipped_not_burst(sockets):
    log = synthetic_log(seconds=1.0, seed=2)  # 250 rows; the stall comes at row 128
    rec, got = _replay(sockets, log, stall_at=128, stall_ms=40.0)
    skipped = np.flatnonzero(rec.skipped)
    # 40 ms at 4 ms per row: rows 129..137 at least are due before the replayer is back
    assert set(range(129, 138)) <= set(skipped.tolist())
    assert rec.pacing["rows_skipped"] == len(skipped) and rec.pacing["rows_sent"] == len(got)
    for i in np.flatnonzero(~rec.skipped)[:-1]:  # every row sent was still current: its successor not yet due
        assert rec.t_sent_ns[i] < rec.t_sched_ns[i + 1]
    assert set(o.seq for o in got).isdisjoint(skipped.tolist())


def test_catch_up_sends_every_row(sockets):
    log = synthetic_log(seconds=1.0, seed=2)
    rec, got = _replay(sockets, log, stall_at=128, stall_ms=40.0, catch_up=True)
    assert not rec.skipped.any() and len(got) == len(log)
    late = (rec.t_sent_ns - rec.t_sched_ns)[129:138]
    assert (late >= rec.period_ns).all()  # the burst: rows sent more than a period after their time
    assert rec.pacing["late_sends"] >= 9 and rec.pacing["rows_skipped"] == 0


def test_as_fast_as_possible(sockets):
    log = synthetic_log(seconds=0.4, seed=3)
    rec, got = _replay(sockets, log, as_fast_as_possible=True)
    assert len(got) == len(log) and not rec.skipped.any()
    np.testing.assert_array_equal(rec.t_sched_ns, rec.t_sent_ns)  # no schedule: due when sent
    assert (np.diff(rec.t_sent_ns) > 0).all()
    assert rec.pacing["send_error_us"] is None and rec.pacing["as_fast_as_possible"]


def test_faults_on_the_stream(sockets):
    log = synthetic_log(seconds=0.4, seed=4)
    rec, got = _replay(sockets, log, time_scale=2.0, faults=NetworkFaultConfig(drop_rate=0.2, duplicate_rate=0.1,
                                                                                 fault_seed=8))
    f = rec.faults
    assert f["seed"] == 8 and f["config"]["drop_rate"] == 0.2
    c = f["counts"]
    assert c["dropped"] > 0 and c["duplicated"] > 0
    sent = int((~rec.skipped).sum())
    assert len(got) == sent - c["dropped"] + c["duplicated"]
    assert set(o.seq for o in got).isdisjoint(tick_grid(log)[f["rows"]["dropped"]].tolist())


def test_send_timing_report_and_skip_rule():
    t_sched = np.arange(6, dtype=np.int64) * 4_000_000
    t_sent = t_sched + np.array([10_000, 20_000, 9_000_000, 500_000, 0, 0])
    t_sent[5] = 0  # never reached (interrupted)
    skipped = np.array([False, False, True, False, False, False])
    r = send_timing_report(t_sched, t_sent, skipped, 4_000_000, 1.0, False, False)
    # rows 0, 1, 3 sent (row 4 sent exactly on time: t_sent = t_sched = 16 ms)
    assert r["rows_sent"] == 4 and r["rows_skipped"] == 1
    assert r["send_error_us"]["max"] == 500.0 and r["send_error_us"]["p50"] == pytest.approx(15.0)
    assert r["late_sends"] == 1 and r["late_threshold_us"] == 400.0  # 10 % of the 4 ms period
    assert should_skip(2, 8_000_000 + 4_000_000, t_sched, catch_up=False)
    assert not should_skip(2, 8_000_000 + 4_000_000, t_sched, catch_up=True)
    assert not should_skip(2, 8_000_000 + 3_999_999, t_sched, catch_up=False)
    assert not should_skip(5, 10**12, t_sched, catch_up=False)  # the last row is never stale


def test_spin_tail_follows_wake_up_lateness():
    tail = SpinTail(4_000_000)
    assert tail.spin_ns == 200_000 and tail.max_ns == 500_000
    tail.woke(300_000)
    assert tail.spin_ns == int(1.25 * 300_000 + 50_000)
    tail.woke(5_000_000)
    assert tail.spin_ns == 500_000  # capped at an eighth of a period
    for _ in range(2000):
        tail.woke(10_000)
    assert tail.spin_ns == 200_000  # back to the floor once the machine is quiet
