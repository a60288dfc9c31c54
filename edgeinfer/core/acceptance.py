"""Acceptance rules of speculative decoding: which drafts a target pass keeps, and the token it adds.

A rule sees the target's logits over the k+1 positions of a verify pass (the last committed token, then the
k drafts) and returns (number of drafts accepted, the next token): the correction at the first rejected
draft, or a bonus token after k accepted ones. One target pass therefore commits accepted + 1 tokens.

    Greedy     exact: draft i kept iff it equals the target's argmax at its position (Leviathan et al. 2023,
               arXiv 2211.17192, temperature 0). Output token-identical to target-only greedy decoding.
    Relaxed    LOSSY, opt-in: draft i kept iff it is within `bins` bins of the target's argmax (action
               tokens are ordered bins of a joint's motion, so a near bin is a near action). Not exact.
    Sampling   exact in distribution (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023, arXiv
               2302.01318): draft x ~ q kept with probability min(1, p(x) / q(x)); at the first rejection
               the next token is drawn from norm(max(0, p - q)); after k acceptances a bonus token from p.
               p and q are the target's and the drafter's distributions after the same temperature and
               top-p warp. Every committed token is distributed exactly as target-only sampling's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from edgeinfer.core.protocols import Drafter


class Greedy:
    """Exact greedy acceptance. lossy = False."""

    lossy = False

    def first(self, logits: np.ndarray) -> int:
        """The token for logits (n_bins,) of the prefill pass."""
        return int(logits.argmax())

    def draft(self, drafter: Drafter, tokens: Sequence[int], k: int) -> tuple[list[int], np.ndarray | None]:
        return drafter.propose(tokens, k), None

    def accept(self, drafts: list[int], q: np.ndarray | None, logits: np.ndarray) -> tuple[int, int]:
        """drafts (k), logits (k+1, n_bins) -> (accepted, next token)."""
        choices = logits.argmax(-1)
        accepted = 0
        while accepted < len(drafts) and self._keeps(drafts[accepted], int(choices[accepted])):
            accepted += 1
        return accepted, int(choices[accepted])

    def _keeps(self, draft: int, choice: int) -> bool:
        return draft == choice


@dataclass
class Relaxed(Greedy):
    """LOSSY greedy acceptance within +/- `bins` bins of the target's choice (bins >= 0; 0 is Greedy)."""

    bins: int = 1
    lossy = True

    def __post_init__(self):
        if self.bins < 0:
            raise ValueError(f"Relaxed.bins must be >= 0, got {self.bins}")

    def _keeps(self, draft: int, choice: int) -> bool:
        return abs(draft - choice) <= self.bins


@dataclass
class Sampling:
    """Exact speculative sampling. temperature > 0; top_p in (0, 1] (nucleus sampling, Holtzman et al. 2020,
    arXiv 1904.09751); seed: the numpy Generator all random draws come from (reproducible)."""

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    lossy = False
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(f"Sampling.temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"Sampling.top_p must be in (0, 1], got {self.top_p}")
        self.rng = np.random.default_rng(self.seed)

    def warp(self, logits: np.ndarray) -> np.ndarray:
        """Temperature then top-p over the last axis: logits (..., n_bins) -> logits with -inf outside the
        smallest set of most likely tokens whose probability reaches top_p."""
        z = np.asarray(logits, dtype=np.float64) / self.temperature
        if self.top_p < 1:
            p = softmax(z)
            order = np.argsort(-p, axis=-1, kind="stable")
            sorted_p = np.take_along_axis(p, order, -1)
            cut = np.cumsum(sorted_p, -1) - sorted_p >= self.top_p  # mass before this token already enough
            drop = np.zeros_like(cut)
            np.put_along_axis(drop, order, cut, -1)
            z = np.where(drop, -np.inf, z)
        return z

    def probs(self, logits: np.ndarray) -> np.ndarray:
        return softmax(self.warp(logits))

    def first(self, logits: np.ndarray) -> int:
        return self._sample(self.probs(logits))

    def draft(self, drafter: Drafter, tokens: Sequence[int], k: int) -> tuple[list[int], np.ndarray]:
        return drafter.propose_dist(tokens, k, self.warp, self.rng)

    def accept(self, drafts: list[int], q: np.ndarray, logits: np.ndarray) -> tuple[int, int]:
        p = self.probs(logits)  # (k+1, n_bins)
        for i, x in enumerate(drafts):
            if self.rng.random() * q[i, x] < p[i, x]:  # u < p/q without dividing by q = 0
                continue
            residual = np.maximum(p[i] - q[i], 0.0)
            total = residual.sum()
            return i, self._sample(residual / total if total > 0 else p[i])
        return len(drafts), self._sample(p[len(drafts)])

    def _sample(self, p: np.ndarray) -> int:
        return int(np.searchsorted(np.cumsum(p), self.rng.random() * p.sum(), side="right").clip(0, len(p) - 1))


def softmax(z: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, float64; -inf entries get probability 0."""
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)
