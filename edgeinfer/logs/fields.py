"""Field access shared by the message-based readers (ROS messages as objects, JSON messages as dicts)."""
from __future__ import annotations

from typing import Any, Literal

TimeSource = Literal["header", "log"]
JOINT_STATE = "sensor_msgs/msg/JointState"  # rosbags and MCAP ros2msg spell it this way; ROS 1 bags too via rosbags


def get_field(msg: Any, dotted: str) -> Any:
    """msg.a.b (objects) or msg["a"]["b"] (dicts) for dotted = "a.b"; None when a part is missing."""
    node = msg
    for part in dotted.split("."):
        if isinstance(node, dict):
            node = node.get(part)
        else:
            node = getattr(node, part, None)
        if node is None:
            return None
    return node


def record_time_ns(msg: Any, log_time_ns: int, source: TimeSource) -> int:
    """The record's time: header.stamp (sec + nanosec, or ROS 1's nsec) when source="header" and the stamp
    is set (non-zero), else the time the log stored it (log_time_ns)."""
    if source == "header":
        stamp = get_field(msg, "header.stamp")
        if stamp is not None:
            sec = get_field(stamp, "sec")
            nsec = get_field(stamp, "nanosec")
            if nsec is None:
                nsec = get_field(stamp, "nsec")
            if sec is not None and nsec is not None and (sec or nsec):
                return int(sec) * 1_000_000_000 + int(nsec)
    return int(log_time_ns)


def joint_values(msg: Any, q_field: str, qd_field: str) -> tuple[Any, Any]:
    """(positions, velocities or None) of a JointState-like message; an empty velocity array counts as None
    (ROS leaves it empty when the driver does not report velocities)."""
    q = get_field(msg, q_field)
    qd = get_field(msg, qd_field) if qd_field else None
    if qd is not None and len(qd) == 0:
        qd = None
    return q, qd


def add_joint_state(rec, index: int, msg: Any, log_time_ns: int, q_field: str, qd_field: str,
                    time_source: TimeSource) -> bool:
    """Add one JointState-like message to `rec` (a samples.Records) as record `index`. False when reading must
    stop: the message has no `q_field` (recorded as the bad record), or `rec` refused the record."""
    q, qd = joint_values(msg, q_field, qd_field)
    if q is None:
        rec.fail(index, f"no field {q_field!r}")
        return False
    return rec.add(record_time_ns(msg, log_time_ns, time_source), q, qd)
