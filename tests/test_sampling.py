"""Speculative sampling is exact in distribution: a chi-square test over 30k seeded samples against the
target's own distribution, computed exactly by enumeration, with a deliberately wrong rule that must fail.

The target and drafter here are small Markov models over 4 action bins (logits depend on the position and
the token fed there), so the exact distribution of every 4-token sequence is known; they implement the
Engine and Drafter protocols, so the code under test is the real decoder and the real acceptance rule.
"""
import itertools

import numpy as np
import pytest

from edgeinfer.core.acceptance import Greedy, Relaxed, Sampling, softmax
from edgeinfer.core.speculative import FixedK, speculative_decode

pytestmark = pytest.mark.background  # CPU-bound, no real-time bound (tests/conftest.py)

N_BINS, N_TOKENS = 4, 4
# samples per chi-square test: at 20k the wrong rule below already gives p = 0.0 (float64 underflow) and the
# right one p > 0.8 for three seeds; 30k keeps a margin
N_SAMPLES = 30_000


class MarkovEngine:
    """logits for position 0 from the observation; for position p >= 1 from the token fed there."""

    def __init__(self, seed, scale=1.5):
        rng = np.random.default_rng(seed)
        self.first = rng.normal(0, scale, N_BINS)
        self.table = rng.normal(0, scale, (N_TOKENS + 1, N_BINS, N_BINS))  # [position, fed token] -> logits

    def forward(self, obs, tokens, start):
        rows = [self.first] if start == 0 else []
        rows += [self.table[start + i + (start == 0), t] for i, t in enumerate(tokens)]
        return np.array(rows)

    def rollback(self, n):
        pass

    def next_logits(self, prefix):
        return self.first if not prefix else self.table[len(prefix), prefix[-1]]


class MarkovDrafter:
    name = "markov"

    def __init__(self, engine):
        self.engine = engine

    def reset(self, *args):
        pass

    def propose(self, tokens, k):
        out = list(tokens)
        for _ in range(k):
            out.append(int(self.engine.next_logits(out).argmax()))
        return out[len(tokens):]

    def propose_dist(self, tokens, k, warp, rng):
        out, qs = list(tokens), []
        for _ in range(k):
            q = softmax(warp(self.engine.next_logits(out)))
            out.append(int(rng.choice(N_BINS, p=q)))
            qs.append(q)
        return out[len(tokens):], np.array(qs)



class WrongResidual(Sampling):
    """A deliberately wrong rule: on rejection, resample from p instead of norm(max(0, p - q))."""

    def accept(self, drafts, q, logits):
        p = self.probs(logits)
        for i, x in enumerate(drafts):
            if self.rng.random() * q[i, x] >= p[i, x]:
                return i, self._sample(p[i])
        return len(drafts), self._sample(p[len(drafts)])


def exact_distribution(target, rule):
    """P(sequence) for all N_BINS ** N_TOKENS sequences under target-only sampling with the rule's warp."""
    seqs = list(itertools.product(range(N_BINS), repeat=N_TOKENS))
    probs = []
    for s in seqs:
        prob = 1.0
        for i in range(N_TOKENS):
            prob *= rule.probs(target.next_logits(list(s[:i])))[s[i]]
        probs.append(prob)
    return seqs, np.array(probs)


def sample_counts(target, drafter, rule, n, k):
    index = {s: i for i, s in enumerate(itertools.product(range(N_BINS), repeat=N_TOKENS))}
    counts = np.zeros(len(index))
    accepted = drafted = 0
    for _ in range(n):
        res = speculative_decode(target, np.zeros(1), N_TOKENS, drafter, FixedK(k), rule)
        counts[index[tuple(res.tokens)]] += 1
        accepted, drafted = accepted + res.accepted, drafted + res.drafted
    return counts, accepted / drafted


@pytest.mark.parametrize("temperature,top_p,k", [(1.0, 1.0, 3), (0.7, 0.8, 2)])
def test_speculative_sampling_matches_the_target_distribution(temperature, top_p, k):
    from scipy.stats import chisquare  # here, not at collection: scipy.stats takes 0.4 s to import

    target, draft_model = MarkovEngine(0), MarkovEngine(1)  # a different model: many rejections
    rule = Sampling(temperature, top_p, seed=42)
    _, expected = exact_distribution(target, rule)
    counts, acceptance = sample_counts(target, MarkovDrafter(draft_model), rule, N_SAMPLES, k)
    assert 0.1 < acceptance < 0.9  # both branches of the rule are exercised
    support = expected > 0
    assert counts[~support].sum() == 0  # top-p: nothing outside the nucleus is ever produced
    p_value = chisquare(counts[support], expected[support] * counts.sum()).pvalue
    assert p_value > 1e-3, f"p-value {p_value:.2e}"


def test_a_wrong_residual_fails_the_same_test():
    from scipy.stats import chisquare  # here, not at collection: scipy.stats takes 0.4 s to import

    target, draft_model = MarkovEngine(0), MarkovEngine(1)
    rule = WrongResidual(seed=42)
    _, expected = exact_distribution(target, rule)
    counts, _ = sample_counts(target, MarkovDrafter(draft_model), rule, N_SAMPLES, 3)
    assert chisquare(counts, expected * counts.sum()).pvalue < 1e-6


def test_sampling_is_reproducible_from_its_seed():
    target, drafter = MarkovEngine(0), MarkovDrafter(MarkovEngine(1))
    runs = [[speculative_decode(target, np.zeros(1), N_TOKENS, drafter, FixedK(2), rule).tokens for _ in range(50)]
            for rule in (Sampling(seed=7), Sampling(seed=7), Sampling(seed=8))]
    assert runs[0] == runs[1] != runs[2]


def test_relaxed_acceptance_is_lossy_and_greedy_is_not():
    assert Relaxed(1).lossy and not Greedy().lossy and not Sampling().lossy
    logits = np.eye(N_BINS)[[1, 2, 3]] * 5.0  # the target's choices: 1, 2, 3
    assert Greedy().accept([1, 2], None, logits) == (2, 3)
    assert Greedy().accept([1, 3], None, logits) == (1, 2)
    assert Relaxed(1).accept([0, 3], None, logits) == (2, 3)  # within one bin of 1 and of 2
    assert Relaxed(1).accept([3, 3], None, logits) == (0, 1)
    with pytest.raises(ValueError, match="Relaxed.bins"):
        Relaxed(-1)
    with pytest.raises(ValueError, match="Sampling.top_p"):
        Sampling(top_p=0.0)
