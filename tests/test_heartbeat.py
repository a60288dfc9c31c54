"""Liveliness and metrics pieces without processes: the lease, the link monitor on a real socket, telemetry
(counters, histograms, rate-limited error events) and the new wire messages."""
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq

from edgeinfer.core import transport
from edgeinfer.core.liveliness import Lease, LinkMonitor
from edgeinfer.core.telemetry import BUCKET_BOUNDS_US, Telemetry, histogram_quantile_us, stats_summary
from edgeinfer.core.wire import ERROR_KINDS, ErrorEvent, Heartbeat, Observation, Stats, WireError, decode, encode

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
