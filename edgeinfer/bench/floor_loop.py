"""The floors every end-to-end figure is read against, measured on the same machine in the same run.

    zmq_round_trip_ms      a raw pyzmq REQ/REP echo between two processes over loopback TCP (edgeinfer.bench.floors),
                           with the payload of one Observation message; no edgeinfer code on the path
    zmq_round_trip_idle_ms the same after `idle_gap_ms` of silence before each request (cold wake-ups)
    wake_error_ms          a bare absolute-deadline loop, `sleep_until(t0 + n * period)` (edgeinfer.core.clock's
                           sleep-then-spin), at the log's period: how late each wake-up is

An end-to-end observation -> command latency crosses three sockets (replayer -> runtime -> control ->
replayer) and one wake-up of the control loop, so p50 / the round trip's p50 reads as "transport round
trips' worth" of latency, not as pure edgeinfer overhead.
"""
from __future__ import annotations

import numpy as np

from edgeinfer.bench.floors import raw_zmq_round_trip_ns
from edgeinfer.core.clock import now_ns, sleep_until
from edgeinfer.core.wire import Observation, encode


def observation_payload_bytes(n_joints: int) -> int:
    """Bytes on the wire (all frames) of one Observation with n_joints joints."""
    z = np.zeros(n_joints)
    return sum(len(memoryview(f).cast("B")) for f in encode(Observation(0, 0, z, z, z)))


def wake_error_ns(period_ns: int, n: int, spin_ns: int = 200_000) -> np.ndarray:
    """(n,) int64 lateness (ns, >= 0) of n wake-ups on the absolute grid t0 + i * period_ns, each slept with
    clock.sleep_until (sleep to spin_ns before the deadline, then spin). Raises ValueError for n < 1 or a
    period <= 0."""
    if n < 1 or period_ns <= 0:
        raise ValueError(f"need n >= 1 and period_ns > 0, got {n}, {period_ns}")
    t0 = now_ns() + period_ns
    return np.array([sleep_until(t0 + i * period_ns, spin_ns) for i in range(n)], dtype=np.int64)


def measure_floors(payload_bytes: int, period_ns: int, round_trips: int, idle_gap_ms: float,
                   idle_round_trips: int, wake_ticks: int) -> dict[str, np.ndarray]:
    """One repeat of every floor: {name: samples (n,) float64 ms} for zmq_round_trip_ms,
    zmq_round_trip_idle_ms and wake_error_ms."""
    return {
        "zmq_round_trip_ms": raw_zmq_round_trip_ns(payload_bytes, round_trips) / 1e6,
        "zmq_round_trip_idle_ms": raw_zmq_round_trip_ns(payload_bytes, idle_round_trips, idle_gap_ms, warmup=5) / 1e6,
        "wake_error_ms": wake_error_ns(period_ns, wake_ticks) / 1e6,
    }
