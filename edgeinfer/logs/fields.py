"""Field access shared by the message-based readers (ROS messages as objects, JSON messages as dicts)."""
from __future__ import annotations

from typing import Any, Literal

import numpy as np

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
    """Add one JointState-like message to `rec` (a samples.Records) as record `index`, with its `name` field as
    the record's joint names (absent or empty: none). False when reading must stop: the message has no
    `q_field` (recorded as the bad record), or `rec` refused the record (joint names unlike the first's too)."""
    q, qd = joint_values(msg, q_field, qd_field)
    if q is None:
        rec.fail(index, f"no field {q_field!r}")
        return False
    return rec.add(record_time_ns(msg, log_time_ns, time_source), q, qd, names=get_field(msg, "name"))


def joint_names_problem(names: list[str], n_joints: int) -> str | None:
    """Why `names` cannot name `n_joints` joints (another count, a name that is not a non-empty string, a name
    given twice), else None. A URDF's limits are matched by these names (control/urdf_limits.py): a list that
    is off by one joint would put every limit on the wrong joint."""
    if len(names) != n_joints:
        return f"{len(names)} joint names for {n_joints} joints"
    if bad := [n for n in names if not isinstance(n, str) or not n.strip()]:
        return f"joint names {bad} are not names"
    if twice := sorted({n for n in names if names.count(n) > 1}):
        return f"joint name(s) {twice} given twice"
    return None


# --- extra channels: other numeric fields read with the joints (docs/log-formats.md, "Extra channels") --------


def parse_extra(text: str | None) -> dict[str, str]:
    """{channel name: source} of the `extra` reader option "NAME=SOURCE,NAME=SOURCE", in order. The source is
    the format's own: "TOPIC:FIELD|FIELD..." for MCAP and bags, a feature for LeRobot, a column pattern for CSV.
    Names as edgeinfer.core.wire.CHANNEL_NAME (they name the Observation's channels). Raises ValueError naming
    the bad term: no "=", a bad or repeated name, an empty source."""
    from edgeinfer.core.wire import CHANNEL_NAME

    out: dict[str, str] = {}
    for term in (text or "").split(","):
        if not term.strip():
            continue
        name, sep, source = (part.strip() for part in term.partition("="))
        if not sep or not source or not CHANNEL_NAME.fullmatch(name) or name in out:
            why = "repeated name" if name in out else "expected NAME=SOURCE, NAME a letter or _ then letters, " \
                                                      "digits, _ . - (at most 64)"
            raise ValueError(f"extra term {term.strip()!r}: {why}")
        out[name] = source
    return out


def message_channels(text: str | None) -> dict[str, tuple[str, tuple[str, ...]]]:
    """{channel name: (topic, field paths)} of an `extra` option for message logs: "NAME=TOPIC:FIELD|FIELD".
    Raises ValueError naming the term without a topic or a field."""
    out = {}
    for name, source in parse_extra(text).items():
        topic, sep, paths = source.partition(":")
        fields = tuple(p.strip() for p in paths.split("|"))
        if not sep or not topic.strip() or not all(fields):
            raise ValueError(f"extra term {name}={source!r}: expected TOPIC:FIELD, fields joined by '|'")
        out[name] = (topic.strip(), fields)
    return out


_VECTOR = ("x", "y", "z", "w")  # geometry_msgs Vector3, Point (x, y, z) and Quaternion (x, y, z, w)
_GRAVITY = "gravity("


def gravity_in_base(x: float, y: float, z: float, w: float) -> np.ndarray:
    """The gravity direction in the base frame, (3,) float64, for the base orientation quaternion (x, y, z, w)
    (ROS order, base to world; normalised here): g_base = R(q)^T [0, 0, -1], R the rotation matrix of q (the
    third row of R, negated). Level base: [0, 0, -1]. As Isaac Lab's and legged_gym's projected_gravity
    (quat_rotate_inverse(base_quat, [0, 0, -1])). Raises ValueError for a zero or non-finite quaternion."""
    q = np.array([x, y, z, w], dtype=np.float64)
    n = float(np.sqrt(q @ q))
    if not (np.isfinite(n) and n > 0):
        raise ValueError(f"orientation {q.tolist()} is not a rotation")
    x, y, z, w = q / n
    return -np.array([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)])


def _vector(node: Any) -> list | None:
    """[x, y, z(, w)] of a vector-like object or dict, else None."""
    parts = [get_field(node, k) for k in _VECTOR]
    return parts[:4 if parts[3] is not None else 3] if all(p is not None for p in parts[:3]) else None


def field_values(msg: Any, path: str) -> np.ndarray:
    """(k,) float64 values of one field of a decoded message: a number (1), a numeric array (its length), a
    vector or quaternion (3 or 4: x, y, z, w), or "gravity(PATH)": the gravity direction in the frame of the
    quaternion at PATH (3; gravity_in_base). Raises ValueError saying what the field is instead."""
    if path.startswith(_GRAVITY) and path.endswith(")"):
        inner = path[len(_GRAVITY):-1]
        quat = _vector(get_field(msg, inner))
        if quat is None or len(quat) != 4:
            raise ValueError(f"field {inner!r} is not a quaternion (x, y, z, w), needed by {path}")
        return gravity_in_base(*quat)
    node = get_field(msg, path)
    if node is None:
        raise ValueError(f"no field {path!r}")
    if isinstance(node, (int, float, np.number)) and not isinstance(node, bool):
        return np.array([node], dtype=np.float64)
    if (vec := _vector(node)) is not None:
        node = vec
    if isinstance(node, (str, bytes)) or (isinstance(node, (list, tuple)) and any(isinstance(v, str) for v in node)):
        raise ValueError(f"field {path!r} is text, not a number, a numeric array or a vector")
    try:
        values = np.asarray(node, dtype=np.float64)
    except (TypeError, ValueError):
        values = None
    if values is None or values.ndim != 1 or not values.size or values.dtype.kind != "f":
        raise ValueError(f"field {path!r} is {type(node).__name__}, not a number, a numeric array or a vector")
    return values


def add_samples(rec, channels: dict, topic: str, msg: Any, log_time_ns: int, time_source: TimeSource, index: int,
                where: str) -> bool:
    """Add the extra channels that `topic` carries (channels: message_channels) from one decoded message to `rec`
    (a samples.Records) as samples at the message's time (record_time_ns); index and where name the message in
    errors. False when reading must stop: a field is missing or not numeric, or `rec` refused the sample."""
    t_ns = record_time_ns(msg, log_time_ns, time_source)
    for name, (on_topic, paths) in channels.items():
        if on_topic != topic:
            continue
        try:
            values = np.concatenate([field_values(msg, p) for p in paths])
        except ValueError as e:
            rec.fail(index, f"extra channel {name!r}: {e}", where)
            return False
        if not rec.add_sample(name, t_ns, values, index, where):
            return False
    return True


_WILDCARDS = "*?["


def header_joint_names(headers: list[str], pattern: str) -> list[str] | None:
    """The joint names a CSV's position headers carry: each header with the literal text around the wildcards
    of the column-map alternative it matched removed ("pos_*" on pos_shoulder, pos_elbow -> shoulder, elbow;
    "*_q" on hip_q -> hip; an alternative without a wildcard: the header itself). None when they name no joint:
    a name left empty or only digits (q0..q5 under q[0-9]*, joint_1..: numbering, not names), or two equal.
    headers: (D,) the matched columns' names, in column order; pattern: the q= (or qd=) map entry."""
    import fnmatch

    names = []
    for header in headers:
        alt = next(a for a in pattern.split("|") if fnmatch.fnmatchcase(header, a))
        starts = [alt.find(c) for c in _WILDCARDS if c in alt]
        if not starts:
            names.append(header)
            continue
        head = min(starts)
        tail = len(alt) - max(alt.rfind("*"), alt.rfind("?"), alt.rfind("]")) - 1  # literal text after the last
        names.append(header[head:len(header) - tail])
    if any(not n.strip("_-. ") or n.strip("_-. ").isdigit() for n in names) or joint_names_problem(names, len(headers)):
        return None
    return names
