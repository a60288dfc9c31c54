"""Metrics of a running node: counters and latency histograms, published as periodic `Stats` messages,
`ErrorEvent`s (rate-limited per kind, or every one), and the node's log lines (throttled per kind,
edgeinfer.core.throttle). Readable while running: subscribe to the node's status PUB (the runtime's chunk
endpoint, the control loop's status endpoint) and decode with edgeinfer.core.wire.

Histograms use fixed log2 buckets in microseconds (1 us .. 2^25 us = 33.5 s), so every node and reader
agrees on them and a histogram is a short list of ints on the wire (Prometheus-style cumulative buckets are
the running sums of these).
"""
from __future__ import annotations

import bisect
import os
from typing import Callable

import numpy as np

from edgeinfer.core.clock import now_ns
from edgeinfer.core.logwriter import process_writer
from edgeinfer.core.throttle import NodeLog, Throttle
from edgeinfer.core.wire import ErrorEvent, Stats

BUCKET_BOUNDS_US = tuple(2**i for i in range(26))  # upper bounds (inclusive); one more bucket for overflow
_BOUNDS_NS = tuple(b * 1000 for b in BUCKET_BOUNDS_US)


def histogram_quantile_us(counts: list[int], q: float) -> float | None:
    """Upper bound (us) of the bucket holding quantile q (0..1) of a bucket-count list; None when empty,
    inf when it falls in the overflow bucket."""
    total = sum(counts)
    if total == 0:
        return None
    i = int(np.searchsorted(np.cumsum(counts), q * total, side="left"))
    return float(BUCKET_BOUNDS_US[i]) if i < len(BUCKET_BOUNDS_US) else float("inf")


class Telemetry:
    """Counters (name -> int) and latency histograms (name -> bucket counts) of one node.

    Not thread-safe beyond the GIL: increments from one thread, snapshots from another are fine.
    At most 64 counter names and 64 histograms (the wire's map limit). `log`: the node's throttled log lines
    (their suppressed count is the counter "log_suppressed"; lines this process's stdout queue dropped because
    stdout was slow, "log_dropped"; lines cut to their maximum length, "log_cut": edgeinfer.core.logwriter).
    publish: sends an ErrorEvent on the node's status channel (report(); None: nowhere). clock: monotonic ns.
    """

    def __init__(self, sender: str, stats_period_ms: float = 200.0, error_interval_ms: float = 100.0,
                 clock: Callable[[], int] = now_ns, publish: Callable[[ErrorEvent], object] | None = None):
        if not stats_period_ms > 0 or not error_interval_ms >= 0:
            raise ValueError(f"stats_period_ms must be > 0 and error_interval_ms >= 0, got {stats_period_ms}, "
                             f"{error_interval_ms}")
        self.sender, self.instance, self.clock, self.publish = sender, os.getpid(), clock, publish
        self.counters: dict[str, int] = {}
        self.histograms: dict[str, list[int]] = {}
        self.period_ns = int(stats_period_ms * 1e6)
        self.events = Throttle(int(error_interval_ms * 1e6))
        self.log = NodeLog(sender, clock=clock)
        self._next_stats_ns = 0
        self.seq = 0
        self.last_error = ""

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def observe_ns(self, name: str, duration_ns: int) -> None:
        """Add one latency (ns) to histogram `name`."""
        counts = self.histograms.get(name)
        if counts is None:
            counts = self.histograms[name] = [0] * (len(BUCKET_BOUNDS_US) + 1)
        counts[bisect.bisect_left(_BOUNDS_NS, duration_ns)] += 1

    def error(self, kind: str, detail: str, every: bool = False) -> ErrorEvent | None:
        """Count an error of `kind` (counter "error.<kind>"); return an ErrorEvent to publish unless one of this
        kind went out less than error_interval_ms ago (the count carries the total, so nothing is lost).
        every: always return one (for state changes such as a lost peer, which cannot flood)."""
        name = f"error.{kind}"
        self.count(name)
        self.last_error = detail
        t = self.clock()
        if not every and self.events.admit(kind, t) is None:
            return None
        return ErrorEvent(self.sender, kind, self.counters[name], t, detail.encode()[:1000].decode(errors="ignore"))

    def report(self, kind: str, detail: str, every: bool = False) -> None:
        """error(), the ErrorEvent published (unless rate-limited), and a log line of `kind` (throttled)."""
        event = self.error(kind, detail, every)
        if event is not None and self.publish is not None:
            self.publish(event)
        self.log.line(kind, detail)

    def stats_due(self, t_ns: int) -> bool:
        """True (once per period) when stats_period_ms has passed since the last time it said so."""
        if t_ns < self._next_stats_ns:
            return False
        self._next_stats_ns = t_ns + self.period_ns
        return True

    def snapshot(self) -> Stats:
        self.seq += 1
        writer = process_writer()  # this process's stdout queue (edgeinfer.core.logwriter)
        self.counters.update(log_suppressed=self.log.suppressed, log_dropped=writer.dropped, log_cut=writer.cut)
        histograms = dict(self.histograms)  # a C-level copy first: another thread may add a name meanwhile
        return Stats(self.sender, self.instance, self.seq, self.clock(), dict(self.counters),
                     {k: list(v) for k, v in histograms.items()})


def stats_summary(stats: Stats) -> dict:
    """A JSON-ready dict of a Stats message: counters, and p50/p99/count per histogram (us, bucket bounds)."""
    return {"sender": stats.sender, "instance": stats.instance, "counters": dict(sorted(stats.counters.items())),
            "latency_us": {k: {"count": sum(v), "p50_le": histogram_quantile_us(v, 0.5),
                               "p99_le": histogram_quantile_us(v, 0.99)} for k, v in sorted(stats.histograms.items())}}
