"""Target-only stretches run back to back in one engine call (Engine.greedy_run, core/speculative.py): the same
tokens as pass by pass, the deadline and the row rule kept, the first row published on its own, and the planner's
bookkeeping the same as for as many single passes."""
import numpy as np
import pytest

from edgeinfer.core.adaptive import SpeculationChooser
from edgeinfer.core.scheduler import SchedulerConfig, TickPlanner
from edgeinfer.core.speculative import FixedK, speculative_decode


def _planner(monkeypatch, t, row_tokens=6, pass_ns=1_000_000):
    """A target-only planner on the injected clock t[0] (budget 10 ms, no margin) whose passes cost pass_ns."""
    monkeypatch.setattr("edgeinfer.core.scheduler.time.perf_counter_ns", lambda: t[0])
    p = TickPlanner(SchedulerConfig(budget_ms=10.0, margin_ms=0.0, k_max=0, adaptive=False), (),
                    row_tokens=row_tokens)
    p.latency.clock = lambda: t[0]
    for _ in range(8):
        p.latency.record("verify", 0, pass_ns)
    p.choose()
    return p


class _RunEngine:
    """A target whose greedy token at position i is i % 5 (n_bins 8); every pass takes 1 ms of t[0], in forward or
    in greedy_run (which records each run's length)."""

    def __init__(self, t):
        self.t, self.runs = t, []

    def forward(self, obs, tokens, start):
        self.t[0] += 1_000_000
        logits = np.zeros((max(1, len(tokens)), 8), dtype=np.float32)
        logits[np.arange(len(logits)), (start + np.arange(len(logits))) % 5] = 1.0
        return logits

    def greedy_run(self, committed, m):
        self.t[0] += m * 1_000_000
        self.runs.append(m)
        return [(len(committed) + i) % 5 for i in range(m)]

    def rollback(self, n):
        pass


def test_plain_passes_run_to_the_next_row_boundary_within_the_deadline(monkeypatch):
    t = [0]
    p = _planner(monkeypatch, t)
    p.start(0)
    t[0] = 1_000_000  # 9 ms left: nine 1 ms passes
    assert p.plain_passes(committed=1, remaining=47) == 5  # the first row ends at 6 tokens: published on its own
    assert p.plain_passes(committed=6, remaining=42) == 6  # one row per run: plan() checks the deadline per row
    assert p.plain_passes(committed=44, remaining=4) == 4  # the last row
    t[0] = 6_500_000  # 3.5 ms left: the row's 6 passes do not fit
    assert p.plain_passes(committed=6, remaining=42) == 1  # pass by pass, as plan() decides
    p.unlimited()
    assert p.plain_passes(committed=6, remaining=42) == 6
    # a chunk that speculates plans pass by pass
    q = TickPlanner(SchedulerConfig(k_max=4, adaptive=False), ["d"], row_tokens=6)
    q.choose()
    q.unlimited()
    assert q.plain_passes(committed=6, remaining=42) == 1
    assert FixedK(0).plain_passes(6, 42) == 42 and FixedK(4).plain_passes(6, 42) == 1


def test_a_run_overshoots_its_deadline_by_one_row_at_most_when_the_engine_slows_down(monkeypatch):
    """The cost estimate says 0.1 ms per pass, the engine now takes 1 ms: runs of one row each, the deadline checked
    before each, so a 10 ms budget ends after the row that crossed it, not after the whole chunk."""
    t = [0]
    p = _planner(monkeypatch, t, row_tokens=6, pass_ns=100_000)
    p.start(0)
    res = speculative_decode(_RunEngine(t), np.zeros(3, np.float32), 48, None, p)
    # the first row ran as one run at the stale cost; then its measured cost leaves pass-by-pass planning, which
    # stops at the deadline (the runtime cuts the chunk at its last whole row)
    assert len(res.tokens) <= 12 and not res.complete and t[0] <= 10_000_000 + 6 * 1_000_000


def test_a_budgeted_decode_runs_plain_stretches_with_the_tokens_and_stop_of_single_passes(monkeypatch):
    t = [0]
    out = {}
    for runs in (True, False):
        p = _planner(monkeypatch, t, row_tokens=4)
        t[0] = 0
        p.start(0)
        engine, committed_sizes = _RunEngine(t), []
        if not runs:
            engine.greedy_run = None  # pass by pass
        res = speculative_decode(engine, np.zeros(3, np.float32), 24, None, p,
                                 on_commit=lambda tokens: committed_sizes.append(len(tokens)))
        out[runs] = (res.tokens, res.complete, res.target_passes, t[0], 4 in committed_sizes, engine.runs)
    # 10 ms: the prefill, the rest of the first row in one run (published at 4 tokens), one run to the row that
    # ends at 8 tokens by 8 ms; the next row cannot be completed in the 2 ms left (the row rule): pass by pass, the
    # same tokens and the same stop
    tokens, complete, passes, t_end, first, runs = out[True]
    assert (tokens, complete, passes, t_end, first) == out[False][:5]
    assert tokens == [i % 5 for i in range(8)] and (complete, passes, t_end, first) == (False, 8, 8_000_000, True)
    assert runs == [3, 4]


def test_record_plain_books_what_as_many_single_passes_would():
    a, b = SpeculationChooser(["d"], 4, 8), SpeculationChooser(["d"], 4, 8)
    for c in (a, b):
        c.record(None, "prefill", 0, 100_000)
    for _ in range(5):
        a.record(None, "verify", 0, 50_000)
        a.record(None, "accepted", 0, 0)
    b.record_plain(5, 50_000)
    assert a._chunk_tokens == b._chunk_tokens == 6
    assert a._chunk_cost == pytest.approx(b._chunk_cost) == pytest.approx(3.5)
    assert a._median(("verify", None, 0)) == b._median(("verify", None, 0)) == 0.5


def test_the_fused_engine_greedy_run_gives_the_tokens_of_single_passes():
    pytest.importorskip("numba")
    from edgeinfer.engines.backends.build import load_engine
    from edgeinfer.engines.models.policy import load_policy

    policy = load_policy()
    engine = load_engine(policy, "fused", "fp32", "cpu", 1)
    rng = np.random.default_rng(0)
    n = policy.cfg.n_tokens
    for _ in range(5):
        obs = rng.standard_normal(policy.cfg.obs_dim).astype(np.float32)
        single = speculative_decode(engine, obs, n, None, FixedK(0), on_commit=None)
        engine.greedy_run = None  # the attribute hides the method: pass by pass
        by_pass = speculative_decode(engine, obs, n, None, FixedK(0)).tokens
        del engine.greedy_run
        assert single.tokens == by_pass and single.target_passes == n
        engine.forward(obs, (), 0)
        assert engine.greedy_run(by_pass[:7], 10) == by_pass[7:17]
    with pytest.raises(ValueError, match="does not fit"):
        engine.greedy_run(by_pass[:40], 10)
