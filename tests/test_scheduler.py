"""Adaptive speculation: k chosen for expected tokens per second from measured costs and acceptance."""
import pytest

from edgeinfer.scheduler import AcceptanceModel, SchedulerConfig, TickPlanner, expected_tokens


def _planner(draft_us, verify_us, accept_rate, k_max=8, passes=400, probe_every=32):
    """A planner fed measured costs draft_us(k), verify_us(k) (us) and `passes` passes at its own chosen k whose
    drafts are each kept with a deterministic pseudo-random pattern of rate about accept_rate."""
    p = TickPlanner(SchedulerConfig(k_max=k_max, probe_every=probe_every))
    p.unlimited()
    for k in range(k_max + 1):
        for _ in range(20):
            p.record("draft", k, int(draft_us(k) * 1e3))
            p.record("verify", k, int(verify_us(k) * 1e3))
    for i in range(passes):
        k = max(1, p.best_k())
        run = 0
        while run < k and ((i * 7 + run * 3) % 100) < accept_rate * 100:
            run += 1
        p.record("accepted", k, run)
    return p


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


def test_cheap_drafts_and_high_acceptance_speculate_deeply():
    p = _planner(lambda k: 2 * k, lambda k: 400 + 10 * k, 0.8)
    assert p.best_k() >= 5


def test_speculation_turns_off_when_it_does_not_pay():
    # drafts as expensive as a target pass and rarely accepted: target-only is faster
    p = _planner(lambda k: 400 * k, lambda k: 400 + 10 * k, 0.1)
    ks = [p.best_k() for _ in range(64)]
    assert ks.count(0) >= 60 and ks.count(1) >= 1  # off, with an occasional probe of k = 1


def test_the_choice_maximises_expected_tokens_per_second():
    draft, verify = (lambda k: 30 * k), (lambda k: 400 + 40 * k)
    p = _planner(draft, verify, 0.6)
    tokens = p.acceptance.expected_tokens()
    best = max(range(9), key=lambda k: tokens[k] / (draft(k) + verify(k)))
    assert p.best_k() == best


def test_target_only_never_speculates():
    p = TickPlanner(SchedulerConfig(k_max=0))
    p.unlimited()
    assert {p.plan(n, 48 - n) for n in range(1, 48)} == {0}
