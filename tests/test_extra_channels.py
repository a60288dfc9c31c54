"""Extra channels: Observation.extra on the wire, the readers' `extra` option (MCAP, rosbag2, ROS 1, LeRobot, CSV)
with the zero-order hold onto the joint records, the gravity direction from an IMU quaternion, the replayer's
observations, and the bring-your-own spec's channel and phase sources."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import msgpack
import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from edgeinfer.core.wire import Observation, ObservationMismatch, WireError, decode, encode, pack_channels
from edgeinfer.logs import read_log
from edgeinfer.logs.arm_log import ArmLog, LogError, read_schunk, synthetic_log
from edgeinfer.logs.fields import field_values, gravity_in_base, parse_extra

BASE_NS = 1_700_000_000_000_000_000  # an absolute epoch, as a robot's clock stamps
IMU_START_NS, IMU_PERIOD_NS = 13_000_000, 5_000_000  # 200 Hz, starting 13 ms after the first joint state
CMD_START_NS, CMD_PERIOD_NS = 5_000_000, 20_000_000  # 50 Hz
JOINTS = [f"arm_{i}_joint" for i in range(1, 7)]
EXTRA = ("imu.ang_vel=/imu:angular_velocity,imu.gravity=/imu:gravity(orientation),"
         "cmd=/cmd_vel:linear.x|linear.y|angular.z")


def joint_log(schunk_root: Path, seconds: float) -> ArmLog:
    """The first `seconds` of the real Schunk measurement_1 (../shared/data), else of the synthetic log."""
    run = schunk_root / "measurement_1"
    log = read_schunk(run) if run.is_dir() else synthetic_log(seconds=seconds + 0.1)
    return log.rows(log.t_s < seconds)


def imu_sample(k: int) -> tuple[int, np.ndarray, np.ndarray]:
    """(t_ns from the log start, angular velocity (3,) rad/s, orientation quaternion (x, y, z, w)) of IMU sample k:
    a base that rolls, pitches and turns, deterministically."""
    t_ns = IMU_START_NS + k * IMU_PERIOD_NS
    t = t_ns / 1e9
    quat = Rotation.from_euler("xyz", [0.3 * np.sin(3 * t), 0.2 * np.cos(2 * t), t]).as_quat()
    return t_ns, np.array([0.1 * np.sin(t), 0.2 * np.cos(t), 0.3 * t]), quat


def cmd_sample(k: int) -> tuple[int, np.ndarray]:
    """(t_ns from the log start, [linear.x m/s, linear.y m/s, angular.z rad/s]) of velocity command k."""
    t_ns = CMD_START_NS + k * CMD_PERIOD_NS
    t = t_ns / 1e9
    return t_ns, np.array([0.5 + 0.1 * t, -0.2 * t, 0.05 * np.sin(t)])


def _stamp(ns: int) -> dict:
    return {"sec": (BASE_NS + ns) // 10**9, "nanosec": (BASE_NS + ns) % 10**9}


def _xyz(v) -> dict:
    return {"x": float(v[0]), "y": float(v[1]), "z": float(v[2])}


def legged_messages(log: ArmLog) -> list[tuple[int, str, str, dict]]:
    """(t_ns from the log start, topic, type, message as a dict) for the joint states, the IMU and the command
    over the log's span, in time order."""
    out = []
    t_end = round(float(log.t_s[-1]) * 1e9)
    for t, q, qd in zip(log.t_s, log.q_rad, log.qd_rad_s):
        ns = round(float(t) * 1e9)
        out.append((ns, "/joint_states", "sensor_msgs/msg/JointState",
                    {"header": {"stamp": _stamp(ns), "frame_id": "base"}, "name": JOINTS, "position": q.tolist(),
                     "velocity": qd.tolist(), "effort": []}))
    k = 0
    while (s := imu_sample(k))[0] <= t_end:
        ns, w, quat = s
        out.append((ns, "/imu", "sensor_msgs/msg/Imu",
                    {"header": {"stamp": _stamp(ns), "frame_id": "base"},
                     "orientation": {"x": quat[0], "y": quat[1], "z": quat[2], "w": quat[3]},
                     "orientation_covariance": [0.0] * 9, "angular_velocity": _xyz(w),
                     "angular_velocity_covariance": [0.0] * 9, "linear_acceleration": _xyz([0, 0, 9.81]),
                     "linear_acceleration_covariance": [0.0] * 9}))
        k += 1
    k = 0
    while (c := cmd_sample(k))[0] <= t_end:  # a Twist has no header: its time is the log time
        ns, v = c
        out.append((ns, "/cmd_vel", "geometry_msgs/msg/Twist",
                    {"linear": _xyz([v[0], v[1], 0.0]), "angular": _xyz([0.0, 0.0, v[2]])}))
        k += 1
    return sorted(out, key=lambda m: m[0])


def write_legged_mcap(log: ArmLog, path: Path, messages: list | None = None) -> Path:
    """An MCAP file (mcap's ROS 2 writer) with JointState, sensor_msgs/Imu and a geometry_msgs/Twist command
    (legged_messages(log), or `messages` in that form)."""
    from mcap_ros2.writer import Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_HUMBLE)
    with path.open("wb") as fh:
        writer = Writer(fh)
        schemas = {}
        for ns, topic, msgtype, msg in legged_messages(log) if messages is None else messages:
            if msgtype not in schemas:
                schemas[msgtype] = writer.register_msgdef(msgtype, store.generate_msgdef(msgtype, ros_version=2)[0])
            writer.write_message(topic, schemas[msgtype], msg, log_time=BASE_NS + ns, publish_time=BASE_NS + ns)
        writer.finish()
    return path


def _typed(store, msgtype: str, value):
    """A rosbags message of `msgtype` from its dict (nested dicts for nested messages)."""
    cls = store.types[msgtype]
    fields = {}
    for name, (kind, spec) in store.fielddefs[msgtype][1]:
        v = value.get(name) if isinstance(value, dict) else None
        if kind == 2:  # a nested message, spec its type
            fields[name] = _typed(store, spec, v or {})
        elif isinstance(v, list) and (not v or not isinstance(v[0], str)):
            fields[name] = np.array(v, dtype=np.float64)
        else:
            fields[name] = v if v is not None else (0 if name == "seq" else "")
    return cls(**fields)


def write_legged_bag(log: ArmLog, path: Path, version: int) -> Path:
    """The same messages as a rosbag2 (sqlite3) bag or a ROS 1 bag, written by rosbags."""
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_HUMBLE if version == 2 else Stores.ROS1_NOETIC)
    if version == 2:
        from rosbags.rosbag2 import Writer

        writer, serialize = Writer(path, version=9), store.serialize_cdr
    else:
        from rosbags.rosbag1 import Writer

        writer, serialize = Writer(path), store.serialize_ros1
    with writer:
        conns = {}
        for ns, topic, msgtype, msg in legged_messages(log):
            if topic not in conns:
                conns[topic] = writer.add_connection(topic, msgtype, typestore=store)
            writer.write(conns[topic], BASE_NS + ns, serialize(_typed(store, msgtype, msg), msgtype))
    return path


# --- the wire ----------------------------------------------------------------------------------------------


def _obs(**kw) -> Observation:
    base = dict(seq=3, t_ns=10, q_rad=np.arange(4.0), qd_rad_s=np.ones(4), q_prev_rad=np.zeros(4))
    return Observation(**base | kw)


def test_observation_round_trips_its_extra_channels():
    extra, layout = pack_channels({"imu.ang_vel": [0.1, -0.2, 0.3], "imu.gravity": np.array([0.0, 0.0, -1.0]),
                                   "phase_hint": 2.5})
    assert layout == "imu.ang_vel:3,imu.gravity:3,phase_hint:1" and extra.shape == (7,)
    got = decode(encode(_obs(extra=extra, extra_layout=layout)))
    np.testing.assert_array_equal(got.extra, extra)
    assert got.extra_layout == layout
    assert {k: v.tolist() for k, v in got.channels().items()} == {
        "imu.ang_vel": [0.1, -0.2, 0.3], "imu.gravity": [0.0, 0.0, -1.0], "phase_hint": [2.5]}


def test_observation_without_extras_is_the_message_it_was():
    """No extras: no fifth frame and no layout key, byte for byte the header the fixed-size message had."""
    frames = encode(_obs())
    assert len(frames) == 4
    header = msgpack.unpackb(frames[0])
    assert "extra_layout" not in header and [a["name"] for a in header["arrays"]] == ["q_rad", "qd_rad_s",
                                                                                       "q_prev_rad"]
    got = decode(frames)
    assert got.extra is None and got.extra_layout == "" and got.channels() == {}


def _with_extra(layout: str, values) -> list:
    """Frames of an observation whose extra array and layout are written by hand (no encode-side check)."""
    frames = encode(_obs())
    header = msgpack.unpackb(frames[0])
    values = np.asarray(values, dtype="<f8")
    if values.size:
        header["arrays"].append({"name": "extra", "dtype": "<f8", "shape": [values.size]})
    if layout:
        header["extra_layout"] = layout
    return [msgpack.packb(header), *frames[1:], *([values.tobytes()] if values.size else [])]


@pytest.mark.parametrize("layout, values, match", [
    ("a:2,b:2", np.zeros(3), r"widths sum to 4, array 'extra' has 3"),
    ("", np.zeros(3), r"extra_layout': '' with an extra array of 3"),
    ("a:3", [], r"extra_layout': 'a:3' with no extra array"),
    ("a:2,a:1", np.zeros(3), r"channel 'a' twice"),
    ("1a:3", np.zeros(3), r"term '1a:3' is not name:width"),
    ("a:²", np.zeros(3), r"term 'a:²' is not name:width"),
    ("a:300", np.zeros(300), r"array 'extra': shape \(300,\): E=300 outside \[1, 256\]"),
])
def test_malformed_extra_is_refused_naming_the_field(layout, values, match):
    with pytest.raises(WireError, match=match) as e:
        decode(_with_extra(layout, values))
    assert e.value.kind == "field"


def test_encode_refuses_an_extra_layout_that_does_not_describe_it():
    with pytest.raises(WireError, match="widths sum to 2, array 'extra' has 3"):
        encode(_obs(extra=np.zeros(3), extra_layout="a:2"))
    with pytest.raises(WireError, match="non-finite"):
        encode(_obs(extra=np.array([np.nan]), extra_layout="a:1"))


# --- the gravity direction and field values ------------------------------------------------------------------


def test_gravity_in_base_against_scipy():
    np.testing.assert_allclose(gravity_in_base(0, 0, 0, 1), [0, 0, -1])
    s = np.sqrt(0.5)  # rolled +90 deg about x: the base's y axis points up, gravity along -y
    np.testing.assert_allclose(gravity_in_base(s, 0, 0, s), [0, -1, 0], atol=1e-15)
    rng = np.random.default_rng(0)
    quats = rng.normal(size=(50, 4))
    for q in quats:  # g_base = R(q)^T [0, 0, -1], R from scipy (x, y, z, w order, normalised there too)
        np.testing.assert_allclose(gravity_in_base(*(3.0 * q)), Rotation.from_quat(q).inv().apply([0, 0, -1]),
                                   atol=1e-12)
    with pytest.raises(ValueError, match="not a rotation"):
        gravity_in_base(0, 0, 0, 0)


def test_field_values_of_numbers_arrays_and_vectors():
    msg = {"a": 2, "v": {"x": 1.0, "y": 2.0, "z": 3.0}, "arr": [1.5, 2.5], "name": ["j1"], "flag": "on"}
    assert field_values(msg, "a").tolist() == [2.0]
    assert field_values(msg, "v").tolist() == [1.0, 2.0, 3.0] and field_values(msg, "v.y").tolist() == [2.0]
    assert field_values(msg, "arr").tolist() == [1.5, 2.5]
    for path, match in (("missing", "no field 'missing'"), ("name", "is text"), ("flag", "is text"),
                        ("gravity(v)", "not a quaternion")):
        with pytest.raises(ValueError, match=match):
            field_values(msg, path)


@pytest.mark.parametrize("text, match", [("imu", "expected NAME=SOURCE"), ("a=x,a=y", "repeated name"),
                                         ("9x=/imu:a", "expected NAME=SOURCE"), ("a=", "expected NAME=SOURCE")])
def test_extra_option_errors_name_the_term(text, match):
    with pytest.raises(ValueError, match=match):
        parse_extra(text)


# --- the readers: zero-order hold onto the joint records -----------------------------------------------------


@pytest.fixture(scope="module")
def joints() -> ArmLog:
    return joint_log(Path(__file__).resolve().parents[2] / "shared" / "data" / "schunk_lwa4p", 0.4)


def _expected_extra(log: ArmLog) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(the joint rows kept, {channel: (kept, width)}): for each joint record the IMU and command sample latest at
    or before it (by the samples' own index arithmetic), gravity by scipy; rows before the first IMU sample
    dropped."""
    t_ns = np.array([round(float(t) * 1e9) for t in log.t_s])
    rows = np.flatnonzero(t_ns >= IMU_START_NS)
    imu = [imu_sample(k) for k in (t_ns[rows] - IMU_START_NS) // IMU_PERIOD_NS]
    cmd = [cmd_sample(k)[1] for k in (t_ns[rows] - CMD_START_NS) // CMD_PERIOD_NS]
    return rows, {"imu.ang_vel": np.array([w for _, w, _ in imu]),
                  "imu.gravity": np.array([Rotation.from_quat(q).inv().apply([0, 0, -1]) for _, _, q in imu]),
                  "cmd": np.array(cmd)}


@pytest.mark.parametrize("fmt", ["mcap", "rosbag2", "rosbag1"])
def test_reader_holds_imu_and_command_to_the_joint_records(joints, tmp_path, fmt):
    pytest.importorskip("mcap_ros2")
    pytest.importorskip("rosbags")
    path = (write_legged_mcap(joints, tmp_path / "legged.mcap") if fmt == "mcap" else
            write_legged_bag(joints, tmp_path / ("legged" if fmt == "rosbag2" else "legged.bag"), int(fmt[-1])))
    log = read_log(path, extra=EXTRA)
    rows, expected = _expected_extra(joints)
    assert log.source == fmt and list(log.extra) == ["imu.ang_vel", "imu.gravity", "cmd"]
    assert log.dropped_before_extra == len(joints) - len(rows) == 4  # the records at 0, 4, 8, 12 ms
    np.testing.assert_array_equal(log.q_rad, joints.q_rad[rows])
    np.testing.assert_allclose(log.t_s, joints.t_s[rows] - joints.t_s[rows[0]], atol=1e-9)
    for name, want in expected.items():
        np.testing.assert_allclose(log.extra[name], want, atol=1e-12, err_msg=name)
    # a record at an IMU sample's own time holds that sample (at or before), not the one before it
    t_ns = np.round(joints.t_s[rows] * 1e9).astype(np.int64)
    on_sample = np.flatnonzero((t_ns - IMU_START_NS) % IMU_PERIOD_NS == 0)
    if on_sample.size:
        k = (t_ns[on_sample[0]] - IMU_START_NS) // IMU_PERIOD_NS
        np.testing.assert_allclose(log.extra["imu.ang_vel"][on_sample[0]], imu_sample(int(k))[1])


def test_reader_errors_name_topic_field_and_message(joints, tmp_path):
    pytest.importorskip("mcap_ros2")
    path = write_legged_mcap(joints, tmp_path / "legged.mcap")
    with pytest.raises(LogError, match=r"no messages on topic\(s\) \['/odom'\] of the extra channels; topics: "
                                       r"\['/cmd_vel', '/imu', '/joint_states'\]"):
        read_log(path, extra="odom=/odom:twist.twist.linear")
    with pytest.raises(LogError, match=r"legged\.mcap topic /imu message 0: extra channel 'acc': no field "
                                       r"'linear_accel'"):
        read_log(path, extra="acc=/imu:linear_accel")
    with pytest.raises(LogError, match=r"topic /imu message 0: extra channel 'c': field 'header' is \w+, not a "
                                       r"number, a numeric array or a vector"):
        read_log(path, extra="c=/imu:angular_velocity|header")
    with pytest.raises(ValueError, match=r"expected TOPIC:FIELD"):
        read_log(path, extra="c=/cmd_vel")
    with pytest.raises(ValueError, match=r"format 'schunk' takes no options"):
        read_log(Path(__file__).parent, fmt="schunk", extra="c=x")


def test_a_bad_imu_sample_names_its_message_and_truncates_there(joints, tmp_path):
    messages = legged_messages(joints)
    [m for m in messages if m[1] == "/imu"][3][3]["angular_velocity"]["y"] = float("nan")
    path = write_legged_mcap(joints, tmp_path / "bad.mcap", messages)
    with pytest.raises(LogError, match=r"bad\.mcap topic /imu message 3: extra channel 'imu.ang_vel': non-finite"):
        read_log(path, extra=EXTRA)
    log = read_log(path, extra=EXTRA, on_error="truncate")
    # the joint records read before it (at or before 28 ms: a record before an IMU sample of the same time), less
    # the 4 before the first IMU sample; the truncation is at the next joint record
    n_read = int(np.sum(np.round(joints.t_s * 1e9) <= imu_sample(3)[0]))
    assert (len(log), log.truncated_at_row, log.dropped_before_extra) == (n_read - 4, n_read, 4)
    np.testing.assert_array_equal(log.q_rad, joints.q_rad[4:n_read])


def test_lerobot_extra_feature_by_name(joints, tmp_path):
    pytest.importorskip("pyarrow")
    from test_readers_formats import write_lerobot

    root = write_lerobot(joints, tmp_path / "ds", "v2.1", joints.rows(slice(0, 20)))
    log = read_log(root, episode=1, extra="teleop=action")
    want = np.vstack([joints.q_rad[1:], joints.q_rad[-1:]]).astype(np.float32)  # the writer's action column
    assert log.extra["teleop"].shape == (len(joints), 6) and log.dropped_before_extra == 0
    np.testing.assert_array_equal(log.extra["teleop"], want.astype(np.float64))
    with pytest.raises(LogError, match=r"no feature 'observation.imu'; features: \["):
        read_log(root, episode=1, extra="imu=observation.imu")
    info = json.loads((root / "meta" / "info.json").read_text())
    info["features"]["observation.images.front"] = {"dtype": "video", "shape": [480, 640, 3], "names": None}
    (root / "meta" / "info.json").write_text(json.dumps(info))
    with pytest.raises(LogError, match=r"extra channel 'cam': feature 'observation.images.front' is 'video', not "
                                       r"numeric"):
        read_log(root, episode=1, extra="cam=observation.images.front")


def test_csv_extra_columns_by_pattern(tmp_path):
    path = tmp_path / "arm.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["t", "q0", "q1", "qd0", "qd1", "gyro_x", "gyro_y", "gyro_z", "cmd"])
        for i in range(5):
            w.writerow([0.01 * i, i, -i, 1, -1, 0.1 * i, 0.2 * i, 0.3 * i, 7 + i])
    log = read_log(path, extra="imu.gyro=gyro_*,cmd=cmd")
    np.testing.assert_allclose(log.extra["imu.gyro"], np.outer(np.arange(5), [0.1, 0.2, 0.3]))
    np.testing.assert_array_equal(log.extra["cmd"][:, 0], 7 + np.arange(5))
    np.testing.assert_array_equal(log.q_rad[:, 0], np.arange(5))  # the joints read as without extras
    with pytest.raises(LogError, match=r"arm\.csv line 1: extra channel x=\'q0\': also read as \['q0'\]"):
        read_log(path, extra="x=q0")
    with pytest.raises(LogError, match=r"arm\.csv line 1: extra channel x='acc_\*': no column in"):
        read_log(path, extra="x=acc_*")


# --- the replayer's observations -----------------------------------------------------------------------------


def test_replayed_observations_carry_the_rows_channels(joints, tmp_path):
    from edgeinfer.sim.schedule import observation_stream

    log = read_log(write_legged_mcap(joints, tmp_path / "legged.mcap"), extra=EXTRA)
    stream = observation_stream(log, stride=5)
    for i in (0, 7, len(log) - 1):
        got = decode(encode(stream[i])).channels()
        assert list(got) == ["imu.ang_vel", "imu.gravity", "cmd"]
        for name, values in got.items():
            np.testing.assert_array_equal(values, log.extra[name][i])


# --- the bring-your-own spec: channel and phase sources --------------------------------------------------------


def _linear_onnx(path: Path, n_in: int, n_out: int, weight: np.ndarray | None = None) -> Path:
    """A one-layer ONNX policy y = x @ W (onnx.helper), W (n_in, n_out) float32."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = np.zeros((n_in, n_out), np.float32) if weight is None else weight.astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["obs", "W"], ["actions"])], "policy",
                              [helper.make_tensor_value_info("obs", TensorProto.FLOAT, [1, n_in])],
                              [helper.make_tensor_value_info("actions", TensorProto.FLOAT, [1, n_out])],
                              [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


SPEC = """
model = "p.onnx"
rate_hz = 50.0
n_joints = 2

[[observation]]
name = "gyro"
source = "channel"
channel = "imu.ang_vel"
units = "rad/s"
width = 3

[[observation]]
name = "cmd_xy"
source = "channel"
channel = "cmd"
select = [0, 1]
units = "m/s"
scale = 2.0

[[observation]]
name = "gait"
source = "phase"
units = "1"
period_s = 0.5

[action]
name = "q_target"
units = "rad"
"""


def _spec(tmp_path: Path, text: str = SPEC, weight=None):
    from edgeinfer.engines.models.byo import ByoSpec

    pytest.importorskip("onnxruntime")
    _linear_onnx(tmp_path / "p.onnx", 7, 2, weight)
    (tmp_path / "p.toml").write_text(text)
    return ByoSpec.load(tmp_path / "p.toml")


def test_byo_channel_and_phase_fields(tmp_path):
    from edgeinfer.engines.models.byo import ByoPolicy, ByoRuntime

    weight = np.zeros((7, 2))
    weight[5, 0] = weight[6, 1] = 1.0  # the policy's action is the phase clock: its targets show what it got
    spec = _spec(tmp_path, weight=weight)
    assert [(f.name, f.width) for f in spec.observation] == [("gyro", 3), ("cmd_xy", 2), ("gait", 2)]
    assert spec.channels() == {"imu.ang_vel": 3, "cmd": 2}
    channels = {"imu.ang_vel": np.array([0.1, 0.2, 0.3]), "cmd": np.array([1.0, -1.0, 9.0])}
    obs = ByoPolicy(spec).observation(np.zeros(2), np.zeros(2), channels, t_s=0.125)  # a quarter period
    np.testing.assert_allclose(obs[0], [0.1, 0.2, 0.3, 2.0, -2.0, 1.0, 0.0], atol=1e-7)
    # the runtime: channels from the Observation, phase from its time since the episode's first observation
    runtime = ByoRuntime(tmp_path / "p.toml")
    runtime.warmup(runtime.warmup_observation())  # zeros for every channel the spec reads
    extra, layout = pack_channels(channels)

    def target(seq: int, t_ns: int) -> np.ndarray:
        return runtime.step(Observation(seq, t_ns, np.zeros(2), np.zeros(2), np.zeros(2), extra, layout)).steps_rad[1]

    got = [target(k, t_ns) for k, t_ns in enumerate((5_000_000_000, 5_250_000_000, 5_375_000_000))]
    np.testing.assert_allclose(got, [[0, 1], [0, -1], [-1, 0]], atol=1e-6)  # t = 0, T / 2, 3 T / 4
    runtime.reset()  # a new episode: the clock starts again at its first observation
    np.testing.assert_allclose(target(9, 7_000_000_000), [0, 1], atol=1e-6)


def test_byo_observation_without_a_channel_is_a_mismatch(tmp_path):
    from edgeinfer.engines.models.byo import ByoRuntime

    _spec(tmp_path)
    runtime = ByoRuntime(tmp_path / "p.toml")
    extra, layout = pack_channels({"imu.ang_vel": [0.1, 0.2, 0.3]})
    with pytest.raises(ObservationMismatch, match=r"p\.toml: observation\[1\] \(cmd_xy\): channel 'cmd' is not in "
                                                  r"the observation \(its channels: \['imu.ang_vel'\]"):
        runtime.step(Observation(0, 0, np.zeros(2), np.zeros(2), np.zeros(2), extra, layout))
    extra, layout = pack_channels({"imu.ang_vel": [0.1, 0.2], "cmd": [1.0, 2.0]})
    with pytest.raises(ObservationMismatch, match=r"observation\[0\] \(gyro\)\.width: 3, but channel 'imu.ang_vel' "
                                                  r"of the observation has 2 values"):
        runtime.step(Observation(0, 0, np.zeros(2), np.zeros(2), np.zeros(2), extra, layout))
    assert runtime.t0_ns is None  # a refused observation does not start the episode's clock


def test_byo_spec_checks_a_logs_channels(tmp_path):
    spec = _spec(tmp_path)
    spec.check_channels({"imu.ang_vel": 3, "cmd": 3}, "the log x")
    with pytest.raises(ObservationMismatch, match=r"p\.toml: observation\[0\] \(gyro\): channel 'imu.ang_vel' is "
                                                  r"not in the log legged \(its channels: none"):
        spec.check_channels({}, "the log legged")
    with pytest.raises(ObservationMismatch, match=r"observation\[1\] \(cmd_xy\)\.select: element 1 is past channel "
                                                  r"'cmd' of the log x, which has 1 values"):
        spec.check_channels({"imu.ang_vel": 3, "cmd": 1}, "the log x")


@pytest.mark.parametrize("edit, match", [
    (('channel = "cmd"\n', ""), r"observation\[1\]\.channel: expected a channel name"),
    (("width = 3\n", ""), r"observation\[0\]\.width: expected the channel's width"),
    (("select = [0, 1]", "select = [0, -1]"), r"observation\[1\]\.select: expected element indices"),
    (("select = [0, 1]", "select = [0, 1]\nwidth = 3"), r"observation\[1\]\.width: 3, but select takes 2"),
    (("period_s = 0.5", "period_s = 0.0"), r"observation\[2\]\.period_s: expected the gait period"),
    (('units = "1"\n', 'units = "1"\nchannel = "x"\n'), r"observation\[2\]\.channel: only for source 'channel'"),
    (("width = 3", "width = 3\nperiod_s = 1.0"), r"observation\[0\]\.period_s: only for source 'phase'"),
])
def test_byo_spec_errors_name_the_field(tmp_path, edit, match):
    with pytest.raises(ValueError, match=r"p\.toml: " + match):
        _spec(tmp_path, SPEC.replace(*edit))
