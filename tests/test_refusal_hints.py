"""Refusals that say what to do: a log of another joint count or rate than the policy is refused
with the exact `edgeinfer train` command for that log (the --urdf hint only when the policy matches the log and the
limits alone differ), and a position limit given one value asks for one per joint."""
from __future__ import annotations

import numpy as np
import pytest

from edgeinfer.control.limits import JointCountError, resolve_limits
from edgeinfer.control.safety import SafetyLimits
from edgeinfer.logs.arm_log import ArmLog, LogError, synthetic_log
from edgeinfer.sim.preflight import check_run_fits, policy_shape
from edgeinfer.sim.run_config import ReplayConfig


def _log(n_joints: int, rate_hz: float | None = None) -> ArmLog:
    """The synthetic Schunk log (250 Hz) with n_joints joints, its clock stretched to rate_hz."""
    log = synthetic_log(seconds=0.5)
    t_s = log.t_s if rate_hz is None else np.arange(len(log.t_s)) / rate_hz
    return ArmLog("franka", t_s, np.tile(log.q_rad, 2)[:, :n_joints], np.tile(log.qd_rad_s, 2)[:, :n_joints])


def test_a_log_of_another_robot_is_told_to_train_a_policy_not_to_pass_a_urdf(tmp_path):
    cfg = ReplayConfig(log=tmp_path / "franka.mcap", topic="/franka/joint_states")
    policy = policy_shape(cfg.runtime, _log(6))
    with pytest.raises(JointCountError) as e:
        check_run_fits(_log(7), policy, cfg, 4.0)
    text = str(e.value)
    assert text.startswith("joint counts differ: the log has 7 joints, the policy expects 6, the limits have 6")
    assert "--urdf" not in text
    out = "out/policies/franka_target.json"  # the file name without its suffix
    assert text.endswith(f" - the policy is for another robot: train a policy for this robot: edgeinfer train --data "
                         f"{tmp_path / 'franka.mcap'} --topic /franka/joint_states --out {out}, then edgeinfer "
                         f"replay --policy {out} --log {tmp_path / 'franka.mcap'}")


def test_a_log_at_another_rate_is_told_the_train_command(tmp_path):
    cfg = ReplayConfig(log=tmp_path / "slow.csv", log_format="csv", rate_hz=1.0, extra="imu=gyro_*")
    policy = policy_shape(cfg.runtime, _log(6))
    with pytest.raises(LogError, match=(
            r"^franka: log rate 1\.0 Hz, the policy was trained at 250\.0 Hz \(its chunk step is 5 ticks\) - train a "
            r"policy for this robot: edgeinfer train --data \S*slow\.csv --log-format csv --rate-hz 1\.0 --out "
            r"out/policies/slow_target\.json, then edgeinfer replay --policy out/policies/slow_target\.json "
            r"--log \S*slow\.csv$")):  # --extra is the replay's, not training's
        check_run_fits(_log(6, rate_hz=1.0), policy, cfg, 4.0)


def test_limits_that_alone_differ_keep_the_urdf_hint():
    with pytest.raises(JointCountError, match=r"the log has 7 joints, the policy expects 7, the limits have 6 .* "
                                              r"pass --urdf FILE"):
        resolve_limits(SafetyLimits(), counts={"the log": (7, "franka"), "the policy": (7, "p.json")})


@pytest.mark.parametrize("given, flags", [
    (SafetyLimits(q_min_rad=[-1.0]), "--q-min-rad"),
    (SafetyLimits(q_min_rad=[-1.0], q_max_rad=[1.0]), "--q-min-rad and --q-max-rad"),
])
def test_one_position_limit_value_asks_for_one_per_joint(given, flags):
    counts = {"the log": (6, "arm"), "the policy": (6, "p.json")}
    with pytest.raises(JointCountError, match=(rf"the limits have 1 .* - give one value per joint \(6\) to {flags} "
                                               r"\(only --qd-max-rad-s takes one for every joint\)$")):
        resolve_limits(given, counts=counts)
    assert resolve_limits(SafetyLimits(qd_max_rad_s=[1.5]), counts=counts).limits.qd_max_rad_s == [1.5] * 6
    one_joint = {"the log": (1, "arm"), "the policy": (1, "p.json")}  # one value is one per joint there
    assert resolve_limits(SafetyLimits(q_min_rad=[-1.0], q_max_rad=[1.0], qd_max_rad_s=1.0),
                          counts=one_joint).n_joints == 1
