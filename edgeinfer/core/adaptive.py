"""Adaptive speculation: which drafter, and how many drafts per target pass (k), for each chunk.

The choice maximises the expected tokens per unit of cost, E[tokens per pass | drafter, k] / E[cost of
the pass | drafter, k]. With drafts kept independently at rate a, E[tokens per pass] = (1 - a^(k+1)) /
(1 - a) (Leviathan et al. 2023, arXiv 2211.17192, eq. 1). Action drafts are kept in runs (an arm's motion
is smooth for a while, then changes), so the estimate here is the empirical one from the kept-draft runs
of recent passes (AcceptanceModel), one per drafter.

Costs are relative: every measured draft or verify duration is divided by the duration of the same
chunk's prefill (one target pass over one token, run by every chunk whatever is chosen). On a shared or
throttled machine absolute costs drift by 2x within seconds, and a choice between a k measured in a quiet
second and a k measured in a busy one would follow the drift, not the k; the ratio stays put.

Exploration is bounded, so that speculation never costs much more than it can win:
    - first, each drafter decodes one chunk at each k of 1, 2, 4, 8, 16 (up to k_max): a few chunks, run
      by the runtime during its warm-up, after which every k has a measured or interpolated cost and the
      kept-draft runs of the longest passes give E[tokens] for every k;
    - then each chunk takes the best (drafter, k); k = 0 (speculation off) wins unless some (drafter, k) is
      expected to beat target-only by min_gain (default 5 %: a drafter that is only marginally faster on
      average is slower on some runs). A drafter that has gone `probe_every` chunks without one is probed
      (tried for a chunk at its best k >= 1; one probe per chunk, the longest-waiting drafter first), so that
      a drafter that starts paying again is noticed. A probe costs a whole chunk at a worse choice, so each
      probe that finds the drafter still behind doubles the wait before its next one (up to 32 x
      probe_every, exponential backoff), and one that finds it ahead resets the wait.
The model chooses k; realized cost decides whether a drafter may run at all. Each chunk's measured cost per
committed token (its prefill, drafts and verifies, in units of its prefill) is kept per drafter and for
target-only chunks (one is decoded at the end of exploration). A drafter whose last two chunks cost more per
token than target-only's (the median of its last nine), less min_gain, is behind whatever the model expects,
and is only probed. The acceptance model looks back 256 passes, a whole held-out run of 4 chunks, so when an
arm's motion changes and drafts stop being kept, the realized cost is what notices within a chunk. It also
catches what the model leaves out: the k = 0 cost is mostly measured on the last pass of a chunk, the
longest context.
Measured costs are made non-decreasing in k (isotonic regression: a longer pass never costs less, so a dip
is noise); unmeasured k are costed by interpolation between measured ones; past the largest, verification grows
along the last measured slope and drafting stays flat (a model drafter drafts k tokens in one pass).
"""
from __future__ import annotations

import statistics
from collections import defaultdict, deque
from typing import Sequence

import numpy as np


def expected_tokens(a: float, k: int) -> float:
    """E[tokens committed by a pass verifying k drafts] when each draft is kept independently with
    probability a in [0, 1] (Leviathan et al. 2023, eq. 1)."""
    return k + 1.0 if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


class AcceptanceModel:
    """E[tokens per pass] for each k from the kept-draft runs of recent passes, without assuming that drafts
    are kept independently. The survival S(j) = P(run of kept drafts >= j) is estimated like a Kaplan-Meier
    curve (a pass of k drafts that kept all k says only that the run is >= k), so E[tokens | k] = 1 + S(1)
    + ... + S(k). Each conditional step starts from a prior of 0.5 with the weight of one pass."""

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


def _nondecreasing(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """Weighted least-squares non-decreasing fit (isotonic regression by pool-adjacent-violators, Barlow et al.
    1972): a pass that verifies or drafts more tokens never costs less, so a dip between two measured k is
    noise, and must not become the argmax."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (v2, w2, n2), (v1, w1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return [m for m, _, n in blocks for _ in range(n)]


def _line(ks: Sequence[int], values: Sequence[float], at: np.ndarray, grow: bool = True) -> np.ndarray:
    """Piecewise-linear through (ks, values) (ks ascending); past the last point flat, or with grow along the
    last segment's slope (clipped at >= 0: a longer pass never costs less)."""
    out = np.interp(at, ks, values)
    if grow and len(ks) >= 2:
        slope = max(0.0, (values[-1] - values[-2]) / (ks[-1] - ks[-2]))
        past = at > ks[-1]
        out[past] = values[-1] + slope * (at[past] - ks[-1])
    return out


class SpeculationChooser:
    """Chooses (drafter, k) per chunk; see the module docstring. Feed it every pass of the chunk through
    record(). drafters: candidate names (empty or k_max = 0: always target-only)."""

    def __init__(self, drafters: Sequence[str], k_max: int, probe_every: int = 32, window: int = 64,
                 min_gain: float = 1.05):
        self.drafters, self.k_max, self.probe_every = list(drafters), k_max, probe_every
        self.min_gain = min_gain
        self.acceptance = {d: AcceptanceModel(k_max) for d in self.drafters}
        self._ratios: dict[tuple, deque] = defaultdict(lambda: deque(maxlen=window))
        self._ks: dict[tuple, set] = defaultdict(set)  # (op, drafter) -> k measured
        self._medians: dict[tuple, float] = {}  # refreshed early, then every 8th sample: choose() stays cheap
        self._curves: dict[tuple, np.ndarray] = {}  # (op, drafter) -> cost for every k, from those medians
        self._added: dict[tuple, int] = defaultdict(int)
        self._unit_ns = 0
        self._chunks = 0
        self._last_run = dict.fromkeys(self.drafters, -1)
        self._probe_wait = dict.fromkeys(self.drafters, probe_every)  # chunks between probes, per drafter
        self._probed: str | None = None  # the drafter the previous chunk probed, judged at the next choice
        ks = sorted({min(k, k_max) for k in (1, 2, 4, 8, 16)}) if k_max else []
        self._explore = [(d, k) for d in self.drafters for k in ks] + [(None, 0)] * bool(ks)
        # realized cost per committed token of the last chunks, per drafter (None: target-only), in prefills
        # (target-only's is the same on every run, 48 passes: a median of many; a drafter's follows the run)
        self._realized: dict[str | None, deque] = {d: deque(maxlen=2) for d in self.drafters}
        self._realized[None] = deque(maxlen=9)
        self._chunk_drafter: str | None = None  # the chunk in progress: its drafter, cost and tokens so far
        self._chunk_cost = 0.0
        self._chunk_tokens = 0

    def clear_costs(self) -> None:
        """Forget every measured cost (after warm-up: first calls pay one-off allocation costs)."""
        self._ratios.clear()
        self._ks.clear()
        self._medians.clear()
        self._curves.clear()
        self._added.clear()
        self._unit_ns = 0
        for r in self._realized.values():
            r.clear()
        self._chunk_tokens = 0

    def record(self, drafter: str | None, op: str, k: int, value: int) -> None:
        """op "prefill" | "draft" | "verify": a duration in ns; "accepted": drafts kept by a pass of k."""
        if op == "prefill":
            self._unit_ns = max(1, value)
            self._chunk_cost, self._chunk_tokens = 1.0, 1  # the prefill commits the chunk's first token
        elif op == "accepted":
            self._chunk_tokens += (value + 1) * bool(self._chunk_tokens)  # the kept drafts and the target's token
            if drafter is not None and k > 0:
                self.acceptance[drafter].record(k, value)
        elif self._unit_ns and (op == "verify" or k > 0):
            self._chunk_cost += value / self._unit_ns
            key = (op, drafter if op == "draft" else None, k)
            samples = self._ratios[key]
            samples.append(value / self._unit_ns)
            self._ks[key[:2]].add(k)
            self._added[key] += 1  # (a full window's length stays put: count the samples instead)
            if self._added[key] < 16 or self._added[key] % 8 == 0:
                self._medians.pop(key, None)
                self._curves.pop(key[:2], None)

    def _median(self, key: tuple) -> float:
        if key not in self._medians:
            self._medians[key] = float(np.median(self._ratios[key]))
        return self._medians[key]

    def _measured(self, op: str, drafter: str | None) -> tuple[list[int], list[float]]:
        """Measured k and their median costs, made non-decreasing in k (weighted by the samples behind each)."""
        ks = sorted(self._ks.get((op, drafter), ()))
        return ks, _nondecreasing([self._median((op, drafter, k)) for k in ks],
                                  [len(self._ratios[(op, drafter, k)]) for k in ks])

    def _curve(self, op: str, drafter: str | None) -> np.ndarray:
        """Cost of `op` for k = 0..k_max (see pass_costs), kept until one of its medians is refreshed: choose()
        runs every chunk, on the runtime's budget, and most curves have not moved since the last one."""
        if (curve := self._curves.get((op, drafter))) is None:
            ks, costs = self._measured(op, drafter)
            at = np.arange(self.k_max + 1)
            if op == "verify":
                curve = _line(ks, costs, at) if 0 in ks else _line([0, *ks], [1.0, *costs], at)
            else:
                curve = _line([0, *ks], [0.0, *costs], at, grow=False)
            self._curves[(op, drafter)] = curve
        return curve

    def pass_costs(self, drafter: str) -> np.ndarray:
        """Estimated draft + verify cost of a pass for k = 0..k_max, in units of a prefill pass, (k_max + 1,).
        Verify starts from 1.0 at k = 0 (a one-token target pass) until measured; drafting from 0 at k = 0."""
        return self._curve("verify", None) + self._curve("draft", drafter)

    def tokens_per_cost(self, drafter: str) -> np.ndarray:
        """E[tokens per pass] / E[cost] for k = 0..k_max, (k_max + 1,)."""
        return self.acceptance[drafter].expected_tokens() / self.pass_costs(drafter)

    def _end_chunk(self) -> None:
        """File the chunk just decoded under its drafter's realized costs (a probe's replaces the older ones)."""
        if self._chunk_tokens:
            realized = self._realized[self._chunk_drafter]
            if self._chunk_drafter is not None and self._chunk_drafter == self._probed:
                realized.clear()
            realized.append(self._chunk_cost / self._chunk_tokens)
        self._chunk_tokens = 0

    def behind(self, drafter: str) -> bool:
        """True when the drafter's last chunks cost more per committed token than target-only's (measured, or
        one k = 0 pass per token when none was measured yet), less min_gain: it is not to run, only be probed."""
        mine, off = self._realized[drafter], self._realized[None]
        if not mine:
            return False
        off_cost = statistics.median(off) if off else self.pass_costs(drafter)[0]
        return sum(mine) / len(mine) * self.min_gain > off_cost

    def choose(self) -> tuple[str | None, int]:
        """(drafter, k) for the next chunk; (None, 0) is target-only."""
        self._chunks += 1
        self._end_chunk()
        if not self.drafters or self.k_max == 0:
            return None, 0
        if self._explore:
            d, k = self._explore.pop(0)
            self._chunk_drafter = d
            if d is not None:
                self._last_run[d] = self._chunks
            return d, k
        scores = {d: self.tokens_per_cost(d) for d in self.drafters}
        running = [d for d in self.drafters if not self.behind(d)]
        best_d = max(running or self.drafters, key=lambda d: scores[d].max())
        best_k = int(np.argmax(scores[best_d])) if running else 0
        if scores[best_d][best_k] < self.min_gain * scores[best_d][0]:
            best_k = 0
        if self._probed is not None:  # back off from a drafter its probe found behind, or stop backing off
            d, self._probed = self._probed, None
            ahead = d == best_d and best_k > 0
            self._probe_wait[d] = self.probe_every if ahead else min(2 * self._probe_wait[d], 32 * self.probe_every)
        due = [d for d in self.drafters if (d != best_d or best_k == 0)
               and self._chunks - max(self._last_run[d], 0) >= self._probe_wait[d]]
        if due:  # probe the drafter that has waited longest
            best_d = self._probed = min(due, key=self._last_run.get)
            best_k = 1 + int(np.argmax(scores[best_d][1:]))
        if best_k == 0:
            self._chunk_drafter = None
            return None, 0
        self._last_run[best_d] = self._chunks
        self._chunk_drafter = best_d
        return best_d, best_k
