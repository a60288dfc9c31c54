"""Adaptive speculation: which drafter, how many drafts per target pass (k), and for how many passes, per chunk.

The choice maximises the expected tokens per unit of cost, E[tokens per pass | drafter, k] / E[cost of
the pass | drafter, k], the drafter's cost per proposal included: speculation is on only when it is expected
to take less time per token than target-only. With drafts kept independently at rate a, E[tokens per pass]
= (1 - a^(k+1)) / (1 - a) (Leviathan et al. 2023, arXiv 2211.17192, eq. 1). Action drafts are kept in runs
(an arm's motion is smooth for a while, then changes), so the estimate here is the empirical one from the
kept-draft runs of recent passes (AcceptanceModel), one per drafter.

Costs are relative: every measured draft or verify duration is divided by the duration of the same
chunk's prefill (one target pass over one token, run by every chunk whatever is chosen). On a shared or
throttled machine absolute costs drift by 2x within seconds, and a choice between a k measured in a quiet
second and a k measured in a busy one would follow the drift, not the k; the ratio stays put.

    - Exploration: first, each drafter decodes one chunk at each k of 1, 2, 4, 8, 16 (up to k_max), then one
      chunk is target-only: a few chunks, run by the runtime during its warm-up, after which every k has a
      measured or interpolated cost and the kept-draft runs of the longest passes give E[tokens] for every k
      (and the probes below wait probe_every chunks from its end).
    - Then each chunk takes the best (drafter, k); k = 0 (speculation off) wins unless some (drafter, k) is
      expected to beat target-only by min_gain (default 5 %: a drafter that is only marginally faster on
      average is slower on some runs).
    - Realized cost decides whether a drafter may run at all. Each drafter's last `realized_passes` (32, about
      two chunks) speculative passes give its measured cost per committed token: their median cost (drafting
      and verifying, in prefills; a median, so that a stalled pass is not taken for a slow drafter) over
      their mean tokens. A drafter whose cost per token, less min_gain, is above target-only's (the k = 0 pass
      cost) is behind whatever the model expects, and is only probed. The acceptance model looks back 256
      passes, a whole held-out run, so when an arm's motion changes and drafts stop being kept, the realized
      cost is what notices, within a chunk.
    - A probe is a few passes, not a chunk: a drafter that is not running is tried for `probe_passes` (4)
      passes at its best k >= 1 in an otherwise target-only chunk (from its middle: TickPlanner). Those
      passes replace its realized cost (so the next chunk runs it if they paid) and feed its acceptance
      model. What a probe cost is measured: the probe chunk's cost less its tokens at the per-token cost of
      the choice it displaced. A drafter is probed again once `probe_every` chunks have passed and
      probe_share (1 %) of the decode cost since its last chunk covers its last probe's cost: a cheap
      drafter is probed every probe_every chunks, a slow one (a 12 ms proposal against a 0.2 ms target pass
      is 60 passes) so much less often that its probes take about probe_share of the decoding time at most.
      One probe per chunk, longest-waiting first.
Measured costs are made non-decreasing in k (isotonic regression: a longer pass never costs less, so a dip
is noise); unmeasured k are costed by interpolation between measured ones; past the largest, verification grows
along the last measured slope and drafting stays flat (a model drafter drafts k tokens in one pass).
"""
from __future__ import annotations

import statistics
from collections import defaultdict, deque
from typing import NamedTuple, Sequence

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


class Choice(NamedTuple):
    """One chunk's speculation: drafter (None: target-only), k drafts per pass, and how many passes may
    speculate (a probe's few; None: every pass)."""

    drafter: str | None
    k: int
    passes: int | None = None


class SpeculationChooser:
    """Chooses (drafter, k, passes) per chunk; see the module docstring. Feed it every pass of the chunk through
    record(). drafters: candidate names (empty or k_max = 0: always target-only). Costs are in prefills."""

    def __init__(self, drafters: Sequence[str], k_max: int, probe_every: int = 8, window: int = 64,
                 min_gain: float = 1.05, probe_passes: int = 4, probe_share: float = 0.01,
                 realized_passes: int = 32):
        self.drafters, self.k_max, self.probe_every = list(drafters), k_max, probe_every
        self.min_gain, self.probe_passes, self.probe_share = min_gain, probe_passes, probe_share
        self.acceptance = {d: AcceptanceModel(k_max) for d in self.drafters}
        self._ratios: dict[tuple, deque] = defaultdict(lambda: deque(maxlen=window))
        self._ks: dict[tuple, set] = defaultdict(set)  # (op, drafter) -> k measured
        self._medians: dict[tuple, float] = {}  # refreshed early, then every 8th sample: choose() stays cheap
        self._curves: dict[tuple, np.ndarray] = {}  # (op, drafter) -> cost for every k, from those medians
        self._added: dict[tuple, int] = defaultdict(int)
        self._unit_ns = 0
        self._chunks = 0
        ks = sorted({min(k, k_max) for k in (1, 2, 4, 8, 16)}) if k_max else []
        self._explore = [(d, k) for d in self.drafters for k in ks] + [(None, 0)] * bool(ks)
        # (cost, tokens committed) of each drafter's last speculative passes: its realized cost per token
        self._realized = {d: deque(maxlen=realized_passes) for d in self.drafters}
        self._last_run = dict.fromkeys(self.drafters, 0)  # the chunk each drafter last ran or was probed in
        self._cost_since = dict.fromkeys(self.drafters, 0.0)  # decode cost since then
        self._probe_cost: dict[str, float] = {}  # each drafter's last probe: its cost beyond the displaced choice
        self._probing: str | None = None  # the chunk in progress: the drafter it probes, and what it displaced
        self._displaced = 0.0  # ... per committed token
        self._fresh = False  # the probe's first pass is still to come (it clears the drafter's realized cost)
        self._chunk_cost = self._pass_cost = 0.0  # the chunk and the pass in progress, so far
        self._chunk_tokens = 0
        self.probes = 0  # probes started, counted

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
        self._probe_cost.clear()
        self._chunk_tokens = 0

    def record(self, drafter: str | None, op: str, k: int, value: int) -> None:
        """op "prefill" | "draft" | "verify": a duration in ns; "accepted": drafts kept by a pass of k."""
        if op == "prefill":
            self._unit_ns = max(1, value)
            self._chunk_cost, self._chunk_tokens = 1.0, 1  # the prefill commits the chunk's first token
        elif op == "accepted":
            self._chunk_tokens += (value + 1) * bool(self._chunk_tokens)  # the kept drafts and the target's token
            if drafter is not None and k > 0 and self._unit_ns:
                self.acceptance[drafter].record(k, value)
                if self._fresh:  # a probe's passes replace what the drafter's earlier passes said
                    self._realized[drafter].clear()
                    self._fresh = False
                self._realized[drafter].append((self._pass_cost, value + 1))
            self._pass_cost = 0.0
        elif self._unit_ns and (op == "verify" or k > 0):
            cost = value / self._unit_ns
            self._chunk_cost += cost
            self._pass_cost += cost
            self._add_ratio((op, drafter if op == "draft" else None, k), cost)

    def record_plain(self, passes: int, pass_ns: int) -> None:
        """`passes` target-only passes run back to back (one engine call), pass_ns each on average: what as many
        record("verify", 0, pass_ns) + record("accepted", 0, 0) pairs would record, with one cost sample."""
        if self._unit_ns:
            cost = pass_ns / self._unit_ns
            self._chunk_cost += cost * passes
            self._add_ratio(("verify", None, 0), cost)
        self._chunk_tokens += passes * bool(self._chunk_tokens)
        self._pass_cost = 0.0

    def _add_ratio(self, key: tuple, cost: float) -> None:
        self._ratios[key].append(cost)
        self._ks[key[:2]].add(key[2])
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

    def target_only_cost(self) -> float:
        """Target-only's cost per token, in prefills: the median k = 0 pass (1.0, the prefill, until measured)."""
        return float(self._curve("verify", None)[0])

    def realized_cost(self, drafter: str) -> float | None:
        """The drafter's measured cost per committed token over its last speculative passes, in prefills: their
        median cost (drafting and verifying) over their mean tokens committed; None before any."""
        passes = self._realized[drafter]
        if not passes:
            return None
        costs, tokens = zip(*passes)
        return statistics.median(costs) * len(tokens) / sum(tokens)

    def behind(self, drafter: str) -> bool:
        """True when the drafter's last passes cost more per committed token than target-only's, less min_gain:
        it is not to run, only be probed."""
        mine = self.realized_cost(drafter)
        return mine is not None and mine * self.min_gain > self.target_only_cost()

    def _end_chunk(self) -> None:
        """Add the chunk just decoded to every drafter's cost since it last ran; a probe's own cost is what the
        chunk cost beyond its tokens at the displaced choice's cost per token."""
        if self._chunk_tokens:
            for d in self._cost_since:
                self._cost_since[d] += self._chunk_cost
            if self._probing is not None:
                self._probe_cost[self._probing] = max(0.0, self._chunk_cost - self._chunk_tokens * self._displaced)
        self._probing, self._fresh, self._chunk_tokens = None, False, 0

    def _probe_due(self, drafter: str, k: int) -> bool:
        """probe_every chunks since the drafter last ran, and probe_share of the decode cost since covers a
        probe (its last one's measured cost; before any, probe_passes whole passes at k)."""
        cost = self._probe_cost.get(drafter)
        cost = self.probe_passes * self.pass_costs(drafter)[k] if cost is None else cost
        return self._chunks - self._last_run[drafter] >= self.probe_every and \
            self._cost_since[drafter] * self.probe_share >= cost

    def _run(self, drafter: str | None, k: int, passes: int | None = None) -> Choice:
        if drafter is not None:
            self._last_run[drafter], self._cost_since[drafter] = self._chunks, 0.0
        return Choice(drafter, k, passes)

    def choose(self) -> Choice:
        """(drafter, k, passes) for the next chunk; (None, 0, None) is target-only."""
        self._chunks += 1
        self._end_chunk()
        if not self.drafters or self.k_max == 0:
            return Choice(None, 0)
        if self._explore:
            choice = self._run(*self._explore.pop(0))
            if not self._explore:  # every drafter was just measured: the probes' clocks start now
                self._last_run = dict.fromkeys(self.drafters, self._chunks)
                self._cost_since = dict.fromkeys(self.drafters, 0.0)
            return choice
        scores = {d: self.tokens_per_cost(d) for d in self.drafters}
        running = [d for d in self.drafters if not self.behind(d)]
        best_d = max(running or self.drafters, key=lambda d: scores[d].max())
        best_k = int(np.argmax(scores[best_d])) if running else 0
        if scores[best_d][best_k] < self.min_gain * scores[best_d][0]:
            best_k = 0
        probe_k = {d: 1 + int(np.argmax(scores[d][1:])) for d in self.drafters}
        due = [d for d in self.drafters if (d != best_d or best_k == 0) and self._probe_due(d, probe_k[d])]
        if due:  # probe the drafter that has waited longest, for a few passes of an otherwise target-only chunk
            d = self._probing = min(due, key=self._last_run.get)
            off = self.target_only_cost()
            self._displaced = (self.realized_cost(best_d) or off) if best_k else off
            self._fresh = True
            self.probes += 1
            return self._run(d, probe_k[d], self.probe_passes)
        return self._run(best_d, best_k) if best_k else Choice(None, 0)
