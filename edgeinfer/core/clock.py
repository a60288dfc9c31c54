"""Absolute-deadline timing on the monotonic clock (the sleeping policy, in one small module).

`time.perf_counter_ns()` is CLOCK_MONOTONIC on Linux: one clock shared by every process on a host, so a
start epoch sent in a message means the same instant to the replayer, the runtime and the control loop.
"""
from __future__ import annotations

import numbers
import os
import time
from collections import deque
from typing import Callable

now_ns = time.perf_counter_ns

# The longest control period a schedule may name: 10 s (0.1 Hz). A Start or Join beyond it (2**62 ns) is corrupt or
# hostile; its ticks and deadlines would leave int64.
MAX_PERIOD_NS = 10_000_000_000


def check_period_ns(period_ns, name: str = "period_ns") -> int:
    """period_ns as an int, when it is a control period: an integer in (0, MAX_PERIOD_NS] ns. Raises ValueError
    naming `name` (e.g. "Start.period_ns") otherwise: 0 or less never advances a tick, and past MAX_PERIOD_NS the
    schedule's times overflow."""
    if isinstance(period_ns, bool) or not isinstance(period_ns, numbers.Integral) or not 0 < period_ns <= MAX_PERIOD_NS:
        raise ValueError(f"{name} must be an integer in (0, {MAX_PERIOD_NS}] ns, got {period_ns!r}")
    return int(period_ns)


def sleep_until(deadline_ns: int, spin_ns: int = 200_000) -> int:
    """Sleep until `spin_ns` before the deadline, then spin to it. Returns the lateness in ns (>= 0)."""
    wait_until(deadline_ns, spin_ns)
    return now_ns() - deadline_ns


def wait_until(deadline_ns: int, spin_ns: int, ready: Callable[[int], bool] | None = None) -> bool:
    """Sleep-then-spin to `deadline_ns` (monotonic ns), or until `ready` says an awaited event has come.

    Until spin_ns before the deadline the caller sleeps: in ready(timeout_ns), which blocks at most timeout_ns and
    says whether the event came (a socket's select), or in time.sleep when there is no event to await (ready
    None). Then it spins to the deadline, asking ready(0). The OS wake-up is coarse (~60-100 us, ms on a loaded
    VM) and costlier after a long sleep; waking into the spin window absorbs it. Returns True as soon as ready()
    does, False at the deadline.
    """
    while (remaining := deadline_ns - now_ns()) > spin_ns:
        if ready is None:
            time.sleep((remaining - spin_ns) / 1e9)
        elif ready(remaining - spin_ns):
            return True
    while now_ns() < deadline_ns:
        if ready is not None and ready(0):
            return True
    return False


class Ticker:
    """Fixed-rate ticks at t0 + n * period on absolute deadlines.

    `wait()` returns the index of the next tick to run. After an overrun of whole periods, the ticks that
    are a full period or more behind are counted in `overruns` and skipped; only the newest due tick runs
    (late by less than one period), so there is never a catch-up burst.
    """

    def __init__(self, t0_ns: int, period_ns: int, spin_ns: int = 200_000):
        check_period_ns(period_ns)
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
        if late >= 0:  # due already, no sleep this tick: a thread of the same real-time priority (ZMQ's I/O
            os.sched_yield()  # thread, which delivers the messages the tick reads) would never run otherwise
        lateness = sleep_until(self.tick_time_ns(n), self.spin_ns)
        self.max_lateness_ns = max(self.max_lateness_ns, lateness)
        self.next_tick = n + 1
        return n


class ClockMap:
    """Another clock's times (a robot's: counting from its boot, or running slow or fast) on this host's monotonic
    clock, measured from pairs (t_ext, t_host): an external time and the host's time when it was read (after it,
    by a small lag: the call's).

    host_ns(t_ext) = t_ext + offset, the offset the smallest t_host - t_ext of the last `keep` pairs: the pair read
    with the least lag is the truest (the minimum one-way delay, Paxson 1998). When the two clocks run at different
    rates the offset drifts within those pairs, and the minimum is the oldest pair's (the external clock slow: a
    time mapped earlier than it was, a budget started early: shorter, never longer) or the newest's (fast: exact).
    The rate is measured apart, for the drift check: `drift` = rate - 1 (host ns per external ns, minus 1), the
    offset's slope over at least span_ns of external time (its error: the lag's jitter over span_ns; 0.0 until
    measured). `reset()` forgets everything (the external clock stepped). Times in ns."""

    def __init__(self, keep: int = 16, span_ns: int = 2_000_000_000):
        self.keep, self.span_ns = keep, span_ns
        self.reset()

    def reset(self) -> None:
        self._pairs: deque[int] = deque(maxlen=self.keep)  # t_host - t_ext of the newest pairs
        self._mark: tuple[int, int] | None = None  # (t_ext, offset) the drift is measured from
        self.drift = 0.0
        self.measured = False  # drift measured over span_ns at least once

    def sample(self, t_ext_ns: int, t_host_ns: int) -> None:
        """One pair: the external time t_ext_ns, read at t_host_ns on this host's clock."""
        self._pairs.append(t_host_ns - t_ext_ns)
        offset = self.offset_ns
        if self._mark is None or len(self._pairs) < self.keep:  # the first offset is one pair's: not a mark
            self._mark = (t_ext_ns, offset)
        elif (span := t_ext_ns - self._mark[0]) >= self.span_ns:
            self.drift, self.measured = (offset - self._mark[1]) / span, True
            self._mark = (t_ext_ns, offset)

    @property
    def offset_ns(self) -> int:
        """t_host - t_ext, the smallest of the last `keep` pairs (0 before the first)."""
        return min(self._pairs) if self._pairs else 0

    def host_ns(self, t_ext_ns: int) -> int:
        """t_ext_ns on this host's monotonic clock."""
        return t_ext_ns + self.offset_ns


class SpinTail:
    """How long before a deadline to stop sleeping and spin, sized from how late sleeps end (the replayer before
    each send, the runtime node before each observation due).

    A sleep (select, time.sleep) ends late by the OS wake-up latency: tens of us on a quiet machine, up to ms
    on a loaded VM whose kernel does not preempt (PREEMPT_NONE) even for a SCHED_FIFO waker. A fixed 200 us
    tail then lets every late wake-up become a late send (or a late receive). The tail tracks a decaying maximum
    of the measured wake-up lateness (x1.25 + 50 us), between min_ns and max_ns (default: an eighth of a period,
    at most 500 us), so it costs CPU only while the machine is noisy; the cap keeps the real-time share of the
    CPU low: when real-time tasks take more than 95 % of a CPU, the kernel runs the starved normal tasks for
    50 ms (RT throttling, the fair server since Linux 6.12), and every real-time task there stalls.
    """

    def __init__(self, period_ns: int, min_ns: int = 200_000, max_ns: int | None = None, decay: float = 0.995):
        self.min_ns = min_ns
        self.max_ns = max(min_ns, max_ns if max_ns is not None else min(period_ns // 8, 500_000))
        self.decay = decay
        self.recent_ns = 0.0
        self.spin_ns = min_ns

    def woke(self, late_ns: int) -> None:
        """Record one sleep that ended late_ns after it was meant to (negative: early)."""
        self.recent_ns = max(float(late_ns), self.recent_ns * self.decay)
        self.spin_ns = int(min(self.max_ns, max(self.min_ns, 1.25 * self.recent_ns + 50_000)))


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
