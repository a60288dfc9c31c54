"""Every log format, written by that format's own library from the real Schunk recording measurement_1,
reads back to the same Observation stream as the Schunk CSV reader; damaged files give one LogError naming the
file and record, and truncating keeps the records before it."""
from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.logs import detect_format, read_log
from edgeinfer.logs.arm_log import ArmLog, LogError, read_schunk
from edgeinfer.logs.samples import arm_log_from_records, backward_differences
from edgeinfer.sim.schedule import observation_stream

pytest.importorskip("mcap")
pytest.importorskip("mcap_ros2")
pytest.importorskip("rosbags")
pytest.importorskip("pyarrow")

BASE_NS = 1_700_000_000_000_000_000  # an absolute epoch, as a real robot's clock would stamp
JOINTS = [f"arm_{i}_joint" for i in range(1, 7)]
STRIDE = 5


@pytest.fixture(scope="module")
def real(schunk_dir) -> ArmLog:
    return read_schunk(schunk_dir / "measurement_1")


def _stamp_ns(t_s: float) -> int:
    return BASE_NS + int(round(t_s * 1e9))


def _ros2_msg(typestore, t_s, q, qd):
    from rosbags.typesys.stores.ros2_humble import builtin_interfaces__msg__Time as Time
    from rosbags.typesys.stores.ros2_humble import sensor_msgs__msg__JointState as JointState
    from rosbags.typesys.stores.ros2_humble import std_msgs__msg__Header as Header

    ns = _stamp_ns(t_s)
    return JointState(header=Header(stamp=Time(sec=ns // 10**9, nanosec=ns % 10**9), frame_id="base"),
                      name=JOINTS, position=np.asarray(q), velocity=np.asarray(qd), effort=np.zeros(0))


# --- writers: each format's own library ------------------------------------------------------------------


def write_generic_csv(log: ArmLog, path: Path) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["stamp_ns"] + [f"pos_{j}" for j in range(6)] + [f"vel_{j}" for j in range(6)])
        for t, q, qd in zip(log.t_s, log.q_rad, log.qd_rad_s):
            w.writerow([_stamp_ns(t), *map(repr, q.tolist()), *map(repr, qd.tolist())])
    return path


def write_mcap_ros2(log: ArmLog, path: Path, chunk_size: int = 1024 * 1024) -> Path:
    from mcap_ros2.writer import Writer
    from rosbags.typesys import Stores, get_typestore

    msgdef, _ = get_typestore(Stores.ROS2_HUMBLE).generate_msgdef("sensor_msgs/msg/JointState", ros_version=2)
    with path.open("wb") as fh:
        writer = Writer(fh, chunk_size=chunk_size)
        schema = writer.register_msgdef("sensor_msgs/msg/JointState", msgdef)
        for t, q, qd in zip(log.t_s, log.q_rad, log.qd_rad_s):
            ns = _stamp_ns(t)
            msg = {"header": {"stamp": {"sec": ns // 10**9, "nanosec": ns % 10**9}, "frame_id": "base"},
                   "name": JOINTS, "position": q.tolist(), "velocity": qd.tolist(), "effort": []}
            writer.write_message("/joint_states", schema, msg, log_time=ns + 150_000)
        writer.finish()
    return path


def write_mcap_json(log: ArmLog, path: Path) -> Path:
    from mcap.writer import Writer

    with path.open("wb") as fh:
        writer = Writer(fh)
        writer.start()
        schema = writer.register_schema("arm.JointSample", "jsonschema", json.dumps(
            {"type": "object", "properties": {"t_ns": {"type": "integer"}, "q": {"type": "array"},
                                              "qd": {"type": "array"}}}).encode())
        writer.register_channel("/noise", "json", schema)  # another topic first: selection must skip it
        chan = writer.register_channel("/arm/state", "json", schema)
        for t, q, qd in zip(log.t_s, log.q_rad, log.qd_rad_s):
            data = json.dumps({"t_ns": _stamp_ns(t), "q": q.tolist(), "qd": qd.tolist()}).encode()
            writer.add_message(chan, log_time=_stamp_ns(t), data=data, publish_time=_stamp_ns(t))
        writer.finish()
    return path


def write_rosbag2(log: ArmLog, path: Path, storage: str = "sqlite3") -> Path:
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_HUMBLE)
    plugin = StoragePlugin.SQLITE3 if storage == "sqlite3" else StoragePlugin.MCAP
    with Writer(path, version=9, storage_plugin=plugin) as writer:
        writer.add_connection("/rosout_agg_like", "std_msgs/msg/String", typestore=store)
        conn = writer.add_connection("/joint_states", "sensor_msgs/msg/JointState", typestore=store)
        for t, q, qd in zip(log.t_s, log.q_rad, log.qd_rad_s):
            raw = store.serialize_cdr(_ros2_msg(store, t, q, qd), "sensor_msgs/msg/JointState")
            writer.write(conn, _stamp_ns(t) + 200_000, raw)
    return path


def write_rosbag1(log: ArmLog, path: Path) -> Path:
    from rosbags.rosbag1 import Writer
    from rosbags.typesys import Stores, get_typestore
    from rosbags.typesys.stores.ros1_noetic import builtin_interfaces__msg__Time as Time
    from rosbags.typesys.stores.ros1_noetic import sensor_msgs__msg__JointState as JointState
    from rosbags.typesys.stores.ros1_noetic import std_msgs__msg__Header as Header

    store = get_typestore(Stores.ROS1_NOETIC)
    with Writer(path) as writer:
        conn = writer.add_connection("/joint_states", "sensor_msgs/msg/JointState", typestore=store)
        for i, (t, q, qd) in enumerate(zip(log.t_s, log.q_rad, log.qd_rad_s)):
            ns = _stamp_ns(t)
            msg = JointState(header=Header(seq=i, stamp=Time(sec=ns // 10**9, nanosec=ns % 10**9), frame_id="base"),
                             name=JOINTS, position=q.copy(), velocity=qd.copy(), effort=np.zeros(0))
            writer.write(conn, ns + 200_000, store.serialize_ros1(msg, "sensor_msgs/msg/JointState"))
    return path


def _features() -> dict:
    vec = {"dtype": "float32", "shape": [6], "names": JOINTS}
    scalar = {"dtype": "int64", "shape": [1], "names": None}
    return {"observation.state": vec, "observation.velocity": vec, "action": vec,
            "timestamp": {"dtype": "float32", "shape": [1], "names": None},
            "frame_index": scalar, "episode_index": scalar, "index": scalar, "task_index": scalar}


def _lerobot_table(log: ArmLog, episode: int, start_index: int):
    import pyarrow as pa

    n = len(log)
    vec = pa.list_(pa.float32(), 6)
    action = np.vstack([log.q_rad[1:], log.q_rad[-1:]])  # the next recorded pose, as teleop data would hold
    return pa.table({
        "observation.state": pa.array(log.q_rad.astype(np.float32).tolist(), type=vec),
        "observation.velocity": pa.array(log.qd_rad_s.astype(np.float32).tolist(), type=vec),
        "action": pa.array(action.astype(np.float32).tolist(), type=vec),
        "timestamp": pa.array(log.t_s.astype(np.float32)),
        "frame_index": pa.array(np.arange(n, dtype=np.int64)),
        "episode_index": pa.array(np.full(n, episode, dtype=np.int64)),
        "index": pa.array(np.arange(start_index, start_index + n, dtype=np.int64)),
        "task_index": pa.array(np.zeros(n, dtype=np.int64)),
    })


def write_lerobot(log: ArmLog, root: Path, version: str, other: ArmLog) -> Path:
    """Episode 1 is `log`; episode 0 is `other`, so the reader must pick the episode, not the first rows."""
    import pyarrow.parquet as pq

    (root / "meta").mkdir(parents=True)
    info = {"codebase_version": version, "robot_type": "schunk_lwa4p", "total_episodes": 2,
            "total_frames": len(log) + len(other), "total_tasks": 1, "chunks_size": 1000, "fps": 250,
            "splits": {"train": "0:2"}, "features": _features()}
    tables = [_lerobot_table(other, 0, 0), _lerobot_table(log, 1, len(other))]
    if version == "v2.1":
        info |= {"total_videos": 0, "total_chunks": 1,
                 "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
                 "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"}
        for ep, table in enumerate(tables):
            out = root / info["data_path"].format(episode_chunk=0, episode_index=ep)
            out.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, out)
        (root / "meta" / "episodes.jsonl").write_text("".join(
            json.dumps({"episode_index": ep, "tasks": ["move"], "length": t.num_rows}) + "\n"
            for ep, t in enumerate(tables)))
        (root / "meta" / "tasks.jsonl").write_text(json.dumps({"task_index": 0, "task": "move"}) + "\n")
    else:
        import pyarrow as pa

        info |= {"data_files_size_in_mb": 100, "video_files_size_in_mb": 500,
                 "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
                 "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"}
        out = root / info["data_path"].format(chunk_index=0, file_index=0)
        out.parent.mkdir(parents=True)
        pq.write_table(pa.concat_tables(tables), out)
        episodes = root / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
        episodes.parent.mkdir(parents=True)
        pq.write_table(pa.table({
            "episode_index": [0, 1], "tasks": [["move"], ["move"]], "length": [t.num_rows for t in tables],
            "data/chunk_index": [0, 0], "data/file_index": [0, 0],
            "dataset_from_index": [0, len(other)], "dataset_to_index": [len(other), len(other) + len(log)]}),
            episodes)
        pq.write_table(pa.table({"task_index": [0], "task": ["move"]}), root / "meta" / "tasks.parquet")
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    return root


# --- identical Observation streams ----------------------------------------------------------------------


def assert_same_stream(log: ArmLog, ref: ArmLog, atol: float = 0.0) -> None:
    got, want = observation_stream(log, STRIDE), observation_stream(ref, STRIDE)
    assert len(got) == len(want) == len(ref)
    assert [o.seq for o in got] == [o.seq for o in want]
    assert [o.t_ns for o in got] == [o.t_ns for o in want]
    for field in ("q_rad", "qd_rad_s", "q_prev_rad"):
        a = np.stack([getattr(o, field) for o in got])
        b = np.stack([getattr(o, field) for o in want])
        if atol:
            np.testing.assert_allclose(a, b, rtol=0, atol=atol, err_msg=field)
        else:
            np.testing.assert_array_equal(a, b, err_msg=field)
    np.testing.assert_allclose(log.t_s, ref.t_s, rtol=0, atol=1e-12)
    assert log.rate_hz == pytest.approx(ref.rate_hz) and log.period_ns == ref.period_ns


def test_schunk_directory_through_read_log(real, schunk_dir):
    log = read_log(schunk_dir / "measurement_1")
    assert log.source == "schunk" and len(log) == 937 and log.period_ns == 4_000_000
    assert_same_stream(log, real)


def test_generic_csv(real, tmp_path):
    path = write_generic_csv(real, tmp_path / "arm.csv")
    log = read_log(path, columns="t=stamp_ns,t_unit=ns,q=pos_*,qd=vel_*")
    assert detect_format(path) == "csv" and log.source == "csv" and not log.qd_from_differences
    assert_same_stream(log, real)


def test_mcap_ros2(real, tmp_path):
    path = write_mcap_ros2(real, tmp_path / "arm.mcap")
    assert detect_format(path) == "mcap"
    log = read_log(path)  # default topic: the JointState channel
    assert log.source == "mcap" and log.reordered == 0
    assert_same_stream(log, real)
    # the MCAP log time (stamp + 150 us here) gives the same stream: a constant offset is removed
    assert_same_stream(read_log(path, time_source="log"), real)


def test_mcap_json_channel(real, tmp_path):
    path = write_mcap_json(real, tmp_path / "arm_json.mcap")
    with pytest.raises(LogError, match="no messages on topic"):
        read_log(path)  # no JointState schema: the topic must be named
    log = read_log(path, topic="/arm/state", q_field="q", qd_field="qd", time_source="log")
    assert_same_stream(log, real)


@pytest.mark.parametrize("storage", ["sqlite3", "mcap"])
def test_rosbag2(real, tmp_path, storage):
    bag = write_rosbag2(real, tmp_path / f"bag_{storage}", storage)
    assert detect_format(bag) == "rosbag2"
    log = read_log(bag)
    assert log.source == "rosbag2"
    assert_same_stream(log, real)
    if storage == "sqlite3":  # the .db3 inside the bag directory names the same bag
        assert_same_stream(read_log(next(bag.glob("*.db3"))), real)


def test_rosbag1(real, tmp_path):
    path = write_rosbag1(real, tmp_path / "arm.bag")
    assert detect_format(path) == "rosbag1"
    log = read_log(path)
    assert log.source == "rosbag1"
    assert_same_stream(log, real)


@pytest.mark.parametrize("version", ["v2.1", "v3.0"])
def test_lerobot(real, schunk_dir, tmp_path, version):
    other = read_schunk(schunk_dir / "measurement_2")
    root = write_lerobot(real, tmp_path / f"ds_{version}", version, other)
    assert detect_format(root) == "lerobot"
    log = read_log(root, episode=1)
    assert log.source == "lerobot" and len(log) == len(real)
    # LeRobot stores float32: values agree to float32 precision, times and ticks exactly
    assert_same_stream(log, real, atol=2e-6)
    assert len(read_log(root, episode=0)) == len(other)


def test_velocity_by_finite_differences(real, tmp_path):
    path = tmp_path / "q_only.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["time"] + [f"q{j}" for j in range(1, 7)])
        w.writerows([[repr(t), *map(repr, q)] for t, q in zip(real.t_s.tolist(), real.q_rad.tolist())])
    with pytest.raises(LogError, match=r"no joint velocity column matches qd='qd\[0-9\]\*'.*--derive qd"):
        read_log(path)  # derived only when asked
    log = read_log(path, derive="qd")
    assert log.qd_from_differences
    np.testing.assert_array_equal(log.q_rad, real.q_rad)
    np.testing.assert_allclose(log.qd_rad_s, backward_differences(real.q_rad, real.t_s))


def test_out_of_order_records_are_sorted_and_counted(real, tmp_path):
    short = ArmLog("short", real.t_s[:50], real.q_rad[:50], real.qd_rad_s[:50])
    path = write_generic_csv(short, tmp_path / "arm.csv")
    lines = path.read_text().splitlines(keepends=True)
    lines[10], lines[11] = lines[11], lines[10]  # rows 9 and 10 swapped in the file
    path.write_text("".join(lines))
    log = read_log(path, columns="t=stamp_ns,t_unit=ns,q=pos_*,qd=vel_*")
    assert log.reordered == 1
    assert_same_stream(log, short)


# --- damaged files: one error naming file and record; truncating keeps what came before ------------------


def _expect_error_then_truncate(path: Path, match: str, **options) -> ArmLog:
    with pytest.raises(LogError, match=match) as err:
        read_log(path, **options)
    assert str(path) in str(err.value) or str(path.parent) in str(err.value)
    return read_log(path, on_error="truncate", **options)


def test_generic_csv_corrupt_line(real, tmp_path):
    path = write_generic_csv(real, tmp_path / "arm.csv")
    lines = path.read_text().splitlines(keepends=True)
    lines[400] = lines[400].replace(",", ",x", 1)  # line 401 (1-based) has a non-number
    path.write_text("".join(lines))
    log = _expect_error_then_truncate(path, "line 401 column 'pos_0': not a number",
                                      columns="t=stamp_ns,t_unit=ns,q=pos_*,qd=vel_*")
    assert log.truncated_at_row == 401 and len(log) == 399
    np.testing.assert_array_equal(log.q_rad, real.q_rad[:399])


def test_mcap_truncated(real, tmp_path):
    path = write_mcap_ros2(real, tmp_path / "arm.mcap", chunk_size=8 * 1024)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    log = _expect_error_then_truncate(path, r"message \d+: unreadable record")
    assert 100 < len(log) < len(real) and log.truncated_at_row == len(log)
    np.testing.assert_array_equal(log.q_rad, real.q_rad[: len(log)])


def test_mcap_corrupt_message(real, tmp_path):
    from mcap.writer import CompressionType
    from mcap_ros2.writer import Writer
    from rosbags.typesys import Stores, get_typestore

    msgdef, _ = get_typestore(Stores.ROS2_HUMBLE).generate_msgdef("sensor_msgs/msg/JointState", ros_version=2)
    path = tmp_path / "arm.mcap"
    with path.open("wb") as fh:
        writer = Writer(fh, compression=CompressionType.NONE)
        schema = writer.register_msgdef("sensor_msgs/msg/JointState", msgdef)
        for i, (t, q, qd) in enumerate(zip(real.t_s[:100], real.q_rad, real.qd_rad_s)):
            ns = _stamp_ns(t)
            msg = {"header": {"stamp": {"sec": ns // 10**9, "nanosec": ns % 10**9}, "frame_id": "base"},
                   "name": JOINTS[: 6 if i != 60 else 5], "position": q.tolist()[: 6 if i != 60 else 5],
                   "velocity": qd.tolist(), "effort": []}
            writer.write_message("/joint_states", schema, msg, log_time=ns)
        writer.finish()
    log = _expect_error_then_truncate(path, "message 60: expected 6 joint positions")
    assert len(log) == 60 and log.truncated_at_row == 60


def test_rosbag2_corrupt_message(real, tmp_path):
    bag = write_rosbag2(ArmLog("s", real.t_s[:200], real.q_rad[:200], real.qd_rad_s[:200]), tmp_path / "bag")
    db = next(bag.glob("*.db3"))
    with sqlite3.connect(db) as con:  # damage message 120's bytes in place, as a bad disk sector would
        (msg_id, data), = con.execute("SELECT id, data FROM messages WHERE topic_id = "
                                      "(SELECT id FROM topics WHERE name = '/joint_states') "
                                      "ORDER BY timestamp LIMIT 1 OFFSET 120").fetchall()
        con.execute("UPDATE messages SET data = ? WHERE id = ?", (data[:30], msg_id))
    log = _expect_error_then_truncate(bag, "message 120: cannot decode")
    assert len(log) == 120
    np.testing.assert_array_equal(log.q_rad, real.q_rad[:120])


def test_rosbag1_truncated_and_corrupt(real, tmp_path):
    short = ArmLog("s", real.t_s[:200], real.q_rad[:200], real.qd_rad_s[:200])
    path = write_rosbag1(short, tmp_path / "arm.bag")
    data = bytearray(path.read_bytes())
    cut = tmp_path / "cut.bag"
    cut.write_bytes(data[: len(data) // 2])  # the index at the end is gone: rosbags cannot open it
    with pytest.raises(LogError, match=f"{cut}: cannot open rosbag1"):
        read_log(cut)
    # message 150's position array claims 2**31 entries: that message cannot be decoded
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS1_NOETIC)
    target = store.serialize_ros1(_ros1_msg(store, short, 150), "sensor_msgs/msg/JointState")
    at = bytes(data).index(bytes(target))
    count_at = at + bytes(target).index((6).to_bytes(4, "little") + short.q_rad[150].tobytes())
    data[count_at:count_at + 4] = (2**31).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    log = _expect_error_then_truncate(path, "message 150")
    assert len(log) == 150


def _ros1_msg(store, log, i):
    from rosbags.typesys.stores.ros1_noetic import builtin_interfaces__msg__Time as Time
    from rosbags.typesys.stores.ros1_noetic import sensor_msgs__msg__JointState as JointState
    from rosbags.typesys.stores.ros1_noetic import std_msgs__msg__Header as Header

    ns = _stamp_ns(log.t_s[i])
    return JointState(header=Header(seq=i, stamp=Time(sec=ns // 10**9, nanosec=ns % 10**9), frame_id="base"),
                      name=JOINTS, position=log.q_rad[i].copy(), velocity=log.qd_rad_s[i].copy(),
                      effort=np.zeros(0))


@pytest.mark.parametrize("version", ["v2.1", "v3.0"])
def test_lerobot_truncated_and_nan(real, schunk_dir, tmp_path, version):
    root = write_lerobot(real, tmp_path / "ds", version, real)
    files = sorted((root / "data").rglob("*.parquet"))
    data = files[-1].read_bytes()
    files[-1].write_bytes(data[: len(data) // 2])
    with pytest.raises(LogError, match=f"{files[-1]} episode 1 frame 0: unreadable parquet"):
        read_log(root, episode=1)
    # a NaN state at frame 300: the frames before it stay usable
    import pyarrow as pa
    import pyarrow.parquet as pq

    bad = ArmLog("bad", real.t_s, real.q_rad.copy(), real.qd_rad_s)
    bad.q_rad[300, 2] = np.nan
    table = _lerobot_table(bad, 1, 0)
    if version == "v3.0":
        table = pa.concat_tables([_lerobot_table(real, 0, 0), table])
    pq.write_table(table, files[-1])
    log = _expect_error_then_truncate(root, "episode 1 frame 300: non-finite", episode=1)
    assert len(log) == 300 and log.truncated_at_row == 300


def test_unknown_format_and_options(tmp_path):
    (tmp_path / "x.txt").write_text("1")
    with pytest.raises(LogError, match="unknown log format"):
        read_log(tmp_path / "x.txt")
    with pytest.raises(LogError, match="not found"):
        read_log(tmp_path / "missing.mcap")
    with pytest.raises(ValueError, match="does not take option"):
        read_log(tmp_path / "x.csv", fmt="csv", topic="/a")


def test_missing_optional_library_names_the_extra(real, tmp_path, monkeypatch):
    import sys

    path = write_mcap_json(ArmLog("s", real.t_s[:10], real.q_rad[:10], real.qd_rad_s[:10]), tmp_path / "a.mcap")
    monkeypatch.setitem(sys.modules, "mcap.reader", None)  # as if mcap were not installed
    with pytest.raises(RuntimeError, match=r"pip install 'edgeinfer\[logs\]'"):
        read_log(path)


def test_off_grid_record_is_named_by_its_record(real, tmp_path):
    from edgeinfer.sim.schedule import tick_grid

    t = real.t_s[:50].copy()
    t[20] += 0.0015  # 0.375 of a period off its tick
    path = write_generic_csv(ArmLog("s", t, real.q_rad[:50], real.qd_rad_s[:50]), tmp_path / "arm.csv")
    with pytest.raises(LogError, match="record 20 .* not on the log's 250.0 Hz tick grid"):
        tick_grid(read_log(path, columns="t=stamp_ns,t_unit=ns,q=pos_*,qd=vel_*"))


@pytest.mark.parametrize("storage", ["sqlite3", "mcap"])
def test_rosbag2_truncated(real, tmp_path, storage):
    bag = write_rosbag2(ArmLog("s", real.t_s[:400], real.q_rad[:400], real.qd_rad_s[:400]), tmp_path / "bag", storage)
    data_file = next(p for p in bag.iterdir() if p.suffix in (".db3", ".mcap"))
    data = data_file.read_bytes()
    data_file.write_bytes(data[: len(data) // 2])
    if storage == "sqlite3":  # sqlite cannot open a database cut in half: nothing is usable, and it says so
        for mode in ("raise", "truncate"):
            with pytest.raises(LogError, match=f"{bag}: cannot open rosbag2 .*malformed"):
                read_log(bag, on_error=mode)
        return
    # mcap storage: read as an MCAP stream up to the damage. rosbags writes these 400 messages as one chunk, so
    # the damage is in the first chunk and nothing before it is usable; the error says which file and where.
    with pytest.raises(LogError, match=r"bag\.mcap topic .* message 0: unreadable record"):
        read_log(bag)
    with pytest.raises(LogError, match=r"bag\.mcap .*truncated at message 0.*fewer than 2 usable records"):
        read_log(bag, on_error="truncate")


def test_repeated_timestamp_names_both_lines(real, tmp_path):
    short = ArmLog("short", real.t_s[:30], real.q_rad[:30], real.qd_rad_s[:30])
    path = write_generic_csv(short, tmp_path / "arm.csv")
    lines = path.read_text().splitlines(keepends=True)
    lines[21] = lines[20]  # data rows 20 and 21 (lines 21 and 22) share a timestamp
    path.write_text("".join(lines))
    with pytest.raises(LogError, match="lines 21 and 22 .*same timestamp"):
        read_log(path, columns="t=stamp_ns,t_unit=ns,q=pos_*,qd=vel_*")


def test_derived_velocities_use_no_later_record():
    # a controller at record i knows q up to i: a derived qd[i] that moved with q[i+1] would give a policy trained
    # or replayed on it one sample of the future (np.gradient's central differences did)
    t_ns = np.arange(6) * 4_000_000
    q = np.cumsum(np.full((6, 2), 0.01), axis=0)
    bumped = q.copy()
    bumped[4] += 1.0
    a = arm_log_from_records("a", "csv", "a.csv", "line", t_ns, q, None, list(range(6)))
    b = arm_log_from_records("b", "csv", "b.csv", "line", t_ns, bumped, None, list(range(6)))
    np.testing.assert_array_equal(a.qd_rad_s[:4], b.qd_rad_s[:4])
    np.testing.assert_allclose(a.qd_rad_s[1:], 2.5)  # 0.01 rad per 4 ms
    assert a.qd_from_differences and np.all(a.qd_rad_s[0] == 0)
