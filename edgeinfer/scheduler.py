"""Deadline-aware planning of one chunk's decoding: how many drafts the next target pass may verify,
and whether another pass fits the tick's budget at all.

Costs are online estimates of a high quantile (default p99, not the mean: a plan built on means misses
its deadline about half the time the estimate is tight) over a rolling window of measured durations,
per operation and speculation length k.
"""
from __future__ import annotations

import time
from collections import defaultdict, deque
from dataclasses import dataclass

import numpy as np


@dataclass
class SchedulerConfig:
    """budget_ms: from the observation being taken to its chunk being published. k_max: drafts per target pass
    (0 = target-only). quantile: cost estimate used for planning. window: samples kept per operation."""

    budget_ms: float = 20.0
    k_max: int = 6
    quantile: float = 0.99
    window: int = 256
    margin_ms: float = 0.5  # kept free at the end of the budget for encoding and publishing the chunk

    def __post_init__(self):
        if not 0 < self.budget_ms <= 10_000:
            raise ValueError(f"SchedulerConfig.budget_ms must be in (0, 10000], got {self.budget_ms}")
        if not 0 <= self.margin_ms < self.budget_ms:
            raise ValueError(f"SchedulerConfig.margin_ms must be in [0, budget_ms), got {self.margin_ms}")
        if not 16 <= self.window <= 100_000:
            raise ValueError(f"SchedulerConfig.window must be in 16..100000, got {self.window}")
        if not 0 <= self.k_max <= 64:
            raise ValueError(f"SchedulerConfig.k_max must be in 0..64, got {self.k_max}")
        if not 0.5 <= self.quantile < 1:
            raise ValueError(f"SchedulerConfig.quantile must be in [0.5, 1), got {self.quantile}")


class LatencyModel:
    """Rolling high-quantile estimates of operation costs in ns, keyed by (op, k)."""

    def __init__(self, quantile: float = 0.99, window: int = 256):
        self.quantile = quantile
        self._samples: dict[tuple[str, int], deque] = defaultdict(lambda: deque(maxlen=window))
        self._cache: dict[tuple[str, int], float] = {}

    def record(self, op: str, k: int, duration_ns: int) -> None:
        self._samples[(op, k)].append(duration_ns)
        self._cache.pop((op, k), None)

    def clear(self) -> None:
        """Forget every sample (after warm-up: first calls pay one-off allocation costs)."""
        self._samples.clear()
        self._cache.clear()

    def estimate_ns(self, op: str, k: int) -> float:
        """Quantile estimate; 0 when never measured (the first pass is how it gets measured)."""
        key = (op, k)
        if key not in self._cache:
            s = self._samples.get(key)
            self._cache[key] = float(np.quantile(s, self.quantile)) if s else 0.0
        return self._cache[key]

    def count(self, op: str, k: int) -> int:
        return len(self._samples.get((op, k), ()))


class TickPlanner:
    """Plans the passes of one chunk against an absolute deadline on the monotonic clock."""

    def __init__(self, cfg: SchedulerConfig, latency: LatencyModel | None = None):
        self.cfg = cfg
        self.latency = latency or LatencyModel(cfg.quantile, cfg.window)
        self.deadline_ns = None

    def start(self, t_start_ns: int | None = None) -> None:
        """Begin a chunk whose budget runs from t_start_ns (default: now)."""
        t = time.perf_counter_ns() if t_start_ns is None else t_start_ns
        self.deadline_ns = t + int((self.cfg.budget_ms - self.cfg.margin_ms) * 1e6)

    def unlimited(self) -> None:
        """Plan without a deadline (warm-up and offline evaluation)."""
        self.deadline_ns = None

    def plan(self, committed: int, remaining: int) -> int | None:
        left = None if self.deadline_ns is None else self.deadline_ns - time.perf_counter_ns()
        if committed == 0:
            # The prefill always runs while any budget is left: without it nothing is verified, and an op
            # that is never run again could never correct a pessimistic estimate.
            return 0 if left is None or left > 0 else None
        for k in range(min(self.cfg.k_max, remaining - 1), -1, -1):
            cost = self.latency.estimate_ns("draft", k) + self.latency.estimate_ns("verify", k)
            if left is None or cost <= left:
                return k
        return None

    def record(self, op: str, k: int, duration_ns: int) -> None:
        self.latency.record(op, k, duration_ns)
