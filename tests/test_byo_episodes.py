"""Bring-your-own policies at their edges: a TorchScript model of another input width is refused
at load with an error naming the spec's observation fields and both widths (nn.LSTM's own check raises
torch.jit.Error, which is no RuntimeError), and a stateful policy starts a new episode when its observation source
restarts (a new Start), through a real RuntimeNode on loopback sockets."""
from pathlib import Path

import numpy as np
import pytest
import torch
from test_serve import _step_until_chunk, node_and_peers  # noqa: F401  (the fixture)

from edgeinfer.core.clock import now_ns
from edgeinfer.core.transport import send
from edgeinfer.core.wire import Observation, Start
from edgeinfer.engines.models.byo import ByoPolicy, ByoSpec
from edgeinfer.node.runtime import RuntimeConfig

SPEC = """
model = "lstm.pt"
rate_hz = 50.0
n_joints = 2
stateful = true

[[observation]]
name = "joint_pos"
source = "q"
units = "rad"

[[observation]]
name = "joint_vel"
source = "qd"
units = "rad/s"

[[observation]]
name = "previous"
source = "last_action"
units = "raw action"

[action]
name = "q_target"
units = "rad"
"""


class Lstm(torch.nn.Module):
    """A recurrent policy as Isaac Lab exports one: nn.LSTM, its hidden state in buffers updated in forward."""

    def __init__(self, n_obs: int):
        super().__init__()
        torch.manual_seed(0)
        self.rnn = torch.nn.LSTM(n_obs, 8, batch_first=True)
        self.head = torch.nn.Linear(8, 2)
        self.register_buffer("h", torch.zeros(1, 1, 8))
        self.register_buffer("c", torch.zeros(1, 1, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, (h, c) = self.rnn(x.unsqueeze(1), (self.h, self.c))
        self.h.copy_(h)
        self.c.copy_(c)
        return self.head(y[:, 0])


def _spec(tmp_path: Path, n_obs: int) -> Path:
    torch.jit.save(torch.jit.script(Lstm(n_obs)), str(tmp_path / "lstm.pt"))
    (tmp_path / "lstm.toml").write_text(SPEC)
    return tmp_path / "lstm.toml"


def test_a_torchscript_model_of_another_width_is_refused_naming_the_fields_and_both_widths(tmp_path):
    with pytest.raises(ValueError, match=(
            r"^lstm\.toml: observation: fields give 6 values \(joint_pos 2 \+ joint_vel 2 \+ previous 2\), which "
            r"the model rejects \(it takes 7\): .*Expected 7, got 6$")):
        ByoSpec.load(_spec(tmp_path, 7))
    assert ByoSpec.load(_spec(tmp_path, 6)).n_obs == 6  # the width it takes loads


def test_a_new_start_begins_a_new_episode_of_a_stateful_policy(node_and_peers, tmp_path):  # noqa: F811  (the fixture)
    spec = _spec(tmp_path, 6)
    node, obs_pub, chunks = node_and_peers(RuntimeConfig(byo_spec=spec))
    assert node.replan_every == 5  # a 50 Hz policy at the 250 Hz Start
    reference = ByoPolicy(ByoSpec.load(spec))
    q = np.array([0.3, -0.2])

    def session() -> list[np.ndarray]:
        targets = []
        for seq in (0, 5, 10):
            send(obs_pub, Observation(seq, now_ns(), q, np.zeros(2), q))
            chunk = _step_until_chunk(node, chunks)
            assert chunk is not None and (chunk.obs_seq, chunk.rung) == (seq, "full")
            targets.append(chunk.steps_rad[1])
        return targets

    first = session()
    want = [reference.act(q, np.zeros(2))[0] for _ in range(3)]
    np.testing.assert_allclose(first, want, rtol=0, atol=1e-6)
    assert np.abs(first[2] - first[0]).max() > 1e-4  # the same input, a moving state: the outputs differ
    send(obs_pub, Start(now_ns(), 4_000_000, 1000))  # the source restarts: a new episode
    second = session()
    np.testing.assert_allclose(second, first, rtol=0, atol=1e-6)  # from the start state again, not the last one
    assert node.source.restarts == 1
    assert node.runtime.policy.last_action.tolist() == pytest.approx(reference.last_action.tolist(), abs=1e-6)
