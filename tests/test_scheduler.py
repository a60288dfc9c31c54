"""Adaptive speculation: drafter and k chosen for expected tokens per second from measured costs and acceptance."""
import numpy as np
import pytest

from edgeinfer.core.adaptive import AcceptanceModel, SpeculationChooser, expected_tokens
from edgeinfer.core.scheduler import SchedulerConfig, TickPlanner

PREFILL_US = 400


def _run(draft_us, verify_us, accept_rate, drafters=("d",), k_max=8, chunks=120, probe_every=32, slowdown=None):
    """A planner driven through `chunks` chunks of 6 passes at its own choices (each pass's k from plan(): a probe
    speculates for its first passes only). draft_us[name](k), verify_us(k): costs in us; accept_rate[name]: each
    pass keeps a deterministic pseudo-random run of drafts at about that rate. slowdown(chunk) scales every cost
    of a chunk (a shared machine). Returns (planner, choices: the chunk's (drafter, k))."""
    p = TickPlanner(SchedulerConfig(k_max=k_max, probe_every=probe_every), list(drafters))
    p.unlimited()
    choices = []
    for c in range(chunks):
        name = p.choose()
        k = p._chunk_k
        choices.append((name, k))
        scale = slowdown(c) if slowdown else 1.0
        p.record("prefill", 0, int(PREFILL_US * scale * 1e3))
        for i in range(6):
            k = p.plan(24 + i, 24)  # mid-chunk: where a probe speculates
            p.record("draft", k, int(draft_us[name](k) * scale * 1e3) if name else 0)
            p.record("verify", k, int(verify_us(k) * scale * 1e3))
            run = 0
            while name and run < k and ((c * 37 + i * 11 + run * 3) % 100) < accept_rate[name] * 100:
                run += 1
            p.record("accepted", k, run)
    return p, choices


def test_expected_tokens_formula():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_expected_tokens_follow_the_kept_runs_not_an_independence_assumption():
    m = AcceptanceModel(k_max=8, prior_weight=1e-9)
    for _ in range(30):
        m.record(8, 8)  # bursts: all eight kept
        m.record(8, 0)  # or none
    s = m.survival()
    assert s == pytest.approx([0.5] * 8)  # half the passes keep every draft: S(j) = 0.5 for all j
    assert m.expected_tokens()[8] == pytest.approx(1 + 8 * 0.5)
    assert m.rate() == pytest.approx(0.5)
    # an independence model with the same rate predicts far less from long speculation
    assert expected_tokens(0.5, 8) < 2.0 < m.expected_tokens()[8]


def test_truncated_passes_only_say_the_run_was_at_least_k():
    m = AcceptanceModel(k_max=4, prior_weight=1e-9)
    for _ in range(20):
        m.record(2, 2)  # kept both: the run is >= 2, nothing known about draft 3
        m.record(4, 1)
    s = m.survival()
    assert s[0] == pytest.approx(1.0) and s[1] == pytest.approx(0.5)  # 40 tested at j=1, all kept; 20 of 40 at j=2
    assert s[2] == pytest.approx(0.25)  # no pass tested a third draft: the prior 0.5 of a step, nothing more


def test_exploration_tries_each_drafter_at_a_few_k_first():
    cheap = {"a": lambda k: 1, "b": lambda k: 1}
    _, choices = _run(cheap, lambda k: 400 + 10 * k, {"a": 0.5, "b": 0.5}, drafters=("a", "b"), chunks=14)
    assert choices[:9] == [(d, k) for d in "ab" for k in (1, 2, 4, 8)] + [(None, 0)]  # k_max = 8; then target-only
    assert all(k > 0 for _, k in choices[9:])  # both pay (equal drafters): speculation stays on


def test_cheap_drafts_and_high_acceptance_speculate_deeply():
    _, choices = _run({"d": lambda k: 2 * k}, lambda k: 400 + 10 * k, {"d": 0.8})
    assert all(k >= 5 for _, k in choices[60:])


def test_speculation_turns_off_when_it_does_not_pay():
    # drafts as expensive as a target pass and rarely accepted: target-only is faster
    _, choices = _run({"d": lambda k: 400 * k}, lambda k: 400 + 10 * k, {"d": 0.1}, chunks=140)
    late = [k for _, k in choices[40:]]
    assert late.count(0) >= 95 and 1 <= sum(k > 0 for k in late) <= 4  # off, with a probe every 32 chunks


def test_a_drafter_whose_drafts_stop_being_kept_is_turned_off_within_a_chunk_or_two():
    # 80 chunks of smooth motion (8 in 10 drafts kept), then the motion changes and none is kept: the
    # acceptance model still remembers 256 good passes, the realized cost per token says target-only is faster
    rates = iter([0.8] * 80 + [0.0] * 40)
    p = TickPlanner(SchedulerConfig(k_max=8), ["d"])
    p.unlimited()
    choices = []
    for c, rate in enumerate(rates):
        name = p.choose()
        k = p._chunk_k
        choices.append(k)
        p.record("prefill", 0, PREFILL_US * 1000)
        for i in range(6):
            k = p.plan(24 + i, 24)  # mid-chunk: where a probe speculates
            p.record("draft", k, 100_000 * k if name else 0)
            p.record("verify", k, (PREFILL_US + 10 * k) * 1000)
            kept = k if name and (c * 7 + i) % 10 < rate * 10 else 0
            p.record("accepted", k, kept)
    assert all(k >= 2 for k in choices[20:80])  # drafts kept: deep speculation
    assert p.chooser.acceptance["d"].expected_tokens()[8] > 2  # the model still expects drafts to be kept ...
    late = choices[82:]
    assert late.count(0) >= len(late) - 2  # ... but speculation is off, and only probed


def test_the_choice_maximises_expected_tokens_per_second():
    draft, verify = (lambda k: 30 * k), (lambda k: 400 + 40 * k)
    p, choices = _run({"d": draft}, verify, {"d": 0.6})
    tokens = p.chooser.acceptance["d"].expected_tokens()
    best = max(range(9), key=lambda k: tokens[k] / (draft(k) + verify(k)))
    assert choices[-1] == ("d", best)


def test_the_better_drafter_wins_and_a_useless_one_is_only_probed():
    drafts = {"model": lambda k: 120, "useless": lambda k: 300}
    _, choices = _run(drafts, lambda k: 400 + 15 * k, {"model": 0.8, "useless": 0.0}, drafters=("useless", "model"))
    late = [d for d, _ in choices[40:]]
    assert late.count("model") >= 75 and late.count("useless") <= 3


def test_probing_a_drafter_while_another_runs_counts_the_speculation_it_displaces():
    # a probe chunk of "useless" is target-only but for its 4 passes: it gives up the running drafter's gain
    # for the chunk (7 tokens for ~7 prefills instead of ~45 for ~9), and that is what the probe is charged,
    # so probes of it take 1 % of the decode time, every ~65 chunks, not every probe_every (16)
    drafts = {"model": lambda k: 10, "useless": lambda k: 10}
    p, choices = _run(drafts, lambda k: 400 + 15 * k, {"model": 0.9, "useless": 0.0}, drafters=("useless", "model"),
                      chunks=400, probe_every=16)
    probes = [c for c, (d, _) in enumerate(choices) if d == "useless" and c >= 10]  # after exploration
    assert p.chooser._probe_cost["useless"] > 5  # in prefills: the chunk's ~7, less 7 tokens at "model"'s ~0.18
    assert len(probes) >= 5 and min(np.diff(probes)) >= 60


def test_the_choice_survives_a_machine_that_slows_down_and_speeds_up():
    # every cost x1..x3 from chunk to chunk (other work on the machine): the ratio to the prefill does not move
    rng = np.random.default_rng(0)
    steady = _run({"d": lambda k: 30}, lambda k: 400 + 40 * k, {"d": 0.7})[1][-40:]
    noisy = _run({"d": lambda k: 30}, lambda k: 400 + 40 * k, {"d": 0.7}, slowdown=lambda c: rng.uniform(1, 3))[1][-40:]
    assert [k for _, k in noisy] == [k for _, k in steady]


def test_costs_relative_to_the_prefill_interpolate_and_extrapolate():
    c = SpeculationChooser(["d"], k_max=8)
    for _ in range(3):
        c.record("d", "prefill", 0, 1000)
        c.record("d", "verify", 2, 1200)
        c.record("d", "verify", 4, 1400)
        c.record("d", "draft", 2, 300)
    costs = c.pass_costs("d")
    assert costs[0] == pytest.approx(1.0)  # no k = 0 pass measured: a one-token target pass, the prefill
    assert costs[3] == pytest.approx(1.3 + 0.3)  # verify interpolated; drafting flat past k = 2
    assert costs[8] == pytest.approx(1.4 + 4 * 0.1 + 0.3)  # verify grows along its last slope


def test_a_cost_that_dips_with_k_is_noise_and_is_pooled_away():
    c = SpeculationChooser(["d"], k_max=8)
    c.record("d", "prefill", 0, 1000)
    for k, ns, n in ((2, 1200, 1), (4, 1500, 3), (6, 1100, 1), (8, 1800, 1)):  # k = 6 measured once, in a lull
        for _ in range(n):
            c.record("d", "verify", k, ns)
    costs = c.pass_costs("d")
    assert costs[4] == costs[6] == pytest.approx((3 * 1.5 + 1.1) / 4)  # pooled, weighted by samples
    assert list(costs) == sorted(costs) and costs[8] == pytest.approx(1.8)


def test_target_only_never_speculates():
    p = TickPlanner(SchedulerConfig(k_max=0), ["d"])
    p.unlimited()
    assert p.choose() is None
    assert {p.plan(n, 48 - n) for n in range(1, 48)} == {0}


def test_an_estimate_a_stall_inflated_expires_and_the_pass_is_measured_again(monkeypatch):
    """A pass the plan refuses records nothing: without expiry, a few stalled passes would keep the p99 of
    verify above the budget for ever, and every chunk would go out as an unverified draft."""
    t = [0]
    monkeypatch.setattr("edgeinfer.core.scheduler.time.perf_counter_ns", lambda: t[0])
    planner = TickPlanner(SchedulerConfig(budget_ms=10.0, margin_ms=0.0, k_max=0, adaptive=False), drafters=())
    lat = planner.latency
    lat.clock = lambda: t[0]
    for _ in range(200):
        lat.record("verify", 0, 1_000_000)  # 1 ms passes
    for _ in range(5):
        lat.record("verify", 0, 40_000_000)  # a stall: five 40 ms passes
    planner.start(t[0])
    assert planner.plan(committed=1, remaining=5) is None  # p99 40 ms > the 10 ms budget: refused
    t[0] += 4_000_000_000
    planner.start(t[0])
    assert planner.plan(committed=1, remaining=5) is None  # still refused within max_age (5 s)
    t[0] += 1_500_000_000
    planner.start(t[0])
    assert planner.plan(committed=1, remaining=5) == 0  # the stale samples expired: measured again
    lat.record("verify", 0, 1_000_000)
    assert lat.estimate_ns("verify", 0) == 1_000_000  # planned on the fresh sample alone


def test_the_budget_defaults_to_the_time_between_two_chunk_starts():
    # a policy at 20 Hz replanning every tick has 50 ms per chunk, not the Schunk policy's 20 ms: a fixed 20 ms
    # budget sent a trained GR1 policy's every chunk down to the draft rung (speculative) or nothing (target-only)
    cfg = SchedulerConfig()
    assert cfg.resolved_budget_ms(1, 50_000_000) == 50.0
    assert cfg.resolved_budget_ms(5, 4_000_000) == 20.0
    assert SchedulerConfig(budget_ms=7.0).resolved_budget_ms(1, 50_000_000) == 7.0
    with pytest.raises(ValueError, match="margin_ms"):
        SchedulerConfig(margin_ms=0.5).resolved_budget_ms(1, 400_000)  # 0.4 ms: less than the margin
    planner = TickPlanner(cfg)
    planner.set_budget_ms(50.0)
    planner.start(0)
    assert planner.deadline_ns == int((50.0 - cfg.margin_ms) * 1e6)


def _row_planner(monkeypatch, t, k_max=0, row_tokens=6, verify_ns=(1_000_000,), draft_ns=0):
    """A non-adaptive planner on the injected clock t[0] (budget 10 ms, no margin) whose passes cost verify_ns
    (samples, every k) plus draft_ns per pass."""
    monkeypatch.setattr("edgeinfer.core.scheduler.time.perf_counter_ns", lambda: t[0])
    p = TickPlanner(SchedulerConfig(budget_ms=10.0, margin_ms=0.0, k_max=k_max, adaptive=False),
                    ["d"] if k_max else (), row_tokens=row_tokens)
    p.latency.clock = lambda: t[0]
    for k in range(k_max + 1):
        for ns in verify_ns:
            p.latency.record("verify", k, ns)
            p.latency.record("draft:d", k, draft_ns)
    return p


def test_the_planner_stops_when_the_budget_cannot_complete_the_next_row(monkeypatch):
    t = [0]
    p = _row_planner(monkeypatch, t)
    p.start(0)
    t[0] = 5_500_000  # 4.5 ms left: four 1 ms passes, four tokens
    assert p.plan(committed=6, remaining=42) is None  # a whole row verified, the next one cannot be: stop now
    assert p.plan(committed=8, remaining=40) == 0  # four tokens complete this row: go on
    assert p.plan(committed=12, remaining=36) is None
    # before the first whole row nothing would be cut off (the draft rung keeps the verified prefix)
    assert p.plan(committed=1, remaining=47) == 0
    # no row boundaries (the default): every pass that fits runs, as before
    q = _row_planner(monkeypatch, t, row_tokens=1)
    q.start(0)
    assert q.plan(committed=6, remaining=42) == 0


def test_the_row_bound_counts_every_draft_kept_at_the_fastest_measured_cost(monkeypatch):
    t = [0]
    p = _row_planner(monkeypatch, t, k_max=4)  # a pass of 4 drafts may verify 5 tokens in 1 ms
    p.start(0)
    t[0] = 8_500_000  # 1.5 ms left: 7.5 tokens at best
    assert p.plan(committed=6, remaining=42) == 4
    t[0] = 8_900_000  # 1.1 ms left: 5.5 tokens at best, the row needs 6
    assert p.plan(committed=6, remaining=42) is None
    # passes usually 1 ms, once 0.5 ms: the bound takes the fastest (it stops only where no run of passes could
    # complete the row), though at p99 only three of the 3.5 ms left would be planned
    q = _row_planner(monkeypatch, t, verify_ns=[1_000_000] * 200 + [500_000])
    q.start(0)
    t[0] = 6_500_000
    assert q.plan(committed=6, remaining=42) == 0
    t[0] = 7_500_000  # 2.5 ms: five tokens at the fastest
    assert q.plan(committed=6, remaining=42) is None


class _ClockedEngine:
    """A target whose every forward pass takes 1 ms of the injected clock t[0]; its greedy token at position i is
    i % 5 (n_bins 8)."""

    def __init__(self, t):
        self.t = t

    def forward(self, obs, tokens, start):
        self.t[0] += 1_000_000
        logits = np.zeros((max(1, len(tokens)), 8), dtype=np.float32)
        logits[np.arange(len(logits)), (start + np.arange(len(logits))) % 5] = 1.0
        return logits

    def rollback(self, n):
        pass


def test_a_decode_cut_by_its_budget_ends_on_a_row_boundary_sooner_with_the_same_tokens(monkeypatch):
    from edgeinfer.core.speculative import speculative_decode

    t = [0]
    for row_tokens, n_tokens, t_end_ns in ((1, 10, 10_000_000), (4, 8, 8_000_000)):
        p = _row_planner(monkeypatch, t, row_tokens=row_tokens)
        t[0] = 0
        p.start(0)
        res = speculative_decode(_ClockedEngine(t), np.zeros(3, np.float32), 24, None, p)
        # row_tokens 1: ten 1 ms passes fill the 10 ms; rows of 4: the 9th and 10th tokens would be cut off, so
        # decoding stops after 8 tokens, 2 ms earlier, with the same (exact) tokens
        assert (len(res.tokens), t[0], res.complete) == (n_tokens, t_end_ns, False)
        assert res.tokens == [i % 5 for i in range(n_tokens)]
