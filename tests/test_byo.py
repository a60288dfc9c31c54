"""Bring-your-own-policy specs and runners, on the real Isaac Lab UR10 reach policy and real arm logs."""
from pathlib import Path

import numpy as np
import pytest
import torch

from edgeinfer.core import wire
from edgeinfer.engines.models.byo import ByoPolicy, ByoRuntime, ByoSpec
from edgeinfer.logs.arm_log import HELD_OUT, list_schunk_runs, read_schunk

ROOT = Path(__file__).resolve().parents[1]
UR10_SPEC = ROOT / "launch" / "ur10_reach_policy.toml"
UR10_DIR = ROOT.parent / "shared" / "data" / "ur10_reach_policy"


@pytest.fixture(scope="module")
def ur10_specs() -> dict[str, ByoSpec]:
    """The UR10 spec with its ONNX model and with the TorchScript export of the same weights."""
    if not (UR10_DIR / "policy.onnx").is_file():
        pytest.skip(f"UR10 policy not found at {UR10_DIR}")
    pytest.importorskip("onnxruntime")
    return {"onnx": ByoSpec.load(UR10_SPEC), "torchscript": ByoSpec.load(UR10_SPEC, model=UR10_DIR / "policy.pt")}


@pytest.fixture(scope="module")
def episodes(schunk_dir) -> list[tuple[np.ndarray, np.ndarray]]:
    """(q (T, 6) rad, qd (T, 6) rad/s) of the first three held-out Schunk runs, subsampled to the policy's 30 Hz.
    The Schunk arm is not a UR10: these are real joint trajectories fed as UR10 states, not its own task."""
    runs = [p for n, p in list_schunk_runs(schunk_dir).items() if n in HELD_OUT][:3]
    out = []
    for path in runs:
        log = read_schunk(path)
        rows = np.round(np.arange(0.0, log.t_s[-1], 1 / 30) * log.rate_hz).astype(int)
        out.append((log.q_rad[rows], log.qd_rad_s[rows]))
    return out


def _rollout(policy: ByoPolicy, episodes) -> tuple[np.ndarray, np.ndarray]:
    """(targets (N, 6), raw actions (N, 6)) over every episode, the policy reset before each."""
    targets, raws = [], []
    for q, qd in episodes:
        policy.reset()
        for q_t, qd_t in zip(q, qd):
            target, raw = policy.act(q_t, qd_t)
            targets.append(target)
            raws.append(raw)
    return np.array(targets), np.array(raws)


def test_ur10_spec_layout(ur10_specs):
    spec = ur10_specs["onnx"]
    assert spec.format == "onnx" and ur10_specs["torchscript"].format == "torchscript"
    assert [(f.name, f.width) for f in spec.observation] == [
        ("joint_pos_rel", 6), ("joint_vel_rel", 6), ("pose_command", 7), ("last_action", 6)]
    assert spec.n_obs == 25 and spec.rate_hz == 30.0
    policy = ByoPolicy(spec)
    q0 = spec.action.offset  # the default joint positions: joint_pos_rel is zero there
    obs = policy.observation(q0, np.zeros(6))
    assert obs.shape == (1, 25) and obs.dtype == np.float32
    np.testing.assert_array_equal(obs[0, :12], 0.0)
    np.testing.assert_allclose(obs[0, 12:19], [0.5, 0.0, 0.325, 0.70710677, 0.0, 0.70710677, 0.0])
    target, raw = policy.act(q0, np.zeros(6))
    np.testing.assert_allclose(target, q0 + 0.5 * raw)
    np.testing.assert_array_equal(policy.observation(q0, np.zeros(6))[0, 19:], raw)  # last_action = raw output


def test_ur10_onnx_and_torchscript_agree(ur10_specs, episodes):
    (t_onnx, a_onnx), (t_ts, a_ts) = (_rollout(ByoPolicy(ur10_specs[f]), episodes) for f in ("onnx", "torchscript"))
    assert len(a_onnx) > 300
    assert np.all(np.isfinite(a_onnx)) and np.ptp(a_onnx, axis=0).min() > 1e-2  # the actions move on every joint
    assert np.abs(a_onnx - a_ts).max() <= 1e-5
    assert np.abs(t_onnx - t_ts).max() <= 1e-5


def _recurrent_policy(path: Path) -> None:
    """A TorchScript policy whose hidden state is a buffer updated in forward (as Isaac Lab's LSTM export)."""

    class Recurrent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.cell = torch.nn.LSTMCell(4, 8)
            self.head = torch.nn.Linear(8, 2)
            self.register_buffer("h", torch.zeros(1, 8))
            self.register_buffer("c", torch.zeros(1, 8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h, c = self.cell(x, (self.h, self.c))
            self.h.copy_(h)
            self.c.copy_(c)
            return self.head(h)

    torch.jit.save(torch.jit.script(Recurrent()), str(path))


def _write_spec(path: Path, body: str) -> Path:
    path.write_text(body)
    return path


RECURRENT_SPEC = """
model = "recurrent.pt"
rate_hz = 50.0
n_joints = 2
stateful = true

[[observation]]
name = "q"
source = "q"
units = "rad"

[[observation]]
name = "qd"
source = "qd"
units = "rad/s"
scale = 0.1

[action]
name = "q_target"
units = "rad"
"""


def test_stateful_torchscript_resets_between_episodes(tmp_path):
    _recurrent_policy(tmp_path / "recurrent.pt")
    policy = ByoPolicy(ByoSpec.load(_write_spec(tmp_path / "recurrent.toml", RECURRENT_SPEC)))
    q, qd = np.array([0.3, -0.2]), np.array([1.0, 0.5])

    def episode() -> np.ndarray:
        policy.reset()
        return np.array([policy.act(q, qd)[1] for _ in range(5)])

    first = episode()
    assert np.all(np.abs(np.diff(first, axis=0)).max(axis=1) > 1e-6)  # same input, the state moves the output
    np.testing.assert_array_equal(episode(), first)


def test_stateful_false_is_checked(tmp_path):
    _recurrent_policy(tmp_path / "recurrent.pt")
    spec = _write_spec(tmp_path / "recurrent.toml", RECURRENT_SPEC.replace("stateful = true", "stateful = false"))
    with pytest.raises(ValueError, match=r"recurrent\.toml: stateful: false, but two identical calls"):
        ByoSpec.load(spec)


@pytest.mark.parametrize("edit, match", [
    (("n_joints = 2", "n_joints = 2\nhorizon = 4"), r"recurrent\.toml: unknown keys \['horizon'\]"),
    (("scale = 0.1", "scale = [0.1, 0.1, 0.1]"),
     r"recurrent\.toml: observation\[1\]\.scale: expected 2 numbers, got 3"),
    (('name = "qd"', 'name = "qd"\nvalue = [1.0]'), r"recurrent\.toml: observation\[1\]\.value: only for source"),
    (('source = "qd"', 'source = "qdd"'), r"recurrent\.toml: observation\[1\]\.source: expected one of"),
    (('units = "rad/s"', 'units = "deg/s"'), r"recurrent\.toml: observation\[1\]\.units: source 'qd' is in"),
    (("rate_hz = 50.0", 'rate_hz = "50"'), r"recurrent\.toml: rate_hz: expected float, got str"),
    (("stateful = true", "stateful = 1"), r"recurrent\.toml: stateful: expected bool, got int"),
    (('model = "recurrent.pt"', 'model = "missing.pt"'), r"recurrent\.toml: model: no such file .*missing\.pt"),
    (('name = "q_target"', ""), r"recurrent\.toml: action\.name: missing"),
])
def test_spec_errors_name_file_and_field(tmp_path, edit, match):
    _recurrent_policy(tmp_path / "recurrent.pt")
    with pytest.raises(ValueError, match=match):
        ByoSpec.load(_write_spec(tmp_path / "recurrent.toml", RECURRENT_SPEC.replace(*edit)))


def test_unreadable_model_names_file_and_field(tmp_path):
    """A state_dict saved with torch.save is not TorchScript (a common mix-up)."""
    torch.save(torch.nn.Linear(4, 2).state_dict(), tmp_path / "recurrent.pt")
    with pytest.raises(ValueError, match=r"recurrent\.toml: model: cannot load .*recurrent\.pt as torchscript"):
        ByoSpec.load(_write_spec(tmp_path / "recurrent.toml", RECURRENT_SPEC))


def test_spec_width_must_match_the_model(tmp_path, ur10_specs):
    """Wrong widths against real models: the ONNX file declares its width, TorchScript is probed."""
    text = UR10_SPEC.read_text().replace("../../shared/data/ur10_reach_policy", str(UR10_DIR))
    short = text.replace("value = [0.5, 0.0, 0.325,", "value = [0.5, 0.0,")  # 6 pose numbers, not 7
    spec = _write_spec(tmp_path / "ur10_reach.toml", short)
    with pytest.raises(ValueError, match=r"ur10_reach\.toml: observation: fields give 24 values .* takes 25"):
        ByoSpec.load(spec)
    with pytest.raises(ValueError, match=r"ur10_reach\.toml: observation: fields give 24 values .* rejects"):
        ByoSpec.load(spec, model=UR10_DIR / "policy.pt")
    _recurrent_policy(tmp_path / "recurrent.pt")
    spec = _write_spec(tmp_path / "recurrent.toml", RECURRENT_SPEC.replace("n_joints = 2", "n_joints = 3"))
    with pytest.raises(ValueError, match=r"recurrent\.toml: observation: fields give 6 values"):
        ByoSpec.load(spec)


def test_runtime_chunks_from_real_observations(ur10_specs, episodes):
    runtime = ByoRuntime(UR10_SPEC)
    reference = ByoPolicy(ur10_specs["onnx"])
    assert runtime.step_ns == 33_333_333 and runtime.chunk_timing(4_000_000) == (8, 33_333_333)
    q, qd = episodes[0]
    runtime.warmup(wire.Observation(0, 0, q[0], qd[0], q[0]))
    assert runtime.n_chunks == 0
    for i in range(30):
        obs = wire.Observation(seq=8 * i, t_ns=8 * i * 4_000_000, q_rad=q[i], qd_rad_s=qd[i], q_prev_rad=q[i])
        chunk = wire.decode(wire.encode(runtime.step(obs)))  # a valid message on the wire
        target, _ = reference.act(q[i], qd[i])
        assert chunk.seq == i + 1 and chunk.obs_seq == 8 * i and chunk.t_obs_ns == obs.t_ns
        assert chunk.step_ns == 33_333_333 and chunk.rung == "full"
        assert (chunk.tokens, chunk.target_passes, chunk.drafted, chunk.accepted) == (0, 1, 0, 0)
        assert chunk.steps_rad.shape == (2, 6)
        np.testing.assert_array_equal(chunk.steps_rad[0], q[i])
        np.testing.assert_allclose(chunk.steps_rad[1], target, atol=1e-12)
    runtime.reset()  # a new episode replays the same first action
    reference.reset()
    first = runtime.step(wire.Observation(0, 0, q[0], qd[0], q[0]))
    np.testing.assert_allclose(first.steps_rad[1], reference.act(q[0], qd[0])[0], atol=1e-12)
    assert first.seq == 31
