"""The rate a caller really ticks at, against the rate it was configured for.

A controller that is called by someone else's loop (the embedded Controller) cannot hold its rate; it can
measure it and say when it is not the configured one. Over the last `window` intervals between calls:

    rate_hz   = 1 / mean interval
    jitter_ms = standard deviation of the intervals (population), ms

Once the window is full, a rate more than `tolerance` (a fraction) away from the configured one is a
departure: counted (`departures`) and reported once, at most once per `warn_interval_ns`; the departure ends
when the rate comes back within tolerance. The reports are throttled by edgeinfer.core.throttle, as every
node's log lines are.
"""
from __future__ import annotations

from collections import deque

from edgeinfer.core.throttle import Throttle


class RateMeter:
    """period_ns: the configured period (> 0). tolerance: the allowed relative departure of the rate (0.2: 20%).
    window: intervals the rate and jitter are measured over. warn_interval_ns: the least time between two reports
    (on the caller's clock). Sums are kept in integer ns (exact), so each tick is O(1)."""

    def __init__(self, period_ns: int, tolerance: float = 0.2, window: int = 32,
                 warn_interval_ns: int = 10_000_000_000):
        if period_ns <= 0 or not tolerance > 0 or window < 2:
            raise ValueError(f"RateMeter: need period_ns > 0, tolerance > 0 and window >= 2, got {period_ns}, "
                             f"{tolerance}, {window}")
        self.rate_cfg_hz = 1e9 / period_ns
        self.tolerance = tolerance
        self.rate_hz = 0.0  # measured over the window; 0.0 before two ticks
        self.jitter_ms = 0.0
        self.departures = 0  # times the rate left the tolerance band
        self._intervals: deque[int] = deque(maxlen=window)
        self._sum_ns = self._sum_sq_ns2 = 0
        self._last_t_ns: int | None = None
        self._departed = False
        self._reports = Throttle(warn_interval_ns)

    def tick(self, t_ns: int) -> bool:
        """Record a call at t_ns (monotonic ns). True when a departure starts and its report is due (the caller
        reports it: one report per departure, at most one per warn_interval_ns)."""
        last, self._last_t_ns = self._last_t_ns, t_ns
        if last is None:
            return False
        if len(self._intervals) == self._intervals.maxlen:
            old = self._intervals[0]
            self._sum_ns -= old
            self._sum_sq_ns2 -= old * old
        dt = t_ns - last
        self._intervals.append(dt)
        self._sum_ns += dt
        self._sum_sq_ns2 += dt * dt
        n = len(self._intervals)
        self.rate_hz = n * 1e9 / self._sum_ns if self._sum_ns > 0 else float("inf")
        self.jitter_ms = max(0, n * self._sum_sq_ns2 - self._sum_ns ** 2) ** 0.5 / n / 1e6
        if n < self._intervals.maxlen:
            return False  # too few intervals to judge the rate by
        departed = abs(self.rate_hz / self.rate_cfg_hz - 1) > self.tolerance
        starts, self._departed = departed and not self._departed, departed
        if not starts:
            return False
        self.departures += 1
        return self._reports.admit("rate", t_ns) is not None
