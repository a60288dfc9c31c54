"""Drafters that lose, for the stress rows of `edgeinfer bench spec`: wrappers around a real drafter.

    slow        the real drafter, every proposal taking `cost_ms` more (a sleep: it does not take a core from
                the target): the well-distilled draft model that is too slow to pay
    useless     random tokens, seeded per chunk: (almost) never kept
    collapsing  the real drafter until `collapsed` is set (the bench sets it halfway through the held-out
                chunks), random tokens after: acceptance that collapses mid-run

Greedy output is the target's whatever a drafter proposes (edgeinfer.core.speculative), so these change the
speed only; adaptive speculation (edgeinfer.core.adaptive) has to notice and keep its probes cheap.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from edgeinfer.core.protocols import Drafter
from edgeinfer.engines.models.drafters import one_hot


class SlowDrafter:
    """`inner`'s proposals, each cost_ms (> 0) slower."""

    name = "slow"

    def __init__(self, inner: Drafter, cost_ms: float = 12.0):
        if not cost_ms > 0:
            raise ValueError(f"SlowDrafter.cost_ms must be > 0, got {cost_ms}")
        self.inner, self.cost_s = inner, cost_ms / 1e3
        self.label = f"slow ({inner.name} +{cost_ms:g} ms a proposal)"  # what a report calls it

    def reset(self, q_rad, qd_rad_s, q_prev_rad) -> None:
        self.inner.reset(q_rad, qd_rad_s, q_prev_rad)

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        time.sleep(self.cost_s)
        return self.inner.propose(tokens, k)

    def propose_dist(self, tokens, k, warp, rng):
        time.sleep(self.cost_s)
        return self.inner.propose_dist(tokens, k, warp, rng)


class RandomDrafter:
    """Uniformly random tokens in 0..n_bins-1, from a generator re-seeded by every reset (the same proposals
    for the same chunk: the bench's repeated decodes of a chunk do the same work)."""

    name = "useless"

    label = "useless (random tokens)"

    def __init__(self, n_bins: int, seed: int = 0):
        self.n_bins, self.seed = n_bins, seed
        self.rng = np.random.default_rng(seed)

    def reset(self, q_rad, qd_rad_s, q_prev_rad) -> None:
        self.rng = np.random.default_rng(self.seed)

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        return self.rng.integers(0, self.n_bins, k).tolist()

    def propose_dist(self, tokens, k, warp, rng):
        drafts = self.propose(tokens, k)
        return drafts, one_hot(drafts, self.n_bins)


class CollapsingDrafter:
    """`good` until `collapsed` is set, then `useless` (both reset every chunk)."""

    name = "collapsing"

    def __init__(self, good: Drafter, useless: Drafter):
        self.good, self.useless = good, useless
        self.collapsed = False
        self.label = f"collapsing ({good.name}, then {useless.name})"

    def _now(self) -> Drafter:
        return self.useless if self.collapsed else self.good

    def reset(self, q_rad, qd_rad_s, q_prev_rad) -> None:
        self.good.reset(q_rad, qd_rad_s, q_prev_rad)
        self.useless.reset(q_rad, qd_rad_s, q_prev_rad)

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        return self._now().propose(tokens, k)

    def propose_dist(self, tokens, k, warp, rng):
        return self._now().propose_dist(tokens, k, warp, rng)


def stress_drafters(good: Callable[[], Drafter], n_bins: int, slow_ms: float = 12.0) -> dict[str, Drafter]:
    """{"slow", "useless", "collapsing"}, in that order; good() makes the real drafter each wraps (its own)."""
    return {"slow": SlowDrafter(good(), slow_ms), "useless": RandomDrafter(n_bins),
            "collapsing": CollapsingDrafter(good(), RandomDrafter(n_bins, seed=1))}
