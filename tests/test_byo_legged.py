"""A legged-style bring-your-own policy (launch/legged_example.toml: IMU angular velocity, projected gravity, a
velocity command, q, qd, the last action and a gait phase clock), as a small ONNX policy made here, fed from an
MCAP log written here (JointState + sensor_msgs/Imu + a geometry_msgs/Twist command; the joints are the real
Schunk measurement_1 when ../shared/data has it), through the runtime node and the replay loop."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from test_extra_channels import EXTRA, joint_log, write_legged_mcap
from test_serve import _next, _obs, _step_until_chunk, node_and_peers  # noqa: F401  (the fixture)

from edgeinfer.core.wire import ObservationMismatch

pytestmark = pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("onnx", "onnxruntime", "mcap_ros2")),
                                reason="needs onnx, onnxruntime and mcap_ros2 (the logs extra)")

ROOT = Path(__file__).resolve().parents[1]
LEGGED_SPEC = ROOT / "launch" / "legged_example.toml"
SCHUNK = ROOT.parent / "shared" / "data" / "schunk_lwa4p"
N_OBS, N_JOINTS = 29, 6  # 3 + 3 + 3 + 6 + 6 + 6 + 2
GAIT = slice(27, 29)  # the phase clock's columns, after the IMU (0:6), the command (6:9) and the joints (9:27)


def legged_policy(path: Path) -> Path:
    """A fixed-weight ONNX policy (onnx.helper): actions = tanh(obs @ W), W (29, 6) from seed 0, with the IMU and
    phase columns weighted up so that each one moves every action."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).normal(0.0, 0.3, size=(N_OBS, N_JOINTS))
    w[:6] *= 4.0  # angular velocity, gravity
    w[GAIT] *= 4.0
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["obs", "W"], ["z"]), helper.make_node("Tanh", ["z"], ["actions"])], "legged",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, [1, N_OBS])],
        [helper.make_tensor_value_info("actions", TensorProto.FLOAT, [1, N_JOINTS])],
        [numpy_helper.from_array(w.astype(np.float32), "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def legged(tmp_path_factory) -> tuple[Path, Path]:
    """(the MCAP log: 2 s of joints with an IMU at 200 Hz and a command at 50 Hz, the ONNX policy)."""
    tmp = tmp_path_factory.mktemp("legged")
    return write_legged_mcap(joint_log(SCHUNK, 2.0), tmp / "legged.mcap"), legged_policy(tmp / "legged.onnx")


def test_legged_spec_layout(legged):
    from edgeinfer.engines.models.byo import ByoSpec

    spec = ByoSpec.load(LEGGED_SPEC, model=legged[1])
    assert [(f.name, f.source, f.width) for f in spec.observation] == [
        ("base_ang_vel", "channel", 3), ("projected_gravity", "channel", 3), ("velocity_command", "channel", 3),
        ("dof_pos", "q", 6), ("dof_vel", "qd", 6), ("last_action", "last_action", 6), ("gait_phase", "phase", 2)]
    assert spec.n_obs == N_OBS and spec.channels() == {"imu.ang_vel": 3, "imu.gravity": 3, "cmd": 3}


def test_a_log_without_the_channels_is_refused_before_anything_starts(legged, tmp_path):
    """Naming the spec's field, the channel and the log; no process is started (the check is the preflight's)."""
    from edgeinfer.node.runtime import RuntimeConfig
    from edgeinfer.sim.replay import replay
    from edgeinfer.sim.run_config import ReplayConfig

    cfg = ReplayConfig(log=legged[0], out=tmp_path, extra="imu.ang_vel=/imu:angular_velocity",
                       runtime=RuntimeConfig(byo_spec=LEGGED_SPEC, byo_model=legged[1]))
    with pytest.raises(ObservationMismatch, match=r"legged_example\.toml: observation\[1\] \(projected_gravity\): "
                                                  r"channel 'imu.gravity' is not in the log legged \(its channels: "
                                                  r"\['imu.ang_vel'\]"):
        replay(cfg, Console(quiet=True))
    assert not (tmp_path / "report.json").exists()


def test_runtime_node_counts_an_observation_without_the_channels(node_and_peers, legged):  # noqa: F811
    """Valid on the wire but not what the policy reads: counted (error.obs_mismatch), never fatal; the next
    observation with the channels gets its chunk."""
    from edgeinfer.core.transport import send
    from edgeinfer.core.wire import ActionChunk, pack_channels
    from edgeinfer.node.runtime import RuntimeConfig

    node, obs_pub, chunks = node_and_peers(RuntimeConfig(byo_spec=LEGGED_SPEC, byo_model=legged[1],
                                                         max_obs_age_ms=300.0))
    send(obs_pub, _obs(0))  # no extra channels at all
    assert _step_until_chunk(node, chunks) is None
    assert node.telemetry.telemetry.counters["error.obs_mismatch"] == 1
    extra, layout = pack_channels({"imu.ang_vel": np.zeros(3), "imu.gravity": [0, 0, -1.0], "cmd": np.zeros(3)})
    good = _obs(5)
    good.extra, good.extra_layout = extra, layout
    send(obs_pub, good)
    chunk = _step_until_chunk(node, chunks)
    assert isinstance(chunk, ActionChunk) and chunk.obs_seq == 5 and chunk.steps_rad.shape == (2, 6)
    assert _next(chunks, ActionChunk, 50) is None


def _row_of_tick(rec, log) -> dict[int, int]:
    from edgeinfer.sim.schedule import tick_grid

    return {int(k) + rec.pre_roll_ticks: i for i, k in enumerate(tick_grid(log))}


@pytest.mark.slow
def test_legged_policy_in_the_replay_loop(legged, tmp_path, monkeypatch):
    """`edgeinfer replay --byo-spec launch/legged_example.toml --byo-model ... --log legged.mcap --extra ...`, the
    runtime and control loop as real processes. Every chunk's target equals the policy run offline on the same
    log rows (the pre-roll: row 0 at rest), the same chunk order (last action) and the same observation times
    (phase, from the first chunk's observation): so the runner got the IMU, the command and the phase clock."""
    from edgeinfer import cli
    from edgeinfer.engines.models.byo import ByoPolicy, ByoSpec
    from edgeinfer.logs import read_log
    from edgeinfer.sim import replay as replay_module

    log_path, model = legged
    recordings, stream = [], replay_module.stream

    def recording_stream(*args, **kwargs):  # the replayer's own stream, its Recording kept for the checks below
        recordings.append(stream(*args, **kwargs))
        return recordings[-1]

    monkeypatch.setattr(replay_module, "stream", recording_stream)
    out = tmp_path / "out"
    argv = ["replay", "--byo-spec", str(LEGGED_SPEC), "--byo-model", str(model), "--log", str(log_path),
            "--extra", EXTRA, "--out", str(out), "--plots", "false", "--host-baseline-s", "0"]
    assert cli.main(argv) == 0
    (rec,) = recordings
    report = json.loads((out / "report.json").read_text())
    log = read_log(log_path, extra=EXTRA)
    assert report["observations_sent"] == len(log) == 496  # 2 s at 250 Hz, less the 4 records before the IMU
    assert report["replayer"]["log_source"]["extra_channels"] == {"imu.ang_vel": 3, "imu.gravity": 3, "cmd": 3}
    assert report["replayer"]["log_source"]["dropped_before_extra"] == 4
    assert report["process_exit_codes"] == {"runtime": 0, "control": 0}
    assert report["commands_received"] > 0.8 * len(log)
    assert report["node_stats"]["runtime"]["counters"].get("error.obs_mismatch", 0) == 0
    # one chunk per 5 control ticks (50 Hz policy at 250 Hz), pre-roll included: about (496 + 50) / 5
    ch = rec.chunks
    n = ch.count
    assert 80 <= n <= 115
    order = np.argsort(ch.seq[:n])
    seqs, obs_seq, t_obs = ch.seq[:n][order], ch.obs_seq[:n][order], ch.t_obs_ns[:n][order]
    steps = ch.steps_rad[:n][order]
    assert seqs.tolist() == list(range(1, n + 1))  # every chunk the runtime made reached the replayer, in order
    row_of = _row_of_tick(rec, log)
    policy = ByoPolicy(ByoSpec.load(LEGGED_SPEC, model=model))
    expected, without_imu, without_phase = [], [], []
    for k, t_ns in zip(obs_seq.tolist(), t_obs.tolist()):
        i = row_of.get(k, 0)  # a pre-roll tick: row 0 at rest
        q, qd = log.q_rad[i], (log.qd_rad_s[i] if k in row_of else np.zeros(N_JOINTS))
        channels = {name: v[i] for name, v in log.extra.items()}
        t_s = (t_ns - int(t_obs[0])) / 1e9
        last = policy.last_action.copy()
        target, _ = policy.act(q, qd, channels, t_s)
        expected.append(target)
        np.testing.assert_array_equal(steps[len(expected) - 1, 0], q)  # the chunk's anchor: the observed q
        # the same step, had the runner missed the IMU or the phase clock
        saved = policy.last_action
        policy.last_action = last
        without_imu.append(policy.act(q, qd, channels | {"imu.ang_vel": np.zeros(3), "imu.gravity": np.zeros(3)},
                                      t_s)[0])
        policy.last_action = last
        without_phase.append(policy.act(q, qd, channels, 0.0)[0])
        policy.last_action = saved
    got = steps[:, 1]
    np.testing.assert_allclose(got, np.array(expected), atol=1e-6)
    assert np.abs(got - np.array(without_imu)).max() > 1e-2
    assert np.abs(got - np.array(without_phase)).max() > 1e-2
    # the phase clock went round: the observation times span more than one 0.8 s gait period
    assert (t_obs[-1] - t_obs[0]) / 1e9 > 1.6
