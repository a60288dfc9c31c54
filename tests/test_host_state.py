"""The host state every report carries (sim/host.py): the wake-up baseline's arithmetic on an injected clock,
real-time grants read from a process, the machine's description, and how the table and compare show it."""
from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from rich.console import Console

from edgeinfer.sim.compare import compare
from edgeinfer.sim.host import host_state, measure_host, sched_state, wakeup_latency_us
from edgeinfer.sim.report import print_table

PERIOD = 4_000_000


class FakeClock:
    """now() in ns; sleep(s) advances it by the time asked plus `late_ns` (plus `stall_ns` once, at wake-up k)."""

    def __init__(self, late_ns: int, stall_at: int | None = None, stall_ns: int = 0):
        self.t, self.late_ns, self.stall_at, self.stall_ns, self.sleeps = 10**9, late_ns, stall_at, stall_ns, 0

    def now(self) -> int:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += round(s * 1e9) + self.late_ns + (self.stall_ns if self.sleeps == self.stall_at else 0)
        self.sleeps += 1


def test_wakeup_latency_is_the_lateness_of_each_absolute_deadline():
    fake = FakeClock(late_ns=30_000)
    w = wakeup_latency_us(PERIOD, 0.2, fake.now, fake.sleep)
    assert w["n"] == 50 and w["skipped"] == 0 and w["period_us"] == 4000.0
    assert w["p50"] == w["p99"] == w["max"] == pytest.approx(30.0)  # a relative sleep would drift instead
    assert fake.t == pytest.approx(10**9 + 50 * PERIOD + 30_000)  # absolute deadlines: lateness never accumulates


def test_a_wakeup_later_than_a_period_skips_deadlines_not_bursts():
    fake = FakeClock(late_ns=20_000, stall_at=10, stall_ns=int(2.5 * PERIOD))
    w = wakeup_latency_us(PERIOD, 0.2, fake.now, fake.sleep)
    assert w["skipped"] == 2 and w["max"] == pytest.approx(2.5 * PERIOD / 1e3 + 20.0)
    assert w["p50"] == pytest.approx(20.0)  # the wake-ups after it are on their own deadlines again


def test_no_baseline_and_bad_period():
    assert wakeup_latency_us(PERIOD, 0) is None
    with pytest.raises(ValueError, match="period_ns"):
        wakeup_latency_us(0, 0.1)


def test_host_state_describes_the_machine():
    h = host_state()
    assert isinstance(h["cpu_model"], str) and h["cpu_model"]
    assert h["cpus"] >= 1 and 1 <= h["cpus_allowed"] <= h["cpus"]
    assert isinstance(h["governor"], str) and h["governor"]
    assert len(h["load_average"]) == 3 and all(x >= 0 for x in h["load_average"])
    assert h["kernel"].startswith(os.uname().release)


def test_sched_state_reads_what_a_process_got():
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert sched_state(0) == {"policy": "SCHED_OTHER", "priority": 0, "nice": mine, "requested": None, "granted": None}
    assert sched_state(0, 60)["granted"] is False  # asked for, not granted
    code = ("import os, time; os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(7)); print(1, flush=True); "
            "time.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        if child.stdout.readline().strip() != b"1":
            pytest.skip("SCHED_FIFO not permitted here")
        assert sched_state(child.pid, 7) == {"policy": "SCHED_FIFO", "priority": 7, "nice": mine, "requested": 7,
                                             "granted": True}
        assert sched_state(child.pid, 60)["granted"] is False  # FIFO, but not the priority asked for
    finally:
        child.kill()
        child.wait()
    assert sched_state(child.pid)["policy"] is None  # gone
    niced = subprocess.Popen(["nice", "-n", "7", sys.executable, "-c", "import time; print(1, flush=True); "
                              "time.sleep(30)"], stdout=subprocess.PIPE)
    try:
        assert niced.stdout.readline().strip() == b"1"
        assert sched_state(niced.pid)["nice"] == min(mine + 7, 19)  # a run under `nice` is told apart
    finally:
        niced.kill()
        niced.wait()


def test_measure_host_restores_this_process():
    cpus, policy = os.sched_getaffinity(0), os.sched_getscheduler(0)
    h = measure_host(PERIOD, 0.03, sorted(cpus)[:1], 5)
    assert os.sched_getaffinity(0) == cpus and os.sched_getscheduler(0) == policy
    w = h["wakeup_latency_us"]
    assert w["n"] == 7 and 0 <= w["p50"] <= w["p99"] <= w["max"]
    assert h["baseline_sched"]["cpus"] == sorted(cpus)[:1] and h["baseline_sched"]["requested"] == 5
    assert measure_host(PERIOD, 0, None, 5)["wakeup_latency_us"] is None


def _report(cpu: str, load: float, control_granted: bool) -> dict:
    return {"schema": "edgeinfer.replay/1", "schema_version": 2, "label": cpu,
            "host": {"cpu_model": cpu, "cpus": 2, "governor": "unknown", "kernel": "6.1", "load_average": [load, 1, 1],
                     "wakeup_latency_us": {"p50": 60.0, "p99": 250.0, "max": 900.0, "n": 125},
                     "realtime": {"replayer": {"policy": "SCHED_FIFO", "priority": 70, "requested": 70,
                                               "granted": True},
                                  "control": {"policy": "SCHED_FIFO" if control_granted else "SCHED_OTHER",
                                              "priority": 60 if control_granted else 0, "requested": 60,
                                              "granted": control_granted},
                                  "runtime": {"policy": "SCHED_OTHER", "priority": 0, "nice": 10 if load > 1 else 0,
                                              "requested": None, "granted": None}}}}


def test_table_shows_the_host_and_compare_shows_where_hosts_differ():
    a, b = _report("Xeon", 1.5, True), _report("EPYC", 0.2, False)
    out = io.StringIO()
    print_table([a, b], Console(file=out, width=250))
    text = out.getvalue()
    assert "Xeon, 2 CPUs, governor unknown, load 1.50/1.00/1.00" in text and "60 / 250 / 900 (n=125)" in text
    assert "replayer FIFO 70, control FIFO 60, runtime OTHER 0 nice 10" in text
    assert "control OTHER 0 (60 refused)" in text and text.count(" nice ") == 1  # a niceness of 0 goes unsaid
    rows = {r["figure"]: r for r in compare(a, b)}
    assert rows["host CPU"]["a"] == "Xeon" and rows["host CPU"]["b"] == "EPYC"
    assert rows["real-time control"]["a"] == "granted" and rows["real-time control"]["b"] == "refused"
    assert rows["host load (1 min)"]["verdict"] == "not judged"
    assert not {"host governor", "host kernel", "host wake-up p99 (us)", "real-time replayer"} & set(rows)  # equal
    assert not [r for r in compare(a, _report("Xeon", 1.5, True)) if r["figure"].startswith(("host", "real-time"))]
