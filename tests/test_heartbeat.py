"""Liveliness and metrics pieces without processes: the lease, the link monitor on a real socket, telemetry
(counters, histograms, rate-limited error events) and the new wire messages."""
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq

from edgeinfer.core import transport
from edgeinfer.core.liveliness import GAP_WINDOW, GapWindow, Lease, LinkMonitor
from edgeinfer.core.telemetry import BUCKET_BOUNDS_US, Telemetry, histogram_quantile_us, stats_summary
from edgeinfer.core.throttle import NodeLog, Throttle
from edgeinfer.core.wire import ERROR_KINDS, ErrorEvent, Heartbeat, Observation, Stats, WireError, decode, encode
from edgeinfer.node.node_liveliness import RuntimeLiveliness
from edgeinfer.node.node_telemetry import NodeTelemetry

MS = 1_000_000


def hb(instance=100, lease_ms=6, sender="runtime", t0=-1):
    return Heartbeat(sender, instance, 1, 0, lease_ms * MS, -1, t0, 4 * MS if t0 >= 0 else -1, 10 if t0 >= 0 else -1)


def test_lease_expires_and_a_new_instance_is_a_restart():
    lease = Lease("runtime", 50 * MS)
    assert not lease.check(0)  # unknown until its first Heartbeat
    lease.beat(hb(lease_ms=6), t_ns=1000 * MS)
    assert lease.alive and lease.lease_ns == 6 * MS and lease.joined == 1
    assert lease.check(1006 * MS)  # exactly at the lease: still alive
    assert not lease.check(1006 * MS + 1)  # one ns past: dead
    assert (lease.lost, lease.expired, lease.lost_at_ns) == (1, 1, 1006 * MS + 1)
    lease.beat(hb(sender="control"), 1007 * MS)  # another peer's beat changes nothing
    assert not lease.alive
    lease.beat(hb(instance=200), 1010 * MS)  # a restarted process
    assert lease.alive and lease.restarts == 1 and lease.joined == 2 and lease.instance == 200
    lease.drop(1011 * MS)
    assert not lease.alive and lease.lost == 2 and lease.expired == 1


def test_link_monitor_sees_a_killed_publisher_and_its_successor():
    ep = transport.Endpoints.free_loopback()
    script = f"import zmq, time\nc = zmq.Context()\np = c.socket(zmq.PUB)\np.bind('{ep.chunks}')\ntime.sleep(60)\n"
    ctx = zmq.Context()
    try:
        sock = transport.sub(ctx, ep.chunks)
        mon = LinkMonitor(sock)
        for _ in range(2):  # the second publisher binds the port the first one held: reconnect, not restart
            peer = subprocess.Popen([sys.executable, "-c", script])
            deadline = time.monotonic() + 20
            while mon.poll()[0] == 0:
                assert time.monotonic() < deadline, "never connected"
                time.sleep(0.01)
            peer.kill()
            peer.wait()
            deadline = time.monotonic() + 5
            while mon.poll()[1] == 0:
                assert time.monotonic() < deadline, "disconnect not seen"
                time.sleep(0.001)
        assert mon.disconnects == 2
        mon.close()
    finally:
        ctx.destroy(linger=0)


def test_telemetry_counts_histograms_and_rate_limits_error_events():
    tel = Telemetry("runtime", stats_period_ms=1000, error_interval_ms=10_000)
    tel.count("a")
    tel.count("a", 2)
    for us in (0.5, 1, 3, 1000, 10**9):
        tel.observe_ns("lat", int(us * 1000))
    counts = tel.histograms["lat"]
    assert len(counts) == len(BUCKET_BOUNDS_US) + 1 and sum(counts) == 5
    assert counts[0] == 2 and counts[2] == 1 and counts[-1] == 1  # <=1 us twice; (2, 4] us; overflow
    assert histogram_quantile_us(counts, 0.5) == 4.0 and histogram_quantile_us(counts, 1.0) == float("inf")
    first = tel.error("garbage", "bad one")
    assert isinstance(first, ErrorEvent) and first.count == 1
    assert tel.error("garbage", "bad two") is None  # within the interval: counted, not published
    later = tel.error("version", "other kind")  # each kind has its own interval
    assert later is not None and later.kind == "version"
    assert tel.counters == {"a": 3, "error.garbage": 2, "error.version": 1}
    assert tel.stats_due(0) and not tel.stats_due(1)
    stats = decode(encode(tel.snapshot()))
    assert isinstance(stats, Stats) and stats.counters["error.garbage"] == 2 and stats.histograms["lat"] == counts
    summary = stats_summary(stats)
    assert summary["latency_us"]["lat"] == {"count": 5, "p50_le": 4.0, "p99_le": float("inf")}


def test_heartbeat_and_error_event_round_trip():
    for msg in (hb(t0=123), ErrorEvent("control", "version", 7, 5, "x" * 1000)):
        assert decode(encode(msg)) == msg


@pytest.mark.parametrize("counters, match", [
    ({"a": True}, "counters.*expected int, got bool"), ({"a": 1.5}, "expected int, got float"),
    ({1: 1}, "counters.*key.*expected str"), ({f"k{i}": i for i in range(65)}, "counters.*map of length <= 64"),
    ({"a": 2**63}, "counters.*<= 9223372036854775807"), ({"a": 2**64}, "cannot encode"),
])
def test_stats_fields_are_checked(counters, match):
    with pytest.raises(WireError, match=match):
        encode(Stats("runtime", 1, 1, 0, counters, {}))


def test_every_rejection_has_a_kind_and_non_finite_never_encodes():
    q = np.zeros(6)
    with pytest.raises(WireError) as info:
        encode(Observation(0, 0, np.full(6, np.inf), q, q))
    assert info.value.kind == "nonfinite"
    with pytest.raises(WireError) as info:
        decode([b"\xc1"])
    assert info.value.kind == "garbage" and set(ERROR_KINDS) >= {"garbage", "nonfinite"}


def test_lease_derived_from_the_link_between_the_announced_lease_and_the_ceiling():
    lease = Lease("runtime", 50 * MS, ceiling_ns=20 * MS)
    t = 0
    for _ in range(10):  # regular 2 ms gaps: 1.5 x 2 = 3 ms, under the announced 6 ms: the announced one
        t += 2 * MS
        lease.beat(hb(lease_ms=6), t)
    assert lease.lease_ns == 6 * MS and lease.gaps.max() == 2 * MS
    t += 10 * MS  # one 10 ms gap (a stalled link): no loss yet as nobody checked; 1.5 x 10 = 15 ms from now on
    assert lease.beat(hb(lease_ms=6), t) == 10 * MS and lease.lease_ns == 15 * MS
    assert lease.check(t + 15 * MS) and not lease.check(t + 15 * MS + 1)
    assert (lease.lost, lease.expired) == (1, 1)
    t += 40 * MS  # the same instance again after a 40 ms gap: it was late (returned), and 60 ms is capped at 20
    lease.beat(hb(lease_ms=6), t)
    assert lease.alive and lease.returned == 1 and lease.restarts == 0 and lease.lease_ns == 20 * MS
    assert lease.joined_as == "back"
    lease.beat(hb(lease_ms=30), t + MS)  # an announced lease over the ceiling wins: the peer beats no faster
    assert lease.lease_ns == 30 * MS
    for _ in range(GAP_WINDOW):  # the long gaps slide out of the window
        t += 2 * MS
        lease.beat(hb(lease_ms=6), t)
    assert lease.gaps.max() == 2 * MS and lease.lease_ns == 6 * MS
    t += 10 * MS
    lease.drop(t)  # the connection dropped: the gap across it is not the link's
    assert lease.beat(hb(lease_ms=6), t + 30 * MS) is None and lease.returned == 2 and lease.gaps.max() == 2 * MS
    assert lease.beat(hb(instance=7, lease_ms=6), t + 40 * MS) is None  # a restart: the old gaps forgotten
    assert lease.restarts == 1 and lease.gaps.max() == 0 and lease.returned == 2 and lease.joined_as == "back"
    assert Lease("control", 50 * MS).beat(hb(lease_ms=6), 0) is None  # no ceiling: the announced lease as is


def test_gap_window_is_a_sliding_maximum():
    rng = np.random.default_rng(0)
    gaps = rng.integers(0, 1000, 500)
    window = GapWindow(7)
    for i, g in enumerate(gaps):
        window.add(int(g))
        assert window.max() == gaps[max(0, i - 6):i + 1].max()


def test_throttle_passes_one_per_interval_per_kind_and_counts_the_rest():
    throttle = Throttle(interval_ns=100)
    assert throttle.admit("overrun", 0) == 0
    assert throttle.admit("overrun", 50) is None and throttle.admit("overrun", 99) is None
    assert throttle.admit("lost", 60) == 0  # each kind on its own
    assert throttle.admit("overrun", 100) == 2  # the two held back since it last passed
    assert throttle.admit("overrun", 150) is None
    assert throttle.suppressed == 3 and throttle.flush() == {"overrun": 1} and throttle.flush() == {}


def test_node_log_throttles_per_kind_with_the_suppressed_count():
    clock, lines = [0], []
    log = NodeLog("control", interval_ms=1000, clock=lambda: clock[0], write=lines.append)
    for i in range(500):  # an overrun every 2 ms for a second, and one other line
        clock[0] = i * 2 * MS
        log.line("overrun", f"overrun at tick {i}")
    log.line("runtime_lost", "runtime lost")
    clock[0] = 1000 * MS
    assert log.line("overrun", "overrun at tick 500")
    log.line("overrun", "overrun at tick 501")
    log.close()
    assert lines == ["control: overrun at tick 0", "control: runtime lost",
                     "control: overrun at tick 500 (499 more like this suppressed)",
                     "control: 1 more overrun lines suppressed"]
    assert log.suppressed == 500


def test_report_publishes_every_event_when_asked_and_logs_throttled():
    clock, sent, lines = [0], [], []
    tel = Telemetry("control", error_interval_ms=100, clock=lambda: clock[0], publish=sent.append)
    tel.log.write = lines.append
    for i in range(5):
        clock[0] = i * MS
        tel.report("runtime_lost", f"loss {i}", every=True)  # a state change: every one published
        tel.report("garbage", f"bad {i}")  # a flood: one per 100 ms
    assert [(e.kind, e.count) for e in sent] == [("runtime_lost", 1), ("garbage", 1), ("runtime_lost", 2),
                                                 ("runtime_lost", 3), ("runtime_lost", 4), ("runtime_lost", 5)]
    assert tel.counters["error.runtime_lost"] == 5 and tel.counters["error.garbage"] == 5
    assert lines == ["control: loss 0", "control: bad 0"]  # the log: once per second per kind
    assert tel.snapshot().counters["log_suppressed"] == 8


class _Out:
    def __init__(self):
        self.sent = []

    def send(self, msg):
        self.sent.append(msg)
        return True


class _StatusRx:
    def __init__(self):
        self.queue = []

    def drain(self):
        out, self.queue = self.queue, []
        return out


def test_the_runtime_reports_every_loss_of_the_control_loop():
    out, rx = _Out(), _StatusRx()
    telemetry = NodeTelemetry("runtime", 200.0, out, dict)
    lines = []
    telemetry.log.write, telemetry.log.clock = lines.append, lambda: 0
    live = RuntimeLiveliness(out, 2.0, 6.0, rx, telemetry, parent=None)
    t = 0
    for _ in range(3):  # the control loop beats, falls silent past its 50 ms lease, beats again
        rx.queue = [hb(sender="control", lease_ms=50)]
        live.poll(t)
        live.poll(t + 51 * MS)
        t += 100 * MS
    events = [m for m in out.sent if isinstance(m, ErrorEvent)]
    assert [(e.kind, e.count) for e in events] == [("control_lost", 1), ("control_lost", 2), ("control_lost", 3)]
    assert "control loop 100 lost: no heartbeat for 51.0 ms (lease 50.0 ms expired)" in events[0].detail
    assert live.control.lost == 3 and live.control.returned == 2
    assert lines == ["runtime: control loop 100 alive", "runtime: control loop 100 lost: no heartbeat for 51.0 ms "
                     "(lease 50.0 ms expired)", "runtime: control loop 100 back"]  # throttled: one per kind
