"""MCAP joint logs through the `mcap` library: ROS 2 channels (cdr, decoded by mcap-ros2-support) and JSON
channels (a JointState-shaped object: {"header": {"stamp": {"sec", "nanosec"}}, "position": [...],
"velocity": [...]}, field names configurable).

The file is read as a stream in file order (mcap's NonSeekingReader), so a truncated or corrupt file yields
every message before the damage; the summary section is not needed. Extra channels (the `extra` option, fields
of other topics: an IMU, a velocity command) are read in the same pass and held to the joint records
(logs/samples.py).
"""
from __future__ import annotations

import json
from pathlib import Path

from edgeinfer.logs.arm_log import ArmLog, LogError
from edgeinfer.logs.fields import JOINT_STATE, TimeSource, add_joint_state, add_samples, message_channels
from edgeinfer.logs.samples import OnError, Records


def _decoder(schema, channel, factory):
    if channel.message_encoding == "json":
        return lambda data: json.loads(data)
    decoder = factory.decoder_for(channel.message_encoding, schema)
    if decoder is None:
        raise LogError(f"channel {channel.topic!r}: no decoder for encoding {channel.message_encoding!r}")
    return decoder


def _is_default_topic(schema, channel) -> bool:
    return schema is not None and schema.name in (JOINT_STATE, "sensor_msgs/JointState")


def read_mcap_log(path: str | Path, topic: str | None = None, q_field: str = "position",
                  qd_field: str = "velocity", time_source: TimeSource = "header",
                  on_error: OnError = "raise", extra: str | None = None) -> ArmLog:
    """Read one topic of an MCAP file into an ArmLog (sorted by time; file-order inversions in `reordered`).

    topic: default the first channel whose schema is sensor_msgs/msg/JointState. q_field/qd_field: dotted
    field paths in the decoded message (qd absent or empty -> finite differences). time_source: "header"
    uses header.stamp, "log" the MCAP log_time (for every topic; a message without a header: its log_time).
    extra: "NAME=TOPIC:FIELD|FIELD,..." channels into ArmLog.extra (fields.field_values; held to the joint
    records, those before a channel's first sample dropped: logs/samples.py). Raises LogError naming the file
    and the message index on the topic (0-based): unreadable/truncated/corrupt record, undecodable message,
    missing field, joint count or channel width change; with on_error="truncate" the messages before it are
    kept. LogError when no message matches the topic or an extra channel's topic (listing the topics seen).
    ValueError for a malformed `extra`.
    """
    from mcap.reader import NonSeekingReader
    from mcap_ros2.decoder import DecoderFactory

    path = Path(path)
    channels = message_channels(extra)
    extra_topics = {t for t, _ in channels.values()}
    if not path.is_file():
        raise LogError(f"{path}: missing file")
    rec = Records(f"{path} topic {topic or '(first JointState)'}", on_error, unit="message", held=tuple(channels))
    factory = DecoderFactory()
    decoders: dict[int, object] = {}
    seen: set[str] = set()
    n_on_topic: dict[str, int] = {}  # messages read per extra topic (their index in errors)
    with path.open("rb") as fh:
        messages = NonSeekingReader(fh, validate_crcs=True).iter_messages(log_time_order=False)
        while True:
            index = len(rec)
            try:
                item = next(messages, None)
            except Exception as e:  # the mcap library raises several types for damaged bytes
                rec.fail(index, f"unreadable record after {index} messages ({type(e).__name__}: {e})")
                break
            if item is None:
                break
            schema, channel, message = item
            seen.add(channel.topic)
            if topic is None and _is_default_topic(schema, channel):
                topic = channel.topic
                rec.where = f"{path} topic {topic}"
            if channel.topic != topic and channel.topic not in extra_topics:
                continue
            joints = channel.topic == topic
            where, at = (None, index) if joints else (f"{path} topic {channel.topic}", n_on_topic.get(channel.topic, 0))
            try:
                if channel.id not in decoders:
                    decoders[channel.id] = _decoder(schema, channel, factory)
                msg = decoders[channel.id](message.data)
            except Exception as e:  # a decoder error is a corrupt message, not a crash
                rec.fail(at, f"cannot decode ({type(e).__name__}: {e})", where)
                break
            if joints and not add_joint_state(rec, index, msg, message.log_time, q_field, qd_field, time_source):
                break
            if channel.topic in extra_topics:
                n_on_topic[channel.topic] = n_on_topic.get(channel.topic, 0) + 1
                if not add_samples(rec, channels, channel.topic, msg, message.log_time, time_source,
                                   n_on_topic[channel.topic] - 1, f"{path} topic {channel.topic}"):
                    break
    if len(rec) == 0 and rec.bad_record is None:
        raise LogError(f"{path}: no messages on topic {topic or 'of type ' + JOINT_STATE}; topics: {sorted(seen)}")
    if rec.bad_record is None and (missing := sorted(extra_topics - set(n_on_topic))):
        raise LogError(f"{path}: no messages on topic(s) {missing} of the extra channels; topics: {sorted(seen)}")
    return rec.to_arm_log(path.stem, "mcap")
