"""The first verified action step is handed out before the rest of the chunk is decoded."""
import numpy as np
import pytest

from edgeinfer.core.scheduler import SchedulerConfig
from edgeinfer.core.wire import Observation
from edgeinfer.node.runtime import PolicyRuntime, RuntimeConfig


@pytest.mark.parametrize("decode", ["speculative", "target-only"])
def test_first_step_arrives_early_and_matches_the_chunk(held_out, decode):
    feats, _ = held_out
    rt = PolicyRuntime(RuntimeConfig(decode=decode, scheduler=SchedulerConfig(budget_ms=10_000), warmup_chunks=0))
    d = rt.policy.cfg.n_joints
    for i, f in enumerate(feats[::997][:5]):
        obs = Observation(i, 0, f[:d], f[d:2 * d], f[:d] - f[2 * d:3 * d])
        firsts = []
        chunk = rt.step(obs, budget=False, on_first_step=firsts.append)
        assert len(firsts) == 1
        first = firsts[0]
        assert first.rung == "partial" and first.obs_seq == chunk.obs_seq and first.seq == chunk.seq == i + 1
        assert first.steps_rad.shape == (2, d)
        np.testing.assert_array_equal(first.steps_rad, chunk.steps_rad[:2])  # the same verified step
        assert first.t_ready_ns < chunk.t_ready_ns
    assert rt.n_chunks == 5  # early first steps are not extra chunks
