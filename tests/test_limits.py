"""Joint limits: read from real URDFs (control/urdf_limits.py), their precedence (given > --urdf > the policy
manifest's "limits" > the Schunk defaults, field by field; control/limits.py), the one joint-count error, and the
users of SafetyLimits (the control loop, the embedded Controller, the replayer's safety check)."""
from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from edgeinfer.control.command import CommandCounters
from edgeinfer.control.gate import LimitGate
from edgeinfer.control.limits import DEFAULT_SOURCE, JointCountError, LimitsError, resolve_limits
from edgeinfer.control.safety import SafetyLimits
from edgeinfer.control.urdf_limits import UrdfError, read_urdf_limits
from edgeinfer.logs.arm_log import ArmLog, synthetic_log
from edgeinfer.sim.preflight import check_run_fits, policy_shape
from edgeinfer.sim.run_config import ReplayConfig

URDF = Path(__file__).resolve().parents[2] / "shared" / "data" / "urdf"
LWA4P, REACHY2 = URDF / "lwa4p" / "lwa4p_generated.urdf", URDF / "reachy2" / "reachy2.urdf"
UR10, UR10_LIMITED = URDF / "ur10" / "ur10_robot.urdf", URDF / "ur10" / "ur10_joint_limited_robot.urdf"
needs_urdf = pytest.mark.skipif(not LWA4P.is_file(), reason="../shared/data/urdf not present")
MANIFEST = {"q_min_rad": [-1.0] * 6, "q_max_rad": [1.0] * 6, "qd_max_rad_s": [0.5] * 6, "source": "fitted",
            "margin": "10% of the range"}

CONTINUOUS = """<robot name="wheel">
  <link name="base"/><link name="a"/><link name="b"/><link name="c"/>
  <joint name="spin" type="continuous"><parent link="base"/><child link="a"/>
    <limit effort="1" velocity="4.0"/></joint>
  <joint name="slide" type="prismatic"><parent link="a"/><child link="b"/>
    <limit lower="0.0" upper="0.3" effort="1" velocity="0"/></joint>
  <joint name="follow" type="revolute"><parent link="b"/><child link="c"/><mimic joint="spin"/>
    <limit lower="-1" upper="1" effort="1" velocity="1"/></joint>
</robot>
"""


@needs_urdf
def test_the_schunk_urdf_gives_its_datasheet_limits_in_file_order():
    lim = read_urdf_limits(LWA4P)
    assert lim.names == [f"arm_{i}_joint" for i in range(1, 7)] and lim.how == "its actuated joints in file order"
    np.testing.assert_array_equal(lim.q_max_rad, [2.947, 2.947, 2.694, 2.947, 2.947, 2.947])
    np.testing.assert_array_equal(lim.q_min_rad, -lim.q_max_rad)
    np.testing.assert_array_equal(lim.qd_max_rad_s, [1.26] * 6)
    # by the log's joint names: their order, not the file's
    named = read_urdf_limits(LWA4P, ["arm_3_joint", "arm_1_joint"], "the log x")
    assert named.names == ["arm_3_joint", "arm_1_joint"] and named.how == "by the joint names of the log x"
    np.testing.assert_array_equal(named.q_max_rad, [2.694, 2.947])


@needs_urdf
def test_ur10_urdfs_full_turn_and_joint_limited():
    full, limited = read_urdf_limits(UR10), read_urdf_limits(UR10_LIMITED)
    assert full.names == limited.names == ["shoulder_pan_joint", "shoulder_lift_joint", "elbow_joint",
                                           "wrist_1_joint", "wrist_2_joint", "wrist_3_joint"]
    np.testing.assert_allclose(full.q_max_rad, [2 * math.pi, 2 * math.pi, math.pi] + [2 * math.pi] * 3, atol=1e-10)
    np.testing.assert_allclose(limited.q_max_rad, [math.pi] * 6, atol=1e-10)
    np.testing.assert_array_equal(full.qd_max_rad_s, [2.16, 2.16, 3.15, 3.2, 3.2, 3.2])


@needs_urdf
def test_reachy2_mimic_joints_are_left_out_and_patterns_choose_the_arms():
    lim = read_urdf_limits(REACHY2)
    assert len(lim.names) == 19  # its LeRobot state is 19-D; the 8 mimic finger joints are not actuated
    assert not any("proximal" in n or "distal" in n for n in lim.names)
    arms = read_urdf_limits(REACHY2, urdf_joints="r_*, l_*")  # the right arm's joints, then the left's
    assert len(arms.names) == 16 and arms.names[0] == "r_shoulder_pitch" and arms.names[8] == "l_shoulder_pitch"
    assert arms.q_min_rad[arms.names.index("r_elbow_pitch")] == -2.25
    assert arms.placeholders() == [n for n in arms.names if not n.endswith("hand_finger")]  # 100 rad/s
    with pytest.raises(UrdfError, match=r"reachy2.urdf: --urdf-joints item 'x_\*' matches no actuated joint"):
        read_urdf_limits(REACHY2, urdf_joints="r_*,x_*")
    with pytest.raises(UrdfError, match=r"chosen twice"):
        read_urdf_limits(REACHY2, urdf_joints="r_*,r_elbow_yaw")
    with pytest.raises(UrdfError, match=r"no actuated joint named \['elbow'\] \(the joint names of the log x\)"):
        read_urdf_limits(REACHY2, ["neck_roll", "elbow"], "the log x")


def test_continuous_joints_have_no_position_limit_and_a_missing_limit_is_named(tmp_path):
    path = tmp_path / "wheel.urdf"
    path.write_text(CONTINUOUS)
    lim = read_urdf_limits(path)
    assert lim.names == ["spin", "slide"]  # the mimic joint is not commanded
    assert lim.q_min_rad.tolist() == [-math.inf, 0.0] and lim.q_max_rad.tolist() == [math.inf, 0.3]
    assert lim.qd_max_rad_s[0] == 4.0 and math.isnan(lim.qd_max_rad_s[1])  # velocity 0: none
    with pytest.raises(UrdfError, match=r"wheel.urdf: joint\(s\) \['slide'\] have no qd_max_rad_s limit .*"
                                        r"--qd-max-rad-s"):
        resolve_limits(SafetyLimits(urdf=path))
    resolved = resolve_limits(SafetyLimits(urdf=path, qd_max_rad_s=1.0))
    counters = CommandCounters()
    q = LimitGate(resolved.limits).admit(np.array([100.0, 0.5]), 0, None, 0.01, counters)
    assert q.tolist() == [100.0, 0.3] and counters.clamped == 1  # a continuous joint may turn any number of times
    q = LimitGate(resolved.limits).admit(np.array([np.nan, 0.1]), 0, None, 0.01, counters)
    assert q.tolist() == [0.0, 0.15]  # no last command: the box centre, 0 where it is unbounded
    assert resolved.section()["q_max_rad"] == [math.inf, 0.3]  # report.json writes inf as null
    with pytest.raises(UrdfError, match="URDF not found"):
        read_urdf_limits(tmp_path / "none.urdf")
    (tmp_path / "bad.urdf").write_text("<robot")
    with pytest.raises(UrdfError, match=r"bad.urdf: not a readable URDF"):
        read_urdf_limits(tmp_path / "bad.urdf")


@needs_urdf
def test_precedence_given_then_urdf_then_manifest_then_defaults_field_by_field():
    # nothing anywhere: the Schunk defaults
    r = resolve_limits(SafetyLimits())
    assert r.limits.q_max_rad == [2.967] * 6 and r.limits.qd_max_rad_s == [2.0] * 6
    assert set(r.sources.values()) == {DEFAULT_SOURCE}
    # the manifest's fitted limits beat the defaults
    r = resolve_limits(SafetyLimits(), manifest_limits=MANIFEST, manifest_name="p.json")
    assert (r.limits.q_max_rad, r.limits.qd_max_rad_s) == ([1.0] * 6, [0.5] * 6)
    assert set(r.sources.values()) == {"manifest p.json"}
    # the URDF beats the manifest
    r = resolve_limits(SafetyLimits(urdf=LWA4P), manifest_limits=MANIFEST, manifest_name="p.json")
    assert r.limits.q_max_rad[2] == 2.694 and r.limits.qd_max_rad_s == [1.26] * 6
    assert set(r.sources.values()) == {f"urdf {LWA4P}"} and r.urdf_joints[0] == "arm_1_joint"
    # given values beat everything, field by field; one speed is spread over the joints
    r = resolve_limits(SafetyLimits(urdf=LWA4P, q_min_rad=[-0.5] * 6, qd_max_rad_s=0.25), manifest_limits=MANIFEST)
    assert (r.limits.q_min_rad, r.limits.q_max_rad[2], r.limits.qd_max_rad_s) == ([-0.5] * 6, 2.694, [0.25] * 6)
    assert r.sources == {"q_min_rad": "given", "q_max_rad": f"urdf {LWA4P}", "qd_max_rad_s": "given"}
    section = r.section()
    assert section["sources"] == r.sources and section["q_max_rad"][2] == 2.694 and section["dt_max_s"] == 0.1
    # every field given: the URDF is not even read
    r = resolve_limits(SafetyLimits(urdf=Path("/nonexistent.urdf"), q_min_rad=[-1.0], q_max_rad=[1.0],
                                    qd_max_rad_s=[3.0]))
    assert set(r.sources.values()) == {"given"} and r.limits.urdf is None


@needs_urdf
def test_placeholder_velocities_are_kept_and_warned_about():
    r = resolve_limits(SafetyLimits(urdf=REACHY2))
    assert r.n_joints == 19 and r.limits.qd_max_rad_s[0] == 100.0  # kept as the URDF says
    assert len(r.warnings) == 1 and "look like placeholders" in r.warnings[0] and "neck_roll" in r.warnings[0]
    assert resolve_limits(SafetyLimits(urdf=REACHY2, qd_max_rad_s=1.0)).warnings == []  # given: no warning


def test_a_malformed_manifest_limits_is_named():
    with pytest.raises(LimitsError, match=r"p.json: limits.qd_max_rad_s must be a list of numbers"):
        resolve_limits(SafetyLimits(), manifest_limits={**MANIFEST, "qd_max_rad_s": "fast"}, manifest_name="p.json")
    with pytest.raises(LimitsError, match=r"p.json: limits.q_min_rad, q_max_rad, qd_max_rad_s have \[6, 6, 5\]"):
        resolve_limits(SafetyLimits(), manifest_limits={**MANIFEST, "qd_max_rad_s": [1.0] * 5}, manifest_name="p.json")
    with pytest.raises(LimitsError, match=r"must be below q_max_rad"):
        resolve_limits(SafetyLimits(), manifest_limits={**MANIFEST, "q_min_rad": [2.0] * 6})


def _log(n_joints: int, names: list[str] | None = None) -> ArmLog:
    log = synthetic_log(seconds=0.5)
    return ArmLog("arm", log.t_s, np.tile(log.q_rad, 3)[:, :n_joints], np.tile(log.qd_rad_s, 3)[:, :n_joints],
                  joint_names=names)


@needs_urdf
def test_one_error_names_the_log_policy_and_limits_counts_and_where_each_comes_from():
    cfg = ReplayConfig()
    policy = policy_shape(cfg.runtime, _log(6))
    assert check_run_fits(_log(6), policy, cfg, 4.0).sources["q_min_rad"] == DEFAULT_SOURCE  # the defaults fit
    with pytest.raises(JointCountError, match=(
            r"^joint counts differ: the log has 16 joints, the policy expects 6, the limits have 6 \(the log: arm, "
            r"its joint positions; the policy: .*schunk_target.json config.n_joints; the limits: "
            r"q_min_rad/q_max_rad/qd_max_rad_s default \(Schunk LWA 4P, 6 joints\)\) - the policy is for another "
            r"robot: train a policy for this robot: edgeinfer train")):  # not --urdf: no limit fixes that
        check_run_fits(_log(16), policy, cfg, 4.0)
    reachy = ReplayConfig()
    reachy.control.limits = SafetyLimits(urdf=REACHY2)
    with pytest.raises(JointCountError, match=(
            r"the log has 6 joints, the policy expects 6, the limits have 19 \(.*the limits: q_min_rad/q_max_rad/"
            r"qd_max_rad_s urdf .*reachy2.urdf \(its actuated joints in file order\)\) - choose the URDF joints .* "
            r"with --urdf-joints")):
        check_run_fits(_log(6), policy, reachy, 4.0)
    # the log's joint names choose the URDF's joints: six of Reachy 2's, in the log's order
    names = ["r_shoulder_pitch", "r_shoulder_roll", "r_elbow_yaw", "r_elbow_pitch", "r_wrist_roll", "neck_yaw"]
    limits = check_run_fits(_log(6, names), policy, reachy, 4.0)
    assert limits.urdf_joints == names and limits.limits.q_min_rad[3] == -2.25 and limits.limits.q_max_rad[5] == 1.57
    assert limits.urdf_how == "by the joint names of the log arm"


def test_the_command_line_takes_one_speed_or_one_per_joint_and_states_the_precedence(tmp_path):
    import argparse

    from edgeinfer.core.config import add_options, build, to_argv

    parser = argparse.ArgumentParser(prog="replay")
    add_options(parser, ReplayConfig)

    def parse(argv):
        return build(ReplayConfig, parser.parse_args(argv)).control.limits

    assert parse([]) == SafetyLimits() and SafetyLimits().q_min_rad is None  # unset: resolved when the run starts
    assert parse(["--qd-max-rad-s", "1.5"]).qd_max_rad_s == 1.5
    per_joint = parse(["--qd-max-rad-s", "1", "2", "3", "--q-min-rad", "-1", "-1", "-1", "--q-max-rad", "1", "1", "1"])
    assert per_joint.qd_max_rad_s == [1.0, 2.0, 3.0]
    assert parse(to_argv(ReplayConfig(control=ReplayConfig().control))) == SafetyLimits()
    urdf = parse(["--urdf", str(tmp_path / "r.urdf"), "--urdf-joints", "r_*,l_*"])
    assert (urdf.urdf, urdf.urdf_joints) == (tmp_path / "r.urdf", "r_*,l_*")
    # a resolved set goes to the control node's command line and comes back the same
    resolved = resolve_limits(SafetyLimits(qd_max_rad_s=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])).limits
    assert parse(to_argv(ReplayConfig(control=type(ReplayConfig().control)(limits=resolved)))) == resolved
    # ... an unlimited (continuous) joint and a fitted limit a hair below zero too: "-inf" and "-2e-05" are values
    unlimited = SafetyLimits(q_min_rad=[-math.inf, -2e-05], q_max_rad=[math.inf, 1.0], qd_max_rad_s=[1.0, 2.0])
    argv = to_argv(ReplayConfig(control=type(ReplayConfig().control)(limits=unlimited)))
    assert argv[argv.index("--q-min-rad") + 1:][:2] == ["-inf", "-2e-05"]
    assert parse(argv) == unlimited
    text = " ".join(parser.format_help().split())
    assert "given here (command line, launch file) > the URDF (--urdf) > the policy manifest's" in text
    with pytest.raises(ValueError, match=r"qd_max_rad_s has 2 entries, q_min_rad 3"):
        SafetyLimits(q_min_rad=[-1.0] * 3, q_max_rad=[1.0] * 3, qd_max_rad_s=[1.0, 2.0])


def test_the_replayers_safety_check_uses_per_joint_speeds():
    from edgeinfer.sim.received import Commands
    from edgeinfer.sim.supervisor import safety_report

    commands = Commands(3, 2)
    for seq, q in enumerate([[0.0, 0.0], [0.01, 0.03], [0.02, 0.04]]):
        commands.put(seq * 10, SimpleNamespace(seq=seq, q_rad=np.array(q), rung="full", obs_seq=seq,
                                               chunk_obs_seq=seq, t_ns=seq * 10))
    # 10 ms ticks: joint 0 may move 0.02 rad, joint 1 0.02: its 0.03 step is over; a scalar 3 rad/s allows it
    report = safety_report(commands, [-1, -1], [1, 1], [2.0, 2.0], 10_000_000)
    assert report["over_velocity_limit"] == 1 and report["commands_checked"] == 3
    assert safety_report(commands, [-1, -1], [1, 1], 3.0, 10_000_000)["over_velocity_limit"] == 0


def test_the_embedded_controller_and_the_control_loop_resolve_their_limits_before_they_run():
    from edgeinfer.control.loop import ControlConfig, ControlLoop
    from edgeinfer.core.transport import Endpoints
    from edgeinfer.node.controller import Controller, ControllerConfig

    # the Controller: its policy's manifest (joint count, "limits"); a stand-in runtime, nothing decoded
    ctl = Controller(ControllerConfig(limits=SafetyLimits(qd_max_rad_s=0.75)))
    ctl.runtime = SimpleNamespace(policy=SimpleNamespace(manifest={"limits": MANIFEST},
                                                         cfg=SimpleNamespace(n_joints=6)))
    ctl._resolve_limits()
    assert (ctl.cfg.limits.q_max_rad, ctl.cfg.limits.qd_max_rad_s) == ([1.0] * 6, [0.75] * 6)
    assert ctl.limit_sources["qd_max_rad_s"] == "given" and ctl.limit_sources["q_min_rad"].startswith("manifest ")
    ctl = Controller(ControllerConfig())
    ctl.runtime = SimpleNamespace(policy=SimpleNamespace(manifest={}, cfg=SimpleNamespace(n_joints=16)))
    with pytest.raises(JointCountError, match=r"the policy expects 16, the limits have 6 .* pass --urdf FILE"):
        ctl._resolve_limits()
    # the control loop node, when it is made: its URDF (no manifest, no joint count known before the run)
    if LWA4P.is_file():
        loop = ControlLoop(ControlConfig(limits=SafetyLimits(urdf=LWA4P)), Endpoints.free_loopback())
        assert loop.cfg.limits.q_max_rad[2] == 2.694 and loop.cfg.limits.urdf is None
    assert ControlLoop(ControlConfig(), Endpoints.free_loopback()).cfg.limits.q_max_rad == [2.967] * 6


def test_a_policy_manifest_without_its_config_is_named(tmp_path):
    from edgeinfer.node.runtime import RuntimeConfig

    (tmp_path / "m.json").write_text('{"factory": "policy.py:build", "config": {"n_joints": 6}}')
    with pytest.raises(ValueError, match=r"m.json: the manifest's \"config\" lacks \['stride_ticks', 'horizon'\]"):
        policy_shape(RuntimeConfig(policy=tmp_path / "m.json"), None)
