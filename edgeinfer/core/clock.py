"""Absolute-deadline timing on the monotonic clock (the sleeping policy, in one small module).

`time.perf_counter_ns()` is CLOCK_MONOTONIC on Linux: one clock shared by every process on a host, so a
start epoch sent in a message means the same instant to the replayer, the runtime and the control loop.
"""
from __future__ import annotations

import os
import time

now_ns = time.perf_counter_ns


def sleep_until(deadline_ns: int, spin_ns: int = 200_000) -> int:
    """Sleep until `spin_ns` before the deadline, then spin to it. Returns the lateness in ns (>= 0)."""
    remaining = deadline_ns - now_ns()
    if remaining > spin_ns:
        # the OS wake-up is coarse (~60-100 us); sleeping into the spin window absorbs it
        time.sleep((remaining - spin_ns) / 1e9)
    while now_ns() < deadline_ns:
        pass
    return now_ns() - deadline_ns


class Ticker:
    """Fixed-rate ticks at t0 + n * period on absolute deadlines.

    `wait()` returns the index of the next tick to run. After an overrun of whole periods, the ticks that
    are a full period or more behind are counted in `overruns` and skipped; only the newest due tick runs
    (late by less than one period), so there is never a catch-up burst.
    """

    def __init__(self, t0_ns: int, period_ns: int, spin_ns: int = 200_000):
        if period_ns <= 0:
            raise ValueError(f"period_ns must be > 0, got {period_ns}")
        self.t0_ns, self.period_ns, self.spin_ns = t0_ns, period_ns, spin_ns
        self.next_tick = 0
        self.overruns = 0
        self.max_lateness_ns = 0

    def tick_time_ns(self, n: int) -> int:
        return self.t0_ns + n * self.period_ns

    def wait(self) -> int:
        n = self.next_tick
        late = now_ns() - self.tick_time_ns(n)
        if late >= self.period_ns:  # missed whole periods: skip them, no burst
            skipped = late // self.period_ns
            self.overruns += skipped
            n += skipped
        lateness = sleep_until(self.tick_time_ns(n), self.spin_ns)
        self.max_lateness_ns = max(self.max_lateness_ns, lateness)
        self.next_tick = n + 1
        return n


def try_realtime(priority: int) -> str | None:
    """Best effort: run this process under SCHED_FIFO at `priority` (1..99; 0 = leave it alone).

    Returns None on success, else a warning to show (no permission, not Linux). Real-time scheduling keeps
    a sleeping control loop's wake-up from waiting behind a busy inference process on a small machine.
    Every spin in this project is bounded (`sleep_until`'s tail), so a FIFO process cannot hog a core.
    """
    if priority <= 0:
        return None
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except (AttributeError, PermissionError, OSError) as e:
        return f"real-time priority {priority} not available ({e}); timing runs under the normal scheduler"
    return None


def leave_realtime() -> None:
    """Back to the normal scheduler (for a process that goes on to do other work)."""
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except (AttributeError, PermissionError, OSError):
        pass  # never raised to FIFO, or not Linux: nothing to undo


def pin_to_cpus(cpus: list[int] | None) -> str | None:
    """Best effort: restrict this process (and the threads it starts later) to `cpus`. None: leave it.

    Returns None on success, else a warning. Keeping the inference process off the control loop's CPU
    means a waking real-time loop never preempts a decode in flight (the isolcpus/taskset habit of
    robot controllers).
    """
    if not cpus:
        return None
    try:
        os.sched_setaffinity(0, cpus)
    except (AttributeError, OSError, ValueError) as e:
        return f"cannot pin to CPUs {cpus} ({e}); running unpinned"
    return None


def enter_realtime(cpus: list[int] | None, priority: int) -> str | None:
    """Pin to `cpus`, then ask for SCHED_FIFO at `priority`; each is tried whatever the other gives.
    Returns None when both worked (or were not asked for), else the warnings joined."""
    warnings = [w for w in (pin_to_cpus(cpus), try_realtime(priority)) if w]
    return "; ".join(warnings) or None
