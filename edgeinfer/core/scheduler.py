"""Deadline-aware planning of one chunk's decoding: which drafter and how many drafts the next target pass
may verify, and whether another pass fits the tick's budget at all.

Each chunk first chooses its drafter and speculation length k (SchedulerConfig.adaptive: for the most
expected tokens per second, edgeinfer.core.adaptive; otherwise the first drafter at k_max), and how many of
its passes may speculate (a probe's few; otherwise all). Then, before every pass, the deadline check lowers
k, or stops decoding, when the high-quantile cost of the pass does not fit what is left of the budget.

Row boundaries: a chunk cut short is cut at its last whole row of D tokens (a step of every joint, or a DCT
coefficient of every joint; edgeinfer/node/runtime.py), so the tokens of an unfinished row are thrown away.
Once a whole row is verified, the planner stops as soon as what is left of the budget cannot complete the next
row even at the fastest cost measured for each pass with every draft kept: the passes it skips could only
have produced tokens that are cut off, and the chunk goes out that much earlier, leaving the CPU to the rest of
the loop. Before the first whole row nothing is cut off (the draft rung keeps the verified prefix), so it
never stops there early. The planner only chooses k and when to stop; it never changes a token.

Costs for the deadline are online estimates of a high quantile (default p99, not the mean: a plan built on
means misses its deadline about half the time the estimate is tight) over a rolling window of measured
durations, per operation (drafting per drafter) and speculation length k.
"""
from __future__ import annotations

import time
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from edgeinfer.core.adaptive import SpeculationChooser

UNRESOLVED_BUDGET_MS = 20.0  # a planner's budget before the control period is known (SchedulerConfig.budget_ms)
FASTEST = 0.0  # the quantile of an operation's fastest measured cost (the row-boundary stop's bound)


@dataclass
class SchedulerConfig:
    """The deadline planner: how many tokens each chunk may verify within its budget."""

    # From the observation being taken to its chunk being published, ms (None: the time between two chunk starts,
    # replan_every_ticks control periods: 20 ms for the Schunk policy at 250 Hz, 50 ms for a 20 Hz policy that
    # replans every tick; resolved when the control period is known, see resolved_budget_ms).
    budget_ms: float | None = None
    k_max: int = 16  # drafts per target pass, the most the planner may choose (0 = target-only)
    quantile: float = 0.99  # quantile of the measured operation costs the plan is built on
    window: int = 256  # cost samples kept per operation (the rolling window of the quantile)
    margin_ms: float = 0.5  # kept free at the end of the budget for encoding and publishing the chunk
    adaptive: bool = True  # choose k per chunk for tokens/s (k_max is then the most it may choose)
    probe_every: int = 8  # adaptive: the fewest chunks between two probes of a drafter that is not running
    probe_passes: int = 4  # adaptive: speculative passes in a probe (the rest of its chunk is target-only)
    probe_share: float = 0.01  # adaptive: the most of the decode time a drafter's probes may cost, fraction

    def __post_init__(self):
        if not self.margin_ms >= 0:
            raise ValueError(f"SchedulerConfig.margin_ms must be >= 0, got {self.margin_ms}")
        if self.budget_ms is not None:
            self.check_budget_ms(self.budget_ms)
        if not 16 <= self.window <= 100_000:
            raise ValueError(f"SchedulerConfig.window must be in 16..100000, got {self.window}")
        if not 0 <= self.k_max <= 64:
            raise ValueError(f"SchedulerConfig.k_max must be in 0..64, got {self.k_max}")
        if self.probe_every < 1:
            raise ValueError(f"SchedulerConfig.probe_every must be >= 1, got {self.probe_every}")
        if not 1 <= self.probe_passes <= 64:
            raise ValueError(f"SchedulerConfig.probe_passes must be in 1..64, got {self.probe_passes}")
        if not 0 < self.probe_share <= 1:
            raise ValueError(f"SchedulerConfig.probe_share must be in (0, 1], got {self.probe_share}")
        if not 0.5 <= self.quantile < 1:
            raise ValueError(f"SchedulerConfig.quantile must be in [0.5, 1), got {self.quantile}")

    def check_budget_ms(self, budget_ms: float, derived: bool = False) -> None:
        """Raises ValueError unless 0 < budget_ms <= 10000 and margin_ms < budget_ms. derived: budget_ms is not
        the field's but the time between two chunk starts (resolved_budget_ms), and the error says so."""
        if 0 < budget_ms <= 10_000 and self.margin_ms < budget_ms:
            return
        what = (f"the budget, {budget_ms:g} ms (the time between two chunk starts; SchedulerConfig.budget_ms "
                "sets another)" if derived else f"SchedulerConfig.budget_ms ({budget_ms})")
        if not 0 < budget_ms <= 10_000:
            raise ValueError(f"{what} must be in (0, 10000] ms")
        raise ValueError(f"{what} must exceed SchedulerConfig.margin_ms ({self.margin_ms}), the time kept free to "
                         "publish the chunk")

    def resolved_budget_ms(self, replan_every_ticks: int, period_ns: int) -> float:
        """budget_ms, or (None) the time between two chunk starts: replan_every_ticks x period_ns, in ms.
        Raises ValueError as check_budget_ms."""
        budget = self.budget_ms if self.budget_ms is not None else replan_every_ticks * period_ns / 1e6
        self.check_budget_ms(budget, derived=self.budget_ms is None)
        return budget


def k_group(k: int) -> str:
    """The metrics name of a speculation length: k0, k1-2, k3-4, k5-8, k9-16, k17+ (few names, log-spaced)."""
    for lo, hi in ((0, 0), (1, 2), (3, 4), (5, 8), (9, 16)):
        if lo <= k <= hi:
            return f"k{lo}" if lo == hi else f"k{lo}-{hi}"
    return "k17+"


class LatencyModel:
    """Rolling high-quantile estimates of operation costs in ns, keyed by (op, k).

    observer(name, duration_ns), when set (the runtime's telemetry), also receives every sample after the
    warm-up as a histogram named "<op>.<k group>" (e.g. "verify.k3-4", "draft:learned.k9-16", "prefill.k0"),
    so the distributions the plan is built on are readable while the runtime runs.

    Samples older than max_age_ns are forgotten. A pass the plan refuses records nothing, so without this an
    estimate that a host stall inflated would refuse that pass for ever (a 30-minute soak sent unverified
    drafts for 28 minutes after a loaded start): its samples now expire, the estimate falls to 0 (never
    measured), and the next pass re-measures it. The cost: an op that really does not fit is tried once per
    max_age_ns. clock: monotonic ns (the planner's, injectable in tests)."""

    def __init__(self, quantile: float = 0.99, window: int = 256, max_age_ns: int = 5_000_000_000,
                 clock: Callable[[], int] = time.perf_counter_ns):
        self.quantile, self.max_age_ns, self.clock = quantile, max_age_ns, clock
        self._samples: dict[tuple[str, int], deque] = defaultdict(lambda: deque(maxlen=window))
        self._times: dict[tuple[str, int], deque] = defaultdict(lambda: deque(maxlen=window))
        self._cache: dict[tuple[str, int], float] = {}
        self._added: dict[tuple[str, int], int] = defaultdict(int)
        self.observer = None

    def record(self, op: str, k: int, duration_ns: int) -> None:
        if self.observer is not None:
            self.observer(f"{op}.{k_group(k)}", duration_ns)
        samples = self._samples[(op, k)]
        samples.append(duration_ns)
        self._times[(op, k)].append(self.clock())
        self._added[(op, k)] += 1  # a full window's length stays put: count the samples instead
        if self._added[(op, k)] < 16 or self._added[(op, k)] % 8 == 0:  # a quantile of 256 samples costs
            for q in (self.quantile, 0.5, FASTEST):  # ~20 us: refresh early, then every 8th sample, not every pass
                self._cache.pop((op, k, q), None)

    def clear(self) -> None:
        """Forget every sample (after warm-up: first calls pay one-off allocation costs)."""
        self._samples.clear()
        self._times.clear()
        self._cache.clear()
        self._added.clear()

    def estimate_ns(self, op: str, k: int, quantile: float | None = None) -> float:
        """Quantile estimate (default: the planning quantile); 0 when never measured (the first pass is how
        it gets measured)."""
        q = self.quantile if quantile is None else quantile
        key = (op, k, q)
        times = self._times.get((op, k))
        if times and times[0] < self.clock() - self.max_age_ns:  # expire what is too old to plan on
            cutoff, samples = self.clock() - self.max_age_ns, self._samples[(op, k)]
            while times and times[0] < cutoff:
                times.popleft()
                samples.popleft()
            for qq in (self.quantile, 0.5, FASTEST, q):
                self._cache.pop((op, k, qq), None)
            self._added[(op, k)] = len(samples)  # so the next samples refresh the estimate at once
        if key not in self._cache:
            s = self._samples.get((op, k))
            self._cache[key] = float(np.quantile(s, q)) if s else 0.0
        return self._cache[key]

    def count(self, op: str, k: int) -> int:
        return len(self._samples.get((op, k), ()))


class TickPlanner:
    """Plans the passes of one chunk against an absolute deadline on the monotonic clock.

    Per chunk: choose() -> the drafter to use (None: target-only), then start(t) or unlimited(), then the
    decoder asks plan() before every pass and reports every pass through record(op, k, value): op "prefill" |
    "draft" | "verify" with a duration in ns, or "accepted" with the number of drafts the pass kept. A chunk
    whose speculative passes are counted (a probe's few) speculates from its middle, as a drafter's first
    passes are not typical of it (it drafts from the observation alone, or pays its own prefill), and is
    target-only once they are spent.
    drafters: candidate drafter names, in order of preference when adaptive is off. row_tokens: tokens per row
    (the policy's joints D; 1: no row boundaries), see the module docstring."""

    def __init__(self, cfg: SchedulerConfig, drafters: Sequence[str] = ("drafter",),
                 latency: LatencyModel | None = None, row_tokens: int = 1):
        if row_tokens < 1:
            raise ValueError(f"TickPlanner row_tokens must be >= 1, got {row_tokens}")
        self.cfg, self.row_tokens = cfg, row_tokens
        self.latency = latency or LatencyModel(cfg.quantile, cfg.window)
        self.chooser = SpeculationChooser(drafters, cfg.k_max, cfg.probe_every, probe_passes=cfg.probe_passes,
                                          probe_share=cfg.probe_share)
        self.deadline_ns = None
        # until set_budget_ms (the runtime calls it when it learns the control period): the Schunk policy's 20 ms
        self.budget_ms = cfg.budget_ms if cfg.budget_ms is not None else UNRESOLVED_BUDGET_MS
        self.drafter: str | None = drafters[0] if drafters and cfg.k_max else None
        self._chunk_k = cfg.k_max if self.drafter else 0
        self._passes_left: int | None = None  # speculative passes this chunk may still run (None: every pass)
        self._tokens_per_ns: float | None = None  # this chunk's best verified tokens per ns (None: not yet known)

    def choose(self) -> str | None:
        """Choose this chunk's drafter and k (adaptive), or keep the configured ones; returns the drafter's name,
        None for a target-only chunk."""
        if self.cfg.adaptive:
            self.drafter, self._chunk_k, self._passes_left = self.chooser.choose()
        return self.drafter

    def set_budget_ms(self, budget_ms: float) -> None:
        """Plan each chunk for budget_ms from its start (SchedulerConfig.resolved_budget_ms)."""
        self.cfg.check_budget_ms(budget_ms)
        self.budget_ms = budget_ms

    def start(self, t_start_ns: int | None = None) -> None:
        """Begin a chunk whose budget runs from t_start_ns (default: now)."""
        t = time.perf_counter_ns() if t_start_ns is None else t_start_ns
        self.deadline_ns = t + int((self.budget_ms - self.cfg.margin_ms) * 1e6)
        self._tokens_per_ns = None

    def unlimited(self) -> None:
        """Plan without a deadline (warm-up and offline evaluation)."""
        self.deadline_ns = None

    def plan(self, committed: int, remaining: int) -> int | None:
        left = None if self.deadline_ns is None else self.deadline_ns - time.perf_counter_ns()
        if committed == 0:
            # The prefill always runs while any budget is left: without it nothing is verified, and an op
            # that is never run again could never correct a pessimistic estimate.
            return 0 if left is None or left > 0 else None
        if left is not None and committed >= self.row_tokens and \
                left * self._best_tokens_per_ns() < self.row_tokens - committed % self.row_tokens:
            return None  # the next row cannot be completed: its tokens would be cut off (module docstring)
        speculate = self._passes_left is None or (self._passes_left > 0 and 2 * committed >= committed + remaining)
        k_chunk = self._chunk_k if speculate else 0
        for k in range(min(k_chunk, remaining - 1), -1, -1):
            if left is None or self._pass_ns(k) <= left:
                return k
        return None

    def plain_passes(self, committed: int, remaining: int) -> int:
        """After plan() returned 0: how many target-only passes may run back to back from here, in one engine call
        (Engine.greedy_run), >= 1. Only in a chunk that does not speculate at all (its k is 0, no probe). A run
        ends at the next row boundary: the first row is published as soon as it exists, and plan() checks the
        deadline and the row rule again before every row, so that an engine that slows down mid-run (a stale cost
        estimate) overruns by one row at most. Within the row, passes of the planning-quantile cost that fit the
        time left, rounded down to the row boundary (the row rule) unless the run ends the chunk."""
        if self._chunk_k or remaining <= 1:
            return 1
        m = min(remaining, self.row_tokens - committed % self.row_tokens)
        if self.deadline_ns is not None and m < remaining:
            per_pass = self._pass_ns(0)
            if per_pass <= 0:  # never measured (or expired): one pass measures it
                return 1
            if int((self.deadline_ns - time.perf_counter_ns()) // per_pass) < m:
                return 1  # the row does not fit: pass by pass, as plan() decides
        return max(m, 1)

    def record_plain(self, passes: int, duration_ns: int) -> None:
        """`passes` target-only passes that took duration_ns in all (one engine call): one cost sample of their
        mean, and the chunk's tokens."""
        self.chooser.record_plain(passes, duration_ns // passes)
        self.latency.record("verify", 0, duration_ns // passes)

    def _pass_ns(self, k: int, quantile: float | None = None) -> float:
        """A pass of k drafts: drafting plus verifying, at `quantile` (default: the planning one), ns."""
        return self.latency.estimate_ns(f"draft:{self.drafter}", k, quantile) + \
            self.latency.estimate_ns("verify", k, quantile)

    def _best_tokens_per_ns(self) -> float:
        """The most tokens a pass of this chunk can verify per ns: k + 1 (every draft kept) over its fastest
        measured cost, best over k = 0..the chunk's k; inf while one was never measured (or its samples expired:
        the deadline check plans such a pass as free too, and under a tight budget the lower k get run and
        measured). Once per chunk."""
        if self._tokens_per_ns is None:
            costs = [(k + 1, self._pass_ns(k, FASTEST)) for k in range(self._chunk_k + 1)]
            self._tokens_per_ns = max(n / ns if ns > 0 else float("inf") for n, ns in costs)
        return self._tokens_per_ns

    def forget_costs(self) -> None:
        """Drop every measured cost, for the deadline and for the choice (the one-off costs of first calls)."""
        self.latency.clear()
        self.chooser.clear_costs()

    def record(self, op: str, k: int, value: int) -> None:
        self.chooser.record(self.drafter, op, k, value)
        if op == "accepted" and k > 0 and self._passes_left:
            self._passes_left -= 1
        if op != "accepted":
            self.latency.record(f"draft:{self.drafter}" if op == "draft" else op, k, value)
