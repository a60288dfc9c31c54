"""MCAP joint logs through the `mcap` library: ROS 2 channels (cdr, decoded by mcap-ros2-support) and JSON
channels (a JointState-shaped object: {"header": {"stamp": {"sec", "nanosec"}}, "position": [...],
"velocity": [...]}, field names configurable).

The file is read as a stream in file order (mcap's NonSeekingReader), so a truncated or corrupt file yields
every message before the damage; the summary section is not needed.
"""
from __future__ import annotations

import json
from pathlib import Path

from edgeinfer.logs.arm_log import ArmLog, LogError
from edgeinfer.logs.fields import JOINT_STATE, TimeSource, add_joint_state
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
                  on_error: OnError = "raise") -> ArmLog:
    """Read one topic of an MCAP file into an ArmLog (sorted by time; file-order inversions in `reordered`).

    topic: default the first channel whose schema is sensor_msgs/msg/JointState. q_field/qd_field: dotted
    field paths in the decoded message (qd absent or empty -> finite differences). time_source: "header"
    uses header.stamp, "log" the MCAP log_time. Raises LogError naming the file and the message index on
    the topic (0-based): unreadable/truncated/corrupt record, undecodable message, missing field, joint
    count change; with on_error="truncate" the messages before it are kept. LogError when no message
    matches the topic (listing the topics seen).
    """
    from mcap.reader import NonSeekingReader
    from mcap_ros2.decoder import DecoderFactory

    path = Path(path)
    if not path.is_file():
        raise LogError(f"{path}: missing file")
    rec = Records(f"{path} topic {topic or '(first JointState)'}", on_error, unit="message")
    factory = DecoderFactory()
    decoders: dict[int, object] = {}
    seen: set[str] = set()
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
            if channel.topic != topic:
                continue
            try:
                if channel.id not in decoders:
                    decoders[channel.id] = _decoder(schema, channel, factory)
                msg = decoders[channel.id](message.data)
            except Exception as e:  # a decoder error is a corrupt message, not a crash
                rec.fail(index, f"cannot decode ({type(e).__name__}: {e})")
                break
            if not add_joint_state(rec, index, msg, message.log_time, q_field, qd_field, time_source):
                break
    if len(rec) == 0 and rec.bad_record is None:
        raise LogError(f"{path}: no messages on topic {topic or 'of type ' + JOINT_STATE}; topics: {sorted(seen)}")
    return rec.to_arm_log(path.stem, "mcap")
