"""Deadline-aware planning of one chunk's decoding: how many drafts the next target pass may verify,
and whether another pass fits the tick's budget at all.

Adaptive speculation (SchedulerConfig.adaptive): k is chosen per pass to maximise the expected tokens per
second, E[tokens per pass] / E[cost of the pass]. With drafts kept independently at rate a, E[tokens per
pass] = (1 - a^(k+1)) / (1 - a) (Leviathan et al. 2023, eq. 1); action drafts are kept in runs, so the
estimate here is the empirical one from the kept-draft runs of recent passes (AcceptanceModel), and the
costs are the medians of measured draft and verify times.
k = 0 (speculation off) wins whenever drafting does not pay; a pass of k = 1 is still tried every
`probe_every` passes so that a drafter that starts paying again is noticed. The deadline check then
lowers k further if the high-quantile cost of the chosen pass does not fit.

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
    k_max: int = 16
    quantile: float = 0.99
    window: int = 256
    margin_ms: float = 0.5  # kept free at the end of the budget for encoding and publishing the chunk
    adaptive: bool = True  # choose k per chunk for tokens/s (k_max is then the most it may choose)
    probe_every: int = 32  # adaptive: chunks between probes of k = 1 while speculation is off

    def __post_init__(self):
        if not 0 < self.budget_ms <= 10_000:
            raise ValueError(f"SchedulerConfig.budget_ms must be in (0, 10000], got {self.budget_ms}")
        if not 0 <= self.margin_ms < self.budget_ms:
            raise ValueError(f"SchedulerConfig.margin_ms must be in [0, budget_ms), got {self.margin_ms}")
        if not 16 <= self.window <= 100_000:
            raise ValueError(f"SchedulerConfig.window must be in 16..100000, got {self.window}")
        if not 0 <= self.k_max <= 64:
            raise ValueError(f"SchedulerConfig.k_max must be in 0..64, got {self.k_max}")
        if self.probe_every < 1:
            raise ValueError(f"SchedulerConfig.probe_every must be >= 1, got {self.probe_every}")
        if not 0.5 <= self.quantile < 1:
            raise ValueError(f"SchedulerConfig.quantile must be in [0.5, 1), got {self.quantile}")


class LatencyModel:
    """Rolling high-quantile estimates of operation costs in ns, keyed by (op, k)."""

    def __init__(self, quantile: float = 0.99, window: int = 256):
        self.quantile = quantile
        self._samples: dict[tuple[str, int], deque] = defaultdict(lambda: deque(maxlen=window))
        self._cache: dict[tuple[str, int], float] = {}

    def record(self, op: str, k: int, duration_ns: int) -> None:
        samples = self._samples[(op, k)]
        samples.append(duration_ns)
        if len(samples) < 16 or len(samples) % 8 == 0:  # a quantile of 256 samples costs ~20 us: refresh
            for q in (self.quantile, 0.5):                # early, then every 8th sample, not every pass
                self._cache.pop((op, k, q), None)

    def clear(self) -> None:
        """Forget every sample (after warm-up: first calls pay one-off allocation costs)."""
        self._samples.clear()
        self._cache.clear()

    def estimate_ns(self, op: str, k: int, quantile: float | None = None) -> float:
        """Quantile estimate (default: the planning quantile); 0 when never measured (the first pass is how
        it gets measured)."""
        q = self.quantile if quantile is None else quantile
        key = (op, k, q)
        if key not in self._cache:
            s = self._samples.get((op, k))
            self._cache[key] = float(np.quantile(s, q)) if s else 0.0
        return self._cache[key]

    def count(self, op: str, k: int) -> int:
        return len(self._samples.get((op, k), ()))


def expected_tokens(a: float, k: int) -> float:
    """E[tokens committed by a pass verifying k drafts] when each draft is kept independently with
    probability a in [0, 1] (Leviathan et al. 2023, eq. 1)."""
    return k + 1.0 if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


class AcceptanceModel:
    """E[tokens per pass] for each k from the kept-draft runs of recent passes, without assuming that drafts
    are kept independently: an arm's motion is smooth for a while and then changes, so a drafter that is
    right about one token is often right about the next few. The survival S(j) = P(run of kept drafts >= j)
    is estimated like a Kaplan-Meier curve (a pass of k drafts that kept all k says only that the run is
    >= k), so E[tokens | k] = 1 + S(1) + ... + S(k). Each conditional step starts from a prior of 0.5."""

    def __init__(self, k_max: int, window: int = 256, prior: float = 0.5, prior_weight: float = 1.0):
        self.k_max, self.window = k_max, window
        self._passes: deque = deque()
        self.prior, self.prior_weight = prior, prior_weight
        self._at_risk = np.full(k_max, prior_weight)  # passes that put draft j to the test (plus the prior)
        self._kept = np.full(k_max, prior * prior_weight)  # ... and kept it

    def record(self, k: int, accepted: int) -> None:
        if k > 0:
            self._passes.append((k, accepted))
            self._count(k, accepted, +1)
            if len(self._passes) > self.window:
                self._count(*self._passes.popleft(), -1)

    def _count(self, k: int, accepted: int, sign: int) -> None:
        self._at_risk[:min(accepted + 1, k, self.k_max)] += sign  # drafts 1..accepted+1 were tested
        self._kept[:min(accepted, self.k_max)] += sign

    def survival(self) -> np.ndarray:
        """S(j) for j = 1..k_max, (k_max,) float64."""
        return np.cumprod(self._kept / self._at_risk)

    def expected_tokens(self) -> np.ndarray:
        """E[tokens per pass] for k = 0..k_max, (k_max + 1,) float64."""
        return 1.0 + np.concatenate([[0.0], np.cumsum(self.survival())])

    def rate(self) -> float:
        """The overall fraction of drafts kept (what reports call the acceptance rate)."""
        drafted = sum(k for k, _ in self._passes)
        return sum(a for _, a in self._passes) / drafted if drafted else self.prior


class TickPlanner:
    """Plans the passes of one chunk against an absolute deadline on the monotonic clock.

    record(op, k, value): op "prefill" | "draft" | "verify" with a duration in ns, or "accepted" with the
    number of drafts the pass kept (for adaptive speculation)."""

    def __init__(self, cfg: SchedulerConfig, latency: LatencyModel | None = None):
        self.cfg = cfg
        self.latency = latency or LatencyModel(cfg.quantile, cfg.window)
        self.acceptance = AcceptanceModel(cfg.k_max)
        self.deadline_ns = None
        self._since_probe = 0
        self._chunk_k = cfg.k_max

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
            self._chunk_k = self.best_k() if self.cfg.adaptive else self.cfg.k_max  # once per chunk
            return 0 if left is None or left > 0 else None
        k_top = min(self._chunk_k, remaining - 1)
        for k in range(k_top, -1, -1):
            cost = self.latency.estimate_ns("draft", k) + self.latency.estimate_ns("verify", k)
            if left is None or cost <= left:
                return k
        return None

    def best_k(self) -> int:
        """The k in 0..k_max with the most expected tokens per second (see the module docstring), chosen at
        the start of each chunk (unmeasured k: see _pass_costs). Speculation off (0) is probed with k = 1 every
        probe_every chunks."""
        tokens = self.acceptance.expected_tokens()
        k = int(np.argmax(tokens / self._pass_costs()))
        if k == 0 and self.cfg.k_max > 0:
            self._since_probe += 1
            if self._since_probe >= self.cfg.probe_every:
                self._since_probe = 0
                return 1
        return k

    def _pass_costs(self) -> np.ndarray:
        """Median cost (ns) of a draft + verify pass for k = 0..k_max, (k_max + 1,). Costs grow about
        linearly in k, so an unmeasured k is interpolated between measured ones (np.interp: flat past the
        ends), and with one measured k or none every k is costed like the cheapest known pass: optimistic,
        so the next chunk tries the largest k and the line gets its second point."""
        lat, ks = self.latency, np.arange(self.cfg.k_max + 1)
        known = [k for k in ks if lat.count("verify", k)]
        costs = [lat.estimate_ns("draft", k, 0.5) + lat.estimate_ns("verify", k, 0.5) for k in known]
        if len(known) < 2:
            return np.full(len(ks), max(1.0, min(costs, default=1.0)))
        return np.maximum(1.0, np.interp(ks, known, costs))

    def record(self, op: str, k: int, value: int) -> None:
        if op == "accepted":
            self.acceptance.record(k, value)
        else:
            self.latency.record(op, k, value)
