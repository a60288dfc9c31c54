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

The target is an Engine (edgeinfer.engines.engine): any backend, one interface.
A `Planner` (edgeinfer.core.scheduler) decides before each pass how many drafts to verify, or that the tick's
budget cannot hold another pass; decoding then stops with a verified prefix.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from edgeinfer.core.acceptance import Greedy, Sampling
from edgeinfer.core.protocols import Drafter, Engine


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
    rule = rule or Greedy()
    res = DecodeResult()
    # an engine that runs greedy passes back to back in one call (engines/fused_engine.py): target-only stretches
    # go there; greedy rules only (at k = 0 Relaxed is Greedy), sampling draws every token here
    run = getattr(engine, "greedy_run", None) if isinstance(rule, Greedy) else None
    if planner.plan(0, n_tokens) is None:
        return res
    t0 = time.perf_counter_ns()
    res.tokens.append(rule.first(engine.forward(obs, (), 0)[-1]))  # prefill: position 0 is the observation
    res.target_passes += 1
    planner.record("prefill", 0, time.perf_counter_ns() - t0)
    while len(res.tokens) < n_tokens:
        n = len(res.tokens)
        k = planner.plan(n, n_tokens - n)
        if k is None:
            return res
        k = min(k, n_tokens - n - 1) if drafter is not None else 0
        if k == 0 and run is not None and (m := planner.plain_passes(n, n_tokens - n)) > 1:
            t0 = time.perf_counter_ns()
            res.tokens.extend(run(res.tokens, m))  # m target passes: the same tokens as m passes below
            planner.record_plain(m, time.perf_counter_ns() - t0)
            res.target_passes += m
            if on_commit is not None:
                on_commit(res.tokens)
            continue
        t0 = time.perf_counter_ns()
        drafts, q = rule.draft(drafter, res.tokens, k) if k > 0 else ([], None)
        t1 = time.perf_counter_ns()
        # verify: the last committed token and the drafts at positions n..n+k; row i predicts token n + i
        logits = engine.forward(None, (res.tokens[-1], *drafts), n)
        accepted, token = rule.accept(drafts, q, logits)
        if k:  # a pass without drafts drafted nothing, in no time
            planner.record("draft", k, t1 - t0)
        planner.record("verify", k, time.perf_counter_ns() - t1)
        planner.record("accepted", k, accepted)
        engine.rollback(n + 1 + accepted)  # positions past the committed prefix held rejected drafts
        res.tokens.extend(drafts[:accepted])
        res.tokens.append(token)  # the target's correction, or its bonus token
        res.target_passes += 1
        res.drafted += k
        res.accepted += accepted
        if on_commit is not None:
            on_commit(res.tokens)
    res.complete = True
    return res
