"""Speculative decoding of action tokens: the hot path, top to bottom.

    prefill(obs)              one target pass at position 0        -> action token 0
    draft(tokens, k)          the drafter proposes k tokens         (near-zero cost for kinematic)
    verify(last, drafts)      one target pass over k+1 positions    -> the target's logits at each
    accept                    the rule (edgeinfer.core.acceptance) keeps a prefix of the drafts and adds the
                              target's own token after it (the correction, or the bonus if all were kept)

Greedy acceptance (Leviathan et al. 2023, arXiv 2211.17192, with temperature 0; Chen et al. 2023,
arXiv 2302.01318): draft i is kept iff it equals argmax p_target(. | prefix + drafts[:i]). Every committed
token is therefore the target's own greedy token, so the output is token-for-token identical to
target-only greedy decoding, whatever the drafter proposes. Rejected drafts need no cache copy: their KV
entries sit at positions past the committed prefix and are overwritten by the next pass (see model.py).

The target is an Engine (edgeinfer.engines.backends.engine): any backend, one interface.
A `Planner` (edgeinfer.core.scheduler) decides before each pass how many drafts to verify, or that the tick's
budget cannot hold another pass; decoding then stops with a verified prefix.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

from edgeinfer.core.acceptance import Greedy, Sampling
from edgeinfer.core.protocols import Drafter, Engine, Pass


class Planner(Protocol):
    def plan(self, committed: int, remaining: int) -> int | None:
        """Drafts to verify in the next pass (0 = plain target step), or None when no pass fits."""

    def record(self, op: str, k: int, value: int) -> None:
        """op "prefill" | "draft" | "verify": a duration in ns; "accepted": drafts kept by a pass of k."""

    def plain_passes(self, committed: int, remaining: int) -> int:
        """After plan() returned 0: how many target-only passes may run back to back in one engine call (>= 1)."""

    def record_plain(self, passes: int, duration_ns: int) -> None:
        """`passes` target-only passes run back to back took duration_ns in all."""


class FixedK:
    """A Planner without a budget: k drafts per pass after the prefill (k = 0: target-only) and no
    bookkeeping, so timings are the engine's and the drafter's alone. For tests and benchmarks."""

    def __init__(self, k: int):
        self.k = k

    def plan(self, committed: int, remaining: int) -> int:
        return 0 if committed == 0 else self.k

    def record(self, op: str, k: int, value: int) -> None:
        pass

    def plain_passes(self, committed: int, remaining: int) -> int:
        return remaining if self.k == 0 else 1

    def record_plain(self, passes: int, duration_ns: int) -> None:
        pass


@dataclass
class DecodeResult:
    """tokens: committed (target-verified) action tokens, in order. complete: all n_tokens produced."""

    tokens: list[int] = field(default_factory=list)
    target_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    complete: bool = False

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


class ChunkDecode:
    """One chunk's decoding as a state machine, one target pass at a time: the loop of speculative_decode below
    and a fleet's batched passes (edgeinfer/core/fleet_batching.py) drive this same code, so a robot's tokens come from
    one implementation whoever runs its passes.

    obs: (obs_dim,) float32 features; drafter None: target-only. next_pass(slot, k) drafts k tokens now and returns
    the target pass to run (the prefill first); commit(logits) applies the acceptance rule to that pass's logits
    (T, n_bins). `res` holds the committed tokens and counts; `done` once n_tokens are committed."""

    def __init__(self, obs: np.ndarray, n_tokens: int, drafter: Drafter | None, rule: Greedy | Sampling | None = None):
        self.obs, self.n_tokens, self.drafter = obs, n_tokens, drafter
        self.rule = rule or Greedy()
        self.res = DecodeResult()
        self._drafts: list[int] = []
        self._q = None

    @property
    def n(self) -> int:
        """Committed tokens so far."""
        return len(self.res.tokens)

    @property
    def done(self) -> bool:
        return self.res.complete

    def clamp_k(self, k: int) -> int:
        """k as the next pass may use it: none without a drafter or before the prefill, and never past the chunk."""
        return 0 if self.drafter is None or self.n == 0 else max(0, min(k, self.n_tokens - self.n - 1))

    def next_pass(self, slot: int, k: int) -> Pass:
        """The next target pass for KV-cache slot `slot` with k drafts (clamped: clamp_k), drafted now. The prefill
        (position 0: the observation) when nothing is committed; else the last committed token and the drafts at
        positions n..n+k, row i of its logits predicting token n + i."""
        if self.n == 0:
            self._drafts, self._q = [], None
            return Pass(slot, self.obs, (), 0)
        k = self.clamp_k(k)
        self._drafts, self._q = self.rule.draft(self.drafter, self.res.tokens, k) if k > 0 else ([], None)
        return Pass(slot, None, (self.res.tokens[-1], *self._drafts), self.n)

    def commit(self, logits: np.ndarray) -> int:
        """Apply the rule to the logits (T, n_bins) of the pass next_pass returned; returns the drafts kept. Rejected
        drafts need no cache copy: their entries sit past the committed prefix (module docstring)."""
        res = self.res
        res.target_passes += 1
        if self.n == 0:
            res.tokens.append(self.rule.first(logits[-1]))  # prefill: position 0 is the observation
            accepted = 0
        else:
            accepted, token = self.rule.accept(self._drafts, self._q, logits)
            res.tokens.extend(self._drafts[:accepted])
            res.tokens.append(token)  # the target's correction, or its bonus token
            res.drafted += len(self._drafts)
            res.accepted += accepted
        res.complete = self.n >= self.n_tokens
        return accepted

    def extend(self, tokens: Sequence[int], passes: int) -> None:
        """Commit `tokens` from `passes` target-only greedy passes run in one engine call (Engine.greedy_run)."""
        self.res.tokens.extend(tokens)
        self.res.target_passes += passes
        self.res.complete = self.n >= self.n_tokens


def speculative_decode(engine: Engine, obs: np.ndarray, n_tokens: int, drafter: Drafter | None,
                       planner: Planner, rule: Greedy | Sampling | None = None,
                       on_commit: Callable[[list[int]], None] | None = None) -> DecodeResult:
    """Decode up to n_tokens action tokens for one observation (batch 1).

    obs: (obs_dim,) float32 normalised features. drafter None (or plans of k=0) gives target-only decoding.
    rule: the acceptance rule (edgeinfer.core.acceptance): Greedy (default, exact), Relaxed (lossy) or Sampling
    (exact in distribution). Returns the committed tokens; `complete` is False when the planner stopped
    early for lack of budget. on_commit(tokens), when given, is called after every target pass with the
    committed tokens so far (the runtime publishes the first verified action step from it).
    """
    dec = ChunkDecode(obs, n_tokens, drafter, rule)
    # an engine that runs greedy passes back to back in one call (engines/backends/fused_engine.py): target-only
    # stretches go there; greedy rules only (at k = 0 Relaxed is Greedy), sampling draws every token here
    run = getattr(engine, "greedy_run", None) if isinstance(dec.rule, Greedy) else None
    while not dec.done:
        n = dec.n
        k = planner.plan(n, n_tokens - n)
        if k is None:
            break
        k = dec.clamp_k(k)
        if k == 0 and n > 0 and run is not None and (m := planner.plain_passes(n, n_tokens - n)) > 1:
            t0 = time.perf_counter_ns()
            dec.extend(run(dec.res.tokens, m), m)  # m target passes: the same tokens as m passes below
            planner.record_plain(m, time.perf_counter_ns() - t0)
        else:
            t0 = time.perf_counter_ns()
            p = dec.next_pass(0, k)
            t1 = time.perf_counter_ns()
            accepted = dec.commit(engine.forward(p.obs, p.tokens, p.start))
            t2 = time.perf_counter_ns()
            if n == 0:
                planner.record("prefill", 0, t2 - t0)
            else:
                if k:  # a pass without drafts drafted nothing, in no time
                    planner.record("draft", k, t1 - t0)
                planner.record("verify", k, t2 - t1)
                planner.record("accepted", k, accepted)
                engine.rollback(dec.n)  # positions past the committed prefix held rejected drafts
        if on_commit is not None and n > 0:
            on_commit(dec.res.tokens)
    return dec.res
