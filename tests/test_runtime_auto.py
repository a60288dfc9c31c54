"""The runtime with `drafter = "auto"`: the scheduler picks a drafter and k per chunk; chunks stay exact."""
import time
from types import SimpleNamespace

import numpy as np
import pytest

from edgeinfer.core import speculative
from edgeinfer.core.scheduler import SchedulerConfig
from edgeinfer.core.wire import Observation
from edgeinfer.node.runtime import PolicyRuntime, RuntimeConfig


def _observations(feats, n_joints, n):
    d = n_joints
    idx = np.random.default_rng(1).choice(len(feats), n, replace=False)
    return [Observation(i, 0, f[:d], f[d:2 * d], f[:d] - f[2 * d:3 * d]) for i, f in enumerate(feats[idx])]


@pytest.fixture
def cpu_time_costs(monkeypatch):
    """The decode loop's cost clock (edgeinfer.core.speculative's time.perf_counter_ns) reads this process's CPU
    time: a pass costs the work it did, not the time a loaded host kept the process waiting. On the wall clock a
    stall inside one drafter's passes makes it look slower than target-only and the planner rightly turns it off,
    which is the planner working, not what this test is about."""
    monkeypatch.setattr(speculative, "time", SimpleNamespace(perf_counter_ns=time.process_time_ns))


def test_auto_chooses_among_every_drafter_and_stays_token_identical(held_out, cpu_time_costs):
    feats, _ = held_out
    unbudgeted = SchedulerConfig(budget_ms=10_000)
    # on torch: whether drafting pays, and which drafter, depends on the target's pass cost (on the fused engine a
    # pass is cheap enough that the planner rightly drafts little)
    auto = PolicyRuntime(RuntimeConfig(backend="torch", drafter="auto", scheduler=unbudgeted, warmup_chunks=0))
    target = PolicyRuntime(RuntimeConfig(backend="torch", decode="target-only", scheduler=unbudgeted, warmup_chunks=0))
    assert set(auto.drafters) == {"kinematic", "early-exit", "learned"}
    chosen = []
    for obs in _observations(feats, auto.policy.cfg.n_joints, 24):
        a, t = auto.step(obs, budget=False), target.step(obs, budget=False)
        chosen.append(auto.planner.drafter)
        assert a.rung == t.rung == "full"
        np.testing.assert_array_equal(a.steps_rad, t.steps_rad)  # exact: the target's own greedy actions
    assert set(chosen[:15]) == {"kinematic", "early-exit", "learned"}  # each explored first
    assert chosen[15:].count("learned") >= 6  # then the distilled drafter wins: it keeps the most drafts
