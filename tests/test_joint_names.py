"""Joint names: every reader fills ArmLog.joint_names from what the file names (a JointState's name, LeRobot's
features.<key>.names, CSV headers), and a URDF's limits are matched by those names, not by the order of its
joints. Files are written by each format's own library (mcap + mcap-ros2-support, rosbags, pyarrow) in
tmp_path; the URDF lists the joints in another order than the log, with different limits per joint."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.control.limits import SafetyLimits, resolve_limits
from edgeinfer.control.urdf_limits import UrdfError, read_urdf_limits
from edgeinfer.logs import read_log
from edgeinfer.logs.arm_log import LogError
from edgeinfer.logs.csv_log import read_csv_log
from edgeinfer.logs.lerobot_log import read_lerobot_log
from edgeinfer.logs.mcap_log import read_mcap_log
from edgeinfer.logs.rosbag_log import read_rosbag_log

pytestmark = pytest.mark.skipif(importlib.util.find_spec("yourdfpy") is None, reason="needs yourdfpy")

LOG_ORDER = ["knee", "hip", "ankle"]  # as the robot's driver publishes them
# the URDF lists them in another order, each with its own limits: (lower, upper, velocity)
URDF_LIMITS = {"ankle": (-0.5, 0.6, 7.0), "hip": (-1.5, 1.6, 5.0), "knee": (-2.5, 0.1, 3.0)}
N = 20


def write_urdf(path: Path, limits: dict = URDF_LIMITS) -> Path:
    links = "".join(f'<link name="l{i}"/>' for i in range(len(limits) + 1))
    joints = "".join(
        f'<joint name="{name}" type="revolute"><parent link="l{i}"/><child link="l{i + 1}"/><axis xyz="0 0 1"/>'
        f'<limit lower="{lo}" upper="{hi}" velocity="{v}" effort="10"/></joint>'
        for i, (name, (lo, hi, v)) in enumerate(limits.items()))
    path.write_text(f'<?xml version="1.0"?><robot name="leg">{links}{joints}</robot>')
    return path


def _q(i: int) -> list[float]:
    return [0.01 * i, -0.02 * i, 0.03 * i]  # knee, hip, ankle: joint j moves at its own rate


def write_mcap(path: Path, names_of=lambda i: LOG_ORDER) -> Path:
    from mcap_ros2.writer import Writer
    from rosbags.typesys import Stores, get_typestore

    msgdef, _ = get_typestore(Stores.ROS2_HUMBLE).generate_msgdef("sensor_msgs/msg/JointState", ros_version=2)
    with path.open("wb") as fh:
        writer = Writer(fh)
        schema = writer.register_msgdef("sensor_msgs/msg/JointState", msgdef)
        for i in range(N):
            ns = 1_700_000_000_000_000_000 + i * 4_000_000
            msg = {"header": {"stamp": {"sec": ns // 10**9, "nanosec": ns % 10**9}, "frame_id": ""},
                   "name": names_of(i), "position": _q(i), "velocity": [], "effort": []}
            writer.write_message("/joint_states", schema, msg, log_time=ns)
        writer.finish()
    return path


def test_mcap_joint_names_choose_the_urdf_limits_by_name(tmp_path):
    log = read_mcap_log(write_mcap(tmp_path / "leg.mcap"))
    assert log.joint_names == LOG_ORDER
    np.testing.assert_allclose(log.q_rad[5], _q(5))
    urdf = read_urdf_limits(write_urdf(tmp_path / "leg.urdf"), log.joint_names)
    assert urdf.names == LOG_ORDER and urdf.how == "by the joint names of the log"
    # each column gets its own joint's limits (by order they would be ankle's, hip's, knee's)
    np.testing.assert_array_equal(urdf.q_min_rad, [-2.5, -1.5, -0.5])
    np.testing.assert_array_equal(urdf.q_max_rad, [0.1, 1.6, 0.6])
    np.testing.assert_array_equal(urdf.qd_max_rad_s, [3.0, 5.0, 7.0])
    # and so through the run's limit resolution (sim/preflight passes the log's names)
    resolved = resolve_limits(SafetyLimits(urdf=tmp_path / "leg.urdf"), log.joint_names, f"the log {log.name}")
    np.testing.assert_array_equal(resolved.limits.q_min_rad, [-2.5, -1.5, -0.5])
    assert resolved.urdf_joints == LOG_ORDER


def test_a_joint_the_urdf_lacks_is_refused_by_name(tmp_path):
    log = read_mcap_log(write_mcap(tmp_path / "leg.mcap"))
    no_knee = {k: v for k, v in URDF_LIMITS.items() if k != "knee"} | {"toe": (-1.0, 1.0, 2.0)}
    with pytest.raises(UrdfError, match=r"no actuated joint named \['knee'\].*'toe'"):
        read_urdf_limits(write_urdf(tmp_path / "other.urdf", no_knee), log.joint_names)


def test_a_jointstate_that_reorders_its_names_is_refused_at_that_message(tmp_path):
    swapped = ["hip", "knee", "ankle"]
    path = write_mcap(tmp_path / "swap.mcap", lambda i: swapped if i == 7 else LOG_ORDER)
    with pytest.raises(LogError, match=r"swap.mcap topic /joint_states message 7: joint names \['hip', 'knee', "
                                       r"'ankle'\] differ from \['knee', 'hip', 'ankle'\]"):
        read_mcap_log(path)
    kept = read_mcap_log(path, on_error="truncate")
    assert len(kept) == 7 and kept.truncated_at_row == 7 and kept.joint_names == LOG_ORDER
    # a JointState that names none (empty name[]) leaves the log unnamed, as before
    assert read_mcap_log(write_mcap(tmp_path / "anon.mcap", lambda i: [])).joint_names is None
    with pytest.raises(LogError, match=r"message 0: joint name\(s\) \['hip'\] given twice"):
        read_mcap_log(write_mcap(tmp_path / "twice.mcap", lambda i: ["hip", "hip", "ankle"]))


def test_rosbag2_joint_names(tmp_path):
    from rosbags.rosbag2 import Writer
    from rosbags.typesys import Stores, get_typestore
    from rosbags.typesys.stores.ros2_humble import builtin_interfaces__msg__Time as Time
    from rosbags.typesys.stores.ros2_humble import sensor_msgs__msg__JointState as JointState
    from rosbags.typesys.stores.ros2_humble import std_msgs__msg__Header as Header

    store = get_typestore(Stores.ROS2_HUMBLE)
    with Writer(tmp_path / "bag", version=9) as writer:
        conn = writer.add_connection("/joint_states", "sensor_msgs/msg/JointState", typestore=store)
        for i in range(N):
            msg = JointState(header=Header(stamp=Time(sec=100, nanosec=i * 4_000_000), frame_id=""), name=LOG_ORDER,
                             position=np.array(_q(i)), velocity=np.zeros(0), effort=np.zeros(0))
            writer.write(conn, 100 * 10**9 + i * 4_000_000, store.serialize_cdr(msg, "sensor_msgs/msg/JointState"))
    assert read_rosbag_log(tmp_path / "bag").joint_names == LOG_ORDER


def write_lerobot(root: Path, names) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "meta").mkdir(parents=True)
    scalar = {"dtype": "int64", "shape": [1], "names": None}
    info = {"codebase_version": "v3.0", "fps": 250,
            "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
            "features": {"observation.state": {"dtype": "float32", "shape": [3], "names": names},
                         "timestamp": {"dtype": "float32", "shape": [1], "names": None}, "episode_index": scalar}}
    (root / "meta" / "info.json").write_text(json.dumps(info))
    out = root / "data" / "chunk-000" / "file-000.parquet"
    out.parent.mkdir(parents=True)
    pq.write_table(pa.table({"observation.state": pa.array([_q(i) for i in range(N)], type=pa.list_(pa.float32(), 3)),
                             "timestamp": pa.array(np.arange(N, dtype=np.float32) * 0.004),
                             "episode_index": pa.array(np.zeros(N, dtype=np.int64))}), out)
    return root


@pytest.mark.parametrize("names", [LOG_ORDER, {"motors": LOG_ORDER}], ids=["list", "v2.0-dict"])
def test_lerobot_feature_names(tmp_path, names):
    pytest.importorskip("pyarrow")
    log = read_lerobot_log(write_lerobot(tmp_path / "ds", names))
    assert log.joint_names == LOG_ORDER
    assert read_urdf_limits(write_urdf(tmp_path / "leg.urdf"), log.joint_names).qd_max_rad_s.tolist() == [3, 5, 7]


def test_lerobot_names_that_cannot_name_the_state_are_refused_naming_the_field(tmp_path):
    pytest.importorskip("pyarrow")
    with pytest.raises(LogError, match=r"info.json: features.observation.state.names: 2 joint names for 3 joints"):
        read_lerobot_log(write_lerobot(tmp_path / "ds", ["knee", "hip"]))
    assert read_lerobot_log(write_lerobot(tmp_path / "none", None)).joint_names is None


@pytest.mark.parametrize(("header", "columns", "names"), [
    (["t", "pos_knee", "pos_hip", "pos_ankle", "vel_knee", "vel_hip", "vel_ankle"], "q=pos_*,qd=vel_*", LOG_ORDER),
    (["t", "knee_q", "hip_q", "ankle_q", "knee_qd", "hip_qd", "ankle_qd"], "q=*_q,qd=*_qd", LOG_ORDER),
    (["t", "knee", "hip", "ankle", "v1", "v2", "v3"], "q=knee|hip|ankle,qd=v*", LOG_ORDER),
    (["t", "q0", "q1", "q2", "qd0", "qd1", "qd2"], None, None),  # numbering, not names
    (["t", "joint_1", "joint_2", "joint_3", "v_1", "v_2", "v_3"], "q=joint_*,qd=v_*", None),
], ids=["prefix", "suffix", "exact", "q0-numbering", "joint_N-numbering"])
def test_csv_headers_name_the_joints_when_they_carry_a_name(tmp_path, header, columns, names):
    pytest.importorskip("pyarrow")
    path = tmp_path / "leg.csv"
    path.write_text(",".join(header) + "\n" + "".join(
        f"{i * 0.004!r}," + ",".join(map(repr, _q(i) + [0.0, 0.0, 0.0])) + "\n" for i in range(N)))
    log = read_csv_log(path, columns)
    assert log.joint_names == names
    np.testing.assert_allclose(log.q_rad[3], _q(3))


def test_real_kuka_bag_names_its_joints_out_of_numeric_order(tmp_path):
    """The KUKA LBR bag publishes lbr_joint_1, 2, 3, 0, 4, 5, 6: a URDF listing 0..6 matched by order would put
    joint 0's limits on joint 1. By name, each column gets its own."""
    bag = Path(__file__).resolve().parents[2] / "shared" / "data" / "kuka_lbr_rosbag2" / "rosbag2_2023_02_01-11_21_54"
    if not bag.is_dir():
        pytest.skip(f"real data not present: {bag}")
    log = read_log(bag)
    assert log.joint_names == ["lbr_joint_1", "lbr_joint_2", "lbr_joint_3", "lbr_joint_0", "lbr_joint_4",
                               "lbr_joint_5", "lbr_joint_6"]
    limits = {f"lbr_joint_{i}": (-0.1 * (i + 1), 0.1 * (i + 1), float(i + 1)) for i in range(7)}  # file order 0..6
    urdf = read_urdf_limits(write_urdf(tmp_path / "lbr.urdf", limits), log.joint_names)
    assert urdf.qd_max_rad_s.tolist() == [2.0, 3.0, 4.0, 1.0, 5.0, 6.0, 7.0]
