"""The fleet scheduler (core/fleet_batching.py) on an injected clock: every robot's tokens are its own greedy tokens
whatever the batch, EDF order, k turning down as the batch grows, deadline cuts at row boundaries, admission with its
reason."""
import numpy as np
import pytest

from edgeinfer.core.fleet_batching import FleetPolicy, FleetScheduler, PassCosts, Request, expected_tokens
from edgeinfer.core.speculative import ChunkDecode, FixedK, speculative_decode
from edgeinfer.core.wire import Join
from edgeinfer.engines.backends.torch_engine import TorchEngine
from edgeinfer.engines.models.drafters import make_drafter

MS = 1_000_000


class Clock:
    def __init__(self):
        self.t = 1_000 * MS

    def __call__(self) -> int:
        return self.t


class SlotEngines:
    """A BatchedEngine over one real TorchEngine per slot (batch invariant: each slot is its own engine); every
    call advances the injected clock by cost(batch, rows)."""

    def __init__(self, policy, n_slots, clock, cost=lambda b, t: (50 + 20 * b * t) * 1000):
        self.engines = [TorchEngine.from_policy(policy) for _ in range(n_slots)]
        self.n_slots, self.clock, self.cost = n_slots, clock, cost
        self.calls = []

    def forward_batch(self, passes):
        rows = max(len(p.tokens) + (p.start == 0) for p in passes)
        self.clock.t += int(self.cost(len(passes), rows))
        self.calls.append(len(passes))
        return [self.engines[p.slot].forward(p.obs, p.tokens, p.start) for p in passes]


def _robot_obs(policy, held_out, i):
    feats, _ = held_out
    d = policy.cfg.n_joints
    f = feats[1000 + 97 * i]
    q, qd, q_prev = f[:d], f[d:2 * d], f[:d] - f[2 * d:3 * d]
    return q, qd, q_prev, policy.features(q, qd, q_prev)


def _request(policy, held_out, i, clock, deadline_ms=1000.0, drafter=True):
    q, qd, q_prev, feats = _robot_obs(policy, held_out, i)
    dr = make_drafter("kinematic", policy) if drafter else None
    if dr is not None:
        dr.reset(q, qd, q_prev)
    dec = ChunkDecode(feats, policy.cfg.n_tokens, dr)
    return Request(f"r{i}", i, i, clock.t, clock.t + int(deadline_ms * MS), clock.t, dec)


def test_each_robots_tokens_are_its_own_target_only_greedy_tokens(policy, held_out, one_torch_thread):
    clock = Clock()
    engine = SlotEngines(policy, 4, clock, lambda b, t: (200 + 10 * b * t) * 1000)  # speculation pays at batch 4
    sched = FleetScheduler(FleetPolicy(), engine, policy.cfg.n_tokens, policy.cfg.n_joints, clock=clock)
    q, qd, q_prev, feats = _robot_obs(policy, held_out, 9)

    def drafter():
        d = make_drafter("kinematic", policy)
        d.reset(q, qd, q_prev)
        return d
    sched.warm_up(feats, drafter, rounds=4)
    assert {t for b, t in sched.costs.measured()} == {1, 2, 3, 5, 9} and sched.passes == 0 and not sched.acceptance
    engine.calls.clear()
    reqs = [_request(policy, held_out, i, clock) for i in range(4)]
    for r in reqs[:2]:
        sched.submit(r)
    ended = sched.step()  # the first two prefill together; the others join at the next pass
    for r in reqs[2:]:
        sched.submit(r)
    while sched.busy():
        ended += sched.step()
    assert sorted(r.robot for r in ended) == ["r0", "r1", "r2", "r3"] and not any(r.cut for r in ended)
    assert engine.calls[:2] == [2, 4]
    alone = TorchEngine.from_policy(policy)
    for i, r in enumerate(reqs):
        ref = speculative_decode(alone, _robot_obs(policy, held_out, i)[3], policy.cfg.n_tokens, None, FixedK(0))
        assert r.decode.res.tokens == ref.tokens and r.decode.res.complete
    assert sum(r.decode.res.drafted for r in reqs) > 0  # speculation ran (adaptive k chose k > 0 at batch <= 4)
    assert set(sched.k_chosen) - {0}


def test_edf_runs_the_earliest_deadline_first_and_arrival_order_does_not(policy, held_out, one_torch_thread):
    for order, first in (("edf", "r1"), ("arrival", "r0")):
        clock = Clock()
        sched = FleetScheduler(FleetPolicy(order=order, max_batch=1, deadline_cut=False), SlotEngines(policy, 2, clock),
                               policy.cfg.n_tokens, policy.cfg.n_joints, clock=clock)
        sched.submit(_request(policy, held_out, 0, clock, deadline_ms=50))
        clock.t += 1
        sched.submit(_request(policy, held_out, 1, clock, deadline_ms=20))
        done = []
        while sched.busy():
            done += [r.robot for r in sched.step()]
        assert done[0] == first, order


def test_k_turns_down_as_the_batch_grows_and_back_up():
    costs = PassCosts()
    for b in (1, 2, 4, 8, 16, 32):
        for t in range(1, 10):
            for _ in range(4):
                costs.record(b, t, 100_000 + 8_000 * b * t)  # a fixed cost per pass, and a cost per row
    sched = FleetScheduler(FleetPolicy(k_max=8), None, 48, 6, costs)
    sched.acceptance = {"a": [100, 60]}
    rates = np.array([0.6])
    ks = {b: max(range(9), key=lambda k: (sched._goodput(np.repeat(rates, b), b, k), -k)) for b in (1, 4, 32)}
    assert ks[1] > ks[4] > ks[32] == 0, ks
    assert expected_tokens(0.6, 0) == 1.0 and np.isclose(expected_tokens(1.0, 4), 5.0)


def test_a_chunk_that_cannot_meet_its_deadline_ends_at_a_row_boundary(policy, held_out, one_torch_thread):
    clock = Clock()
    d = policy.cfg.n_joints
    sched = FleetScheduler(FleetPolicy(adaptive_k=False, k=0), SlotEngines(policy, 2, clock, lambda b, t: MS),
                           policy.cfg.n_tokens, d, clock=clock)
    sched.costs.record(1, 1, MS)
    tight = _request(policy, held_out, 0, clock, deadline_ms=15.2, drafter=False)  # 1 ms passes: 14 fit
    loose = _request(policy, held_out, 1, clock, deadline_ms=100.0, drafter=False)
    sched.submit(tight)
    sched.submit(loose)
    ended = []
    while sched.busy():
        ended += sched.step()
    assert tight.cut and not tight.decode.done and tight.decode.n == 2 * d  # stopped after its second whole row
    assert clock.t - tight.ended_ns >= 0 and tight.ended_ns <= tight.deadline_ns
    assert loose.decode.done and not loose.cut and sched.cuts == 1


def _admit(sched, name, budget_ms, max_budget_ms=0.0, admitted=None):
    return sched.admission(Join(name, 6, 4 * MS, 5, int(budget_ms * MS), int(max_budget_ms * MS)), admitted or {}, 32)


def _admit_until_refused(sched):
    """Robots r0, r1, ... with 20 ms budgets join until one is refused: (the admitted budgets, that refusal)."""
    admitted = {}
    for i in range(40):
        a = _admit(sched, f"r{i}", 20.0, admitted=admitted)
        if not a.admitted:
            return admitted, a
        admitted[a.robot] = a.budget_ns
    raise AssertionError("40 robots admitted")


def test_admission_refuses_a_robot_that_would_break_the_others_deadlines():
    costs = PassCosts()
    for b in range(1, 33):
        for t in (1, 2, 3, 5, 9):
            costs.record(b, t, 50_000 + 10_000 * b * t)
    sched = FleetScheduler(FleetPolicy(adaptive_k=False, admission_headroom=1.0), None, 48, 6, costs)
    admitted, a = _admit_until_refused(sched)
    # 48 passes of 50 + 10 * B us: B robots fit while 48 * (0.05 + 0.01 B) + 0.5 <= 20 ms, i.e. B <= 35 -> slots (32)
    # bind first; with 30 us a row the bound is B <= 11
    assert len(admitted) == 32 and "no free slot" in a.reason
    costs30 = PassCosts()
    for b in range(1, 33):
        costs30.record(b, 1, 50_000 + 30_000 * b)
    sched = FleetScheduler(FleetPolicy(adaptive_k=False, admission_headroom=1.0), None, 48, 6, costs30)
    admitted, a = _admit_until_refused(sched)
    assert len(admitted) == 11 and a.batch == 12
    assert "refused" in a.reason and "20 ms" in a.reason and a.chunk_ns == pytest.approx(48 * (50_000 + 360_000))
    default = FleetScheduler(FleetPolicy(adaptive_k=False), None, 48, 6, costs30)  # headroom 0.8: 20 ms budgets use 16
    assert len(_admit_until_refused(default)[0]) == 9  # 48 (50 + 30 B) us + 0.5 ms <= 0.8 x 20 ms: B <= 9.1
    longer = _admit(sched, "patient", 20.0, max_budget_ms=40.0)  # alone: fits 20 ms anyway
    assert longer.admitted and longer.budget_ns == 20 * MS
    one = {"r0": 40 * MS}
    slow = _admit(sched, "slow", 10.0, max_budget_ms=25.0, admitted=one)  # 2 robots: 48 * 110 us = 5.3 ms fits 10
    assert slow.admitted and slow.budget_ns == 10 * MS
    tight = _admit(sched, "t", 3.0, max_budget_ms=8.0, admitted=one)  # needs 5.8 ms: admitted on 6 ms
    assert tight.admitted and tight.budget_ns == 6 * MS and "longer budget" in tight.reason
    never = _admit(sched, "n", 3.0, max_budget_ms=4.0, admitted=one)
    assert not never.admitted and "longest accepted 4 ms" in never.reason
    off = FleetScheduler(FleetPolicy(adaptive_k=False, admission=False), None, 48, 6, costs30)
    assert _admit(off, "x", 1.0, admitted={f"r{i}": MS for i in range(20)}).admitted


def test_pass_costs_estimate_unmeasured_shapes_from_measured_ones():
    costs = PassCosts(quantile=1.0)
    assert costs.estimate_ns(4, 1) == 0.0
    costs.record(2, 1, 100)
    costs.record(8, 1, 400)
    assert costs.estimate_ns(2, 1) == 100 and costs.estimate_ns(4, 1) == 400  # the next measured shape up
    assert costs.estimate_ns(16, 1) == 800  # past the largest: scaled by rows
    assert np.isclose(costs.estimate_ns(2, 2), 400)


def test_a_robots_newer_chunk_waits_for_its_running_one_and_resets_its_drafter_on_joining(policy, held_out,
                                                                                          one_torch_thread):
    clock = Clock()
    engine = SlotEngines(policy, 1, clock)
    slots_per_call = []
    forward = engine.forward_batch
    engine.forward_batch = lambda passes: (slots_per_call.append([p.slot for p in passes]), forward(passes))[1]
    sched = FleetScheduler(FleetPolicy(adaptive_k=False, k=2), engine, policy.cfg.n_tokens, policy.cfg.n_joints,
                           clock=clock)
    first = _request(policy, held_out, 0, clock)
    sched.submit(first)
    sched.step()
    q, qd, q_prev, feats = _robot_obs(policy, held_out, 1)
    drafter = first.decode.drafter
    newer = Request("r0", 0, 1, clock.t, clock.t + 1000 * MS, clock.t, ChunkDecode(feats, policy.cfg.n_tokens, drafter),
                    state=(q, qd, q_prev))
    assert sched.submit(newer) is None
    before = drafter.propose([], 3)
    sched.step()  # the running chunk keeps the slot and the drafter; the newer one waits
    assert not newer.started and drafter.propose([], 3) == before and sched.busy()
    ended = []
    while sched.busy():
        ended += sched.step()
    assert [r.obs_seq for r in ended] == [0, 1] and all(len(s) == 1 for s in slots_per_call)
    ref = make_drafter("kinematic", policy)
    ref.reset(q, qd, q_prev)
    assert drafter.propose([], 3) == ref.propose([], 3)  # reset with the newer observation when it joined
    alone = speculative_decode(TorchEngine.from_policy(policy), feats, policy.cfg.n_tokens, None, FixedK(0))
    assert newer.decode.res.tokens == alone.tokens


def test_target_only_rows_on_the_batched_fused_engine_give_each_robots_own_tokens(policy, held_out):
    from edgeinfer.engines.backends.batched import open_batched
    from edgeinfer.engines.backends.fused_engine import FusedEngine

    engine = open_batched(policy, "fused", 4)
    calls = []
    runs = engine.greedy_runs
    engine.greedy_runs = lambda r: (calls.append([m for *_, m in r]), runs(r))[1]
    sched = FleetScheduler(FleetPolicy(adaptive_k=False, k=0, deadline_cut=False, call_ms=0.0), engine,
                           policy.cfg.n_tokens, policy.cfg.n_joints)
    reqs = [_request(policy, held_out, i, Clock(), drafter=False) for i in range(4)]
    sched.submit(reqs[0])
    sched.step()  # robot 0's prefill alone: it runs a row ahead of the others
    for r in reqs[1:]:
        sched.submit(r)
    while sched.busy():
        sched.step()
    assert any(len(set(c)) > 1 for c in calls) and max(map(max, calls)) == 6  # rows of different lengths, one call
    alone = FusedEngine(policy.model)
    for i, r in enumerate(reqs):
        assert r.decode.res.tokens == alone.greedy_chunk(_robot_obs(policy, held_out, i)[3]), i


def test_rows_run_several_to_a_call_within_call_ms_and_every_deadline(policy, held_out):
    """A lone robot's target-only chunk: one call for every row after its prefill when call_ms allows it (a
    scheduler iteration per row is Python the robot waits for); a row per call with call_ms 0; a short call_ms
    or a tight deadline stops at a row boundary. The tokens are the same every way."""
    from edgeinfer.engines.backends.batched import open_batched
    from edgeinfer.engines.backends.fused_engine import FusedEngine

    d, n = policy.cfg.n_joints, policy.cfg.n_tokens
    want = FusedEngine(policy.model).greedy_chunk(_robot_obs(policy, held_out, 0)[3])
    clock = Clock()  # frozen: the deadlines are what the test says, whatever this machine's speed
    for call_ms, deadline_ms, rows in ((2.0, 1000.0, [n - 1]), (0.0, 1000.0, [d - 1] + [d] * (n // d - 1)),
                                       (0.6, 1000.0, [d - 1 + 2 * d, 2 * d, 2 * d, d]),  # 17 passes fit 0.6 ms
                                       (2.0, 1.6, [d - 1 + 6 * d, d])):  # 45 passes fit the deadline
        engine = open_batched(policy, "fused", 1)
        calls, runs = [], engine.greedy_runs
        engine.greedy_runs = lambda r, runs=runs, calls=calls: (calls.append(r[0][3]), runs(r))[1]
        sched = FleetScheduler(FleetPolicy(adaptive_k=False, k=0, deadline_cut=False, call_ms=call_ms, margin_ms=0.0,
                                           quantile=0.5), engine, n, d, clock=clock)
        sched.costs.record(1, 1, 35_000)  # 35 us a pass, as measured: 17 passes fit 0.6 ms, 45 fit 1.6 ms
        sched.costs.record = lambda *a: None  # keep it: the real calls' own costs would move the plan
        req = _request(policy, held_out, 0, clock, deadline_ms=deadline_ms, drafter=False)
        sched.submit(req)
        while sched.busy():
            sched.step()
        assert calls == rows, (call_ms, deadline_ms)
        assert req.decode.res.tokens == want and req.decode.done
