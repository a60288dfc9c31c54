"""Probes of a drafter that is not running: a few speculative passes inside an otherwise target-only chunk, and at
most probe_share of the decode time whatever the drafter costs. Driven through the real decode loop
(speculative_decode, TickPlanner, greedy acceptance) on an injected clock: a fake target whose passes cost
PASS_NS, fake drafters whose proposals cost what each test says."""
import numpy as np
import pytest

from edgeinfer.core import speculative
from edgeinfer.core.acceptance import Greedy
from edgeinfer.core.scheduler import SchedulerConfig, TickPlanner

PASS_NS = 200_000  # one target pass over one token: a 48-token target-only chunk is 9.6 ms
PER_DRAFT_NS = 5_000  # a verify pass costs this much more per draft it checks
N_TOKENS, N_BINS = 48, 32
EXPLORATION = 6  # chunks: k = 1, 2, 4, 8, 16, then one target-only


class Clock:
    """Stands in for the `time` module of edgeinfer.core.speculative: nanoseconds the fakes have spent."""

    def __init__(self):
        self.ns = 0

    def perf_counter_ns(self) -> int:
        return self.ns


class Target:
    """A fake target engine: its greedy tokens for the chunk are `tokens`; every pass advances the clock (the
    chunk's first verify pass by stall_ns more: the host stalled)."""

    def __init__(self, clock: Clock):
        self.clock, self.tokens, self.stall_ns = clock, [], 0

    def forward(self, obs, tokens, start):
        rows = max(1, len(tokens))
        self.clock.ns += PASS_NS + PER_DRAFT_NS * (rows - 1) + self.stall_ns * (start > 0)
        self.stall_ns *= start == 0
        logits = np.zeros((rows, N_BINS), np.float32)
        logits[np.arange(rows), self.tokens[start:start + rows]] = 1.0
        return logits

    def rollback(self, n):
        pass


class Drafter:
    """Proposes the target's own next tokens, the first keeps(chunk) of each pass right and the rest wrong
    (keeps None: random tokens, a useless drafter); each proposal costs cost_ns. Counts its proposals."""

    name = "d"

    def __init__(self, target: Target, cost_ns: int, keeps, seed: int = 0):
        self.target, self.cost_ns, self.keeps = target, cost_ns, keeps
        self.rng = np.random.default_rng(seed)
        self.chunk = self.proposals = 0

    def reset(self, *observation):
        pass

    def propose(self, tokens, k):
        self.target.clock.ns += self.cost_ns
        self.proposals += 1
        good = self.keeps(self.chunk) if self.keeps is not None else 0
        truth = self.target.tokens[len(tokens):len(tokens) + k]
        if self.keeps is None:
            return self.rng.integers(0, N_BINS, k).tolist()
        return [t if i < good else (t + 1) % N_BINS for i, t in enumerate(truth)]


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(speculative, "time", c)
    return c


def _decode(clock, chunks: int, drafter_cost_ns: int, keeps, probe_every: int = 32, stalls=(), **cfg):
    """Decode `chunks` chunks with one drafter under the adaptive planner (stalls: chunks whose first verify
    pass stalls 100 ms). Returns (planner, per chunk: (drafter proposals, ns, target passes)); every chunk is
    checked token-identical to the target's own tokens."""
    target = Target(clock)
    drafter = Drafter(target, drafter_cost_ns, keeps)
    planner = TickPlanner(SchedulerConfig(k_max=16, probe_every=probe_every, **cfg), ["d"])
    planner.unlimited()
    rng = np.random.default_rng(1)
    out = []
    for c in range(chunks):
        drafter.chunk, proposals, t0 = c, drafter.proposals, clock.ns
        target.tokens = rng.integers(0, N_BINS, N_TOKENS).tolist()
        target.stall_ns = 100_000_000 * (c in stalls)
        chosen = planner.choose()
        res = speculative.speculative_decode(target, np.zeros(3, np.float32), N_TOKENS,
                                             drafter if chosen else None, planner, Greedy())
        assert res.tokens == target.tokens  # greedy: exactly the target's tokens, whatever was chosen
        out.append((drafter.proposals - proposals, clock.ns - t0, res.target_passes))
    return planner, out


def test_a_probe_is_a_few_passes_of_an_otherwise_target_only_chunk(clock):
    # 12 ms proposals (60 target passes) that keep 3 drafts each: far too slow to pay, so speculation is off
    planner, chunks = _decode(clock, 1000, 12_000_000, lambda c: 3)
    probes = [(n, passes) for n, _, passes in chunks[EXPLORATION:] if n]
    # each probe: at most probe_passes (4) passes speculate, each committing 4 tokens; the rest is target-only
    assert len(probes) >= 2 and all(n <= 4 and passes >= N_TOKENS - 4 * 3 for n, passes in probes)
    assert planner.chooser.probes == len(probes)  # counted


def test_a_slow_drafter_never_takes_more_than_probe_share_of_the_decode_time(clock):
    # a whole chunk of this drafter costs 12 passes x 12 ms, 15x a target-only chunk (9.6 ms)
    _, chunks = _decode(clock, 1000, 12_000_000, lambda c: 3)
    after = chunks[EXPLORATION:]
    target_only_ns = len(after) * (PASS_NS * N_TOKENS)
    proposals = sum(n for n, _, _ in after)
    assert proposals * 12_000_000 <= 0.015 * target_only_ns  # 8 proposals (96 ms) in 994 chunks (9.5 s)
    assert sum(ns for _, ns, _ in after) <= 1.015 * target_only_ns
    for start in range(0, len(after) - 400, 50):  # and never in a burst: any 400 chunks hold one probe at most
        assert sum(n > 0 for n, _, _ in after[start:start + 400]) <= 1


def test_a_useless_cheap_drafter_is_probed_every_probe_every_chunks_for_almost_nothing(clock):
    planner, chunks = _decode(clock, EXPLORATION + 320, 10_000, None)
    after = chunks[EXPLORATION:]
    probed = [c for c, (n, _, _) in enumerate(after) if n]
    assert len(probed) == 10 and set(np.diff(probed)) == {32}  # cheap probes: no backing off
    assert all(n <= 4 for n, _, _ in after)
    assert sum(ns for _, ns, _ in after) <= 1.01 * len(after) * PASS_NS * N_TOKENS


def test_acceptance_that_collapses_costs_a_chunk_and_a_probe_finds_it_again(clock):
    # a good cheap drafter (keeps 6 of each pass's drafts) for 100 chunks, useless for 100, then good again
    planner, chunks = _decode(clock, 300, 10_000, lambda c: 6 if c < 100 or c >= 200 else 0)
    assert all(passes < 20 for _, _, passes in chunks[EXPLORATION:100])  # speculating: ~7 tokens per pass
    collapsed = chunks[101:200]  # the chunk it collapses in speculates throughout; after it, only probes
    assert all(n <= 4 for n, _, _ in collapsed)
    assert sum(ns for _, ns, _ in collapsed) <= 1.01 * len(collapsed) * PASS_NS * N_TOKENS
    # good again: the next probe (within probe_every chunks) sees it pay, and the chunk after runs it
    assert all(passes < 20 for _, _, passes in chunks[200 + 32 + 2:])


def test_a_stalled_pass_is_not_taken_for_a_drafter_that_stopped_paying(clock):
    # a good cheap drafter; in chunk 50 the host stalls 100 ms (ten chunks' time) in one pass
    _, chunks = _decode(clock, 90, 10_000, lambda c: 6, stalls={50})
    assert chunks[50][1] > 100_000_000
    assert all(passes < 20 for _, _, passes in chunks[EXPLORATION:])  # speculating throughout


def test_probe_settings_are_checked():
    with pytest.raises(ValueError, match="probe_passes"):
        SchedulerConfig(probe_passes=0)
    with pytest.raises(ValueError, match="probe_share"):
        SchedulerConfig(probe_share=0)
