"""rosbag2 (sqlite3 .db3 or mcap storage) and ROS 1 .bag joint logs through `rosbags` (AnyReader).

Message definitions come from the bag; bags without them fall back to the ROS 2 Humble / ROS 1 Noetic
typestores that rosbags ships.
"""
from __future__ import annotations

from pathlib import Path

from edgeinfer.logs.arm_log import ArmLog, LogError
from edgeinfer.logs.fields import JOINT_STATE, TimeSource, add_joint_state, add_samples, message_channels
from edgeinfer.logs.samples import OnError, Records


def bag_paths(path: Path) -> tuple[list[Path], str]:
    """([paths for AnyReader], "rosbag1" | "rosbag2") for a .bag file, a rosbag2 directory, or a .db3/.mcap
    file inside one (its directory is the bag). Raises LogError when it is none of these."""
    if path.is_file() and path.suffix == ".bag":
        return [path], "rosbag1"
    if path.is_file() and path.suffix in (".db3", ".mcap") and (path.parent / "metadata.yaml").is_file():
        return [path.parent], "rosbag2"
    if path.is_dir() and (path / "metadata.yaml").is_file():
        return [path], "rosbag2"
    raise LogError(f"{path}: not a ROS 1 .bag file or a rosbag2 directory (with metadata.yaml)")


def read_rosbag_log(path: str | Path, topic: str | None = None, q_field: str = "position",
                    qd_field: str = "velocity", time_source: TimeSource = "header",
                    on_error: OnError = "raise", extra: str | None = None) -> ArmLog:
    """Read one topic of a ROS 1 or ROS 2 bag into an ArmLog (sorted by time).

    topic: default the first sensor_msgs/msg/JointState connection. time_source: "header" = header.stamp,
    "log" = the bag's receive timestamp. extra: channels from other topics, as read_mcap_log's (held to the
    joint records, logs/samples.py). Raises LogError naming the bag and the 0-based message index on the
    topic for an unreadable or undecodable message (on_error="truncate" keeps the messages before it), for a
    bag rosbags cannot open (an unindexed ROS 1 bag needs `rosbag reindex`; a damaged sqlite3 file), or for a
    missing topic. A rosbag2 in mcap storage that rosbags cannot open (truncated: no file end) is read as an
    MCAP stream (sim.readers.mcap_log), so the messages before the damage stay usable.
    """
    from rosbags.highlevel import AnyReader
    from rosbags.typesys import Stores, get_typestore

    path = Path(path)
    channels = message_channels(extra)
    extra_topics = {t for t, _ in channels.values()}
    paths, kind = bag_paths(path)
    store = get_typestore(Stores.ROS1_NOETIC if kind == "rosbag1" else Stores.ROS2_HUMBLE)
    try:
        reader = AnyReader(paths, default_typestore=store)
        reader.open()
    except Exception as e:  # rosbags raises its own error types and sqlite3/struct errors for damaged files
        mcaps = sorted(paths[0].glob("*.mcap")) if kind == "rosbag2" else []
        if len(mcaps) == 1:
            # rosbags needs an intact file end; mcap storage can still be read as a stream up to the damage
            from edgeinfer.logs.mcap_log import read_mcap_log

            log = read_mcap_log(mcaps[0], topic, q_field, qd_field, time_source, on_error, extra)
            log.source = kind
            return log
        raise LogError(f"{path}: cannot open {kind} ({type(e).__name__}: {e})") from None
    try:
        conns = [c for c in reader.connections if (c.topic == topic if topic else c.msgtype == JOINT_STATE)]
        if not conns:
            topics = sorted(f"{c.topic} ({c.msgtype})" for c in reader.connections)
            raise LogError(f"{path}: no {topic or JOINT_STATE} topic; topics: {topics}")
        joint_topic = conns[0].topic
        if missing := sorted(extra_topics - {c.topic for c in reader.connections}):
            topics = sorted(f"{c.topic} ({c.msgtype})" for c in reader.connections)
            raise LogError(f"{path}: no topic(s) {missing} of the extra channels; topics: {topics}")
        rec = Records(f"{path} topic {joint_topic}", on_error, unit="message", held=tuple(channels))
        n_on_topic = dict.fromkeys(extra_topics, 0)  # messages read per extra topic (their index in errors)
        messages = reader.messages(connections=[c for c in reader.connections
                                                if c.topic == joint_topic or c.topic in extra_topics])
        while True:
            index = len(rec)
            try:
                item = next(messages, None)
            except Exception as e:
                rec.fail(index, f"unreadable ({type(e).__name__}: {e})")
                break
            if item is None:
                break
            conn, t_log_ns, raw = item
            joints = conn.topic == joint_topic
            where, at = (None, index) if joints else (f"{path} topic {conn.topic}", n_on_topic[conn.topic])
            try:
                msg = reader.deserialize(raw, conn.msgtype)
            except Exception as e:
                rec.fail(at, f"cannot decode {conn.msgtype} ({type(e).__name__}: {e})", where)
                break
            if joints and not add_joint_state(rec, index, msg, t_log_ns, q_field, qd_field, time_source):
                break
            if conn.topic in extra_topics:
                n_on_topic[conn.topic] += 1
                if not add_samples(rec, channels, conn.topic, msg, t_log_ns, time_source, at,
                                   f"{path} topic {conn.topic}"):
                    break
    finally:
        reader.close()
    return rec.to_arm_log(path.stem, kind)
