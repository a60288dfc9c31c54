"""The host a run was measured on, for report.json's "host" section: CPU model and count, frequency governor,
kernel, load average, whether each process got the real-time priority it asked for, and a short
cyclictest-style wake-up latency baseline taken before the run, so that two reports from different machines
(or one machine under different load) can be told apart.

The baseline is cyclictest's measurement (rt-tests, src/cyclictest/cyclictest.c: sleep to an absolute
deadline one period after the last, latency = wake-up time - deadline), taken in this process at the
replayer's priority and CPU, with CPython's time.sleep (clock_nanosleep on CLOCK_MONOTONIC since 3.11) and the
monotonic clock of core.clock. It includes the interpreter's few microseconds per wake-up, as the replayer's
own sleeps do.
"""
from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Callable

import numpy as np
import psutil

from edgeinfer.core import clock
from edgeinfer.engines.backends.cache import cpu_model
from edgeinfer.sim.stats import latency_summary_ms

GOVERNOR = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
POLICIES = {getattr(os, name): name for name in ("SCHED_OTHER", "SCHED_FIFO", "SCHED_RR", "SCHED_BATCH", "SCHED_IDLE")
            if hasattr(os, name)}


def wakeup_latency_us(period_ns: int, duration_s: float, now: Callable[[], int] = clock.now_ns,
                      sleep: Callable[[float], None] = time.sleep) -> dict | None:
    """Sleep to absolute deadlines `period_ns` apart for `duration_s` and summarise how late each wake-up was:
    {p50, p90, p99, p999, max, mean (us), n, period_us, duration_s, skipped}. A wake-up later than a whole
    period skips the deadlines it passed (counted in `skipped`), as core.clock.Ticker does. None when
    duration_s is 0. `now` (ns) and `sleep` (s) are injectable for tests. Raises ValueError for period_ns <= 0."""
    if period_ns <= 0:
        raise ValueError(f"period_ns must be > 0, got {period_ns}")
    if duration_s <= 0:
        return None
    n = max(1, int(duration_s * 1e9 // period_ns))
    late_ns = np.empty(n, dtype=np.int64)
    skipped = 0
    deadline = now() + period_ns
    for i in range(n):
        remaining = deadline - now()
        if remaining > 0:
            sleep(remaining / 1e9)
        woke = now()
        late_ns[i] = woke - deadline
        behind = (woke - deadline) // period_ns  # whole periods passed: skip them, never a burst
        skipped += behind
        deadline += (behind + 1) * period_ns
    summary = {k: v * 1e3 for k, v in latency_summary_ms(late_ns).items()}
    return summary | {"n": n, "period_us": period_ns / 1e3, "duration_s": duration_s, "skipped": int(skipped)}


def sched_state(pid: int = 0, requested: int | None = None) -> dict:
    """{"policy": "SCHED_FIFO" | "SCHED_OTHER" | ..., "priority", "nice", "requested", "granted"} of process `pid`
    (its main thread; 0 = the calling thread). nice: its niceness (what SCHED_OTHER weighs). granted: SCHED_FIFO or
    SCHED_RR at `requested` (None when nothing was requested, i.e. requested is None or 0). {"policy": None, ...}
    when the process is gone or not Linux."""
    try:
        policy, priority = POLICIES.get(os.sched_getscheduler(pid)), os.sched_getparam(pid).sched_priority
        nice = os.getpriority(os.PRIO_PROCESS, pid)
    except (AttributeError, OSError):
        policy, priority, nice = None, None, None
    granted = None if not requested else policy in ("SCHED_FIFO", "SCHED_RR") and priority == requested
    return {"policy": policy, "priority": priority, "nice": nice, "requested": requested, "granted": granted}


def governor() -> str:
    """cpu0's cpufreq scaling governor ("performance", "powersave", ...), "unknown" where there is none (VMs)."""
    try:
        return GOVERNOR.read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def host_state() -> dict:
    """The machine as it is now: cpu_model, cpus (logical), cpus_allowed (this process's affinity), governor,
    cpu_mhz (psutil's current frequency, None where unknown), kernel (release and build string: PREEMPT_RT,
    PREEMPT_DYNAMIC...), python, load_average (1, 5, 15 min)."""
    try:
        freq = psutil.cpu_freq()
    except (OSError, NotImplementedError, RuntimeError):
        freq = None
    uname = platform.uname()
    return {"cpu_model": cpu_model(), "cpus": os.cpu_count(), "cpus_allowed": len(os.sched_getaffinity(0)),
            "governor": governor(), "cpu_mhz": round(freq.current, 1) if freq and freq.current else None,
            "kernel": f"{uname.release} {uname.version}", "python": platform.python_version(),
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def measure_host(period_ns: int, baseline_s: float, cpus: list[int] | None, priority: int) -> dict:
    """host_state() and the wake-up baseline (wakeup_latency_us at `period_ns` for `baseline_s`, None when 0),
    measured on `cpus` at SCHED_FIFO `priority` as the replayer runs (`baseline_sched`: what it got); this
    process's scheduler and CPUs are restored after. Call it before starting any node, so that the nodes
    neither inherit the priority nor load the baseline."""
    state = host_state()  # the load average before the baseline's own wake-ups
    if baseline_s <= 0:
        return state | {"wakeup_latency_us": None, "baseline_sched": None}
    original = sorted(os.sched_getaffinity(0))
    clock.enter_realtime(cpus, priority)  # refused: sched_state says so
    try:
        sched = sched_state(0, priority) | {"cpus": sorted(os.sched_getaffinity(0))}
        baseline = wakeup_latency_us(period_ns, baseline_s)
    finally:
        clock.leave_realtime()
        clock.pin_to_cpus(original)
    return state | {"wakeup_latency_us": baseline, "baseline_sched": sched}
