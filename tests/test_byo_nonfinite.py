"""A bring-your-own policy never stops the runtime on a non-finite step: a finite float64
observation past float32's range (the model's input dtype), or a model that returns NaN, skips that step; the
runtime node sends the continue rung for it (counted as error.nonfinite_action) and keeps serving. The real
Isaac Lab UR10 reach policy (ONNX) through a real RuntimeNode on loopback sockets."""
from pathlib import Path

import numpy as np
import pytest
import torch
from test_serve import _step_until_chunk, node_and_peers  # noqa: F401  (the fixture)

from edgeinfer.core.clock import now_ns
from edgeinfer.core.transport import send
from edgeinfer.core.wire import Observation
from edgeinfer.engines.models.byo import ByoPolicy, ByoRuntime, ByoSpec
from edgeinfer.node.runtime import RuntimeConfig

ROOT = Path(__file__).resolve().parents[1]
UR10_SPEC = ROOT / "launch" / "ur10_reach_policy.toml"
UR10_DIR = ROOT.parent / "shared" / "data" / "ur10_reach_policy"
PAST_FLOAT32 = 1e39  # finite in float64, inf in float32 (max 3.4e38)


@pytest.fixture(scope="module")
def ur10() -> ByoSpec:
    if not (UR10_DIR / "policy.onnx").is_file():
        pytest.skip(f"UR10 policy not found at {UR10_DIR}")
    pytest.importorskip("onnxruntime")
    return ByoSpec.load(UR10_SPEC)


def _q0(spec: ByoSpec, first: float | None = None) -> np.ndarray:
    q = spec.action.offset.copy()  # the default joint positions
    if first is not None:
        q[0] = first
    return q


def test_an_input_past_float32_skips_the_step_and_keeps_the_episode(ur10):
    policy, reference = ByoPolicy(ur10), ByoPolicy(ur10)
    target, raw = policy.act(_q0(ur10, PAST_FLOAT32), np.zeros(6))
    assert target.shape == (6,) and np.all(np.isnan(target)) and np.all(np.isnan(raw))
    np.testing.assert_array_equal(policy.last_action, 0.0)  # not poisoned: the next observation is as new
    q = _q0(ur10) + 0.05
    for _ in range(3):  # the episode goes on exactly as one that never saw the overflow
        got, want = policy.act(q, np.zeros(6)), reference.act(q, np.zeros(6))
        np.testing.assert_array_equal(got[0], want[0])
        assert np.all(np.isfinite(got[0])) and np.abs(got[1]).max() > 1e-3


def test_a_non_finite_model_output_skips_the_step(tmp_path):
    """A TorchScript model that returns NaN for a negative first input (log of it), finite otherwise."""
    class LogPolicy(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.log(x[:, :2] + 1.0)

    torch.jit.save(torch.jit.script(LogPolicy()), str(tmp_path / "log.pt"))
    (tmp_path / "log.toml").write_text('model = "log.pt"\nrate_hz = 50.0\nn_joints = 2\n'
                                       '[[observation]]\nname = "q"\nsource = "q"\nunits = "rad"\n'
                                       '[action]\nname = "q_target"\nunits = "rad"\n')
    runtime = ByoRuntime(tmp_path / "log.toml")
    bad = runtime.step(Observation(0, 0, np.array([-2.0, 0.0]), np.zeros(2), np.zeros(2)))
    assert np.all(np.isnan(bad.steps_rad[1])) and np.all(runtime.policy.last_action == 0.0)
    good = runtime.step(Observation(1, 1, np.array([1.0, 0.0]), np.zeros(2), np.zeros(2)))
    np.testing.assert_allclose(good.steps_rad[1], [np.log(2.0), 0.0], rtol=1e-6)


def test_the_runtime_node_sends_continue_for_an_overflowing_observation_and_keeps_serving(node_and_peers, ur10):  # noqa: F811
    node, obs_pub, chunks = node_and_peers(RuntimeConfig(byo_spec=UR10_SPEC))
    assert node.replan_every == 8  # a 30 Hz policy at the 250 Hz Start: one step per 8 observations
    q = _q0(ur10, PAST_FLOAT32)
    send(obs_pub, Observation(0, now_ns(), q, np.zeros(6), q))
    chunk = _step_until_chunk(node, chunks)
    assert chunk is not None and (chunk.obs_seq, chunk.rung, len(chunk.steps_rad)) == (0, "continue", 1)
    counters = node.telemetry.telemetry.counters
    assert counters["error.nonfinite_action"] == 1 and counters["rung.continue"] == 1
    reference = ByoPolicy(ur10)  # the node's policy after the skipped step: a fresh episode's
    for seq in (8, 16):
        q = _q0(ur10) + 0.002 * seq
        send(obs_pub, Observation(seq, now_ns(), q, np.zeros(6), q))
        chunk = _step_until_chunk(node, chunks)
        assert chunk is not None and (chunk.obs_seq, chunk.rung) == (seq, "full")
        np.testing.assert_allclose(chunk.steps_rad[1], reference.act(q, np.zeros(6))[0], rtol=0, atol=1e-9)
    assert counters["error.nonfinite_action"] == 1 and counters["rung.full"] == 2
