"""run.mcap: a finished replay or hil run as an MCAP file that Foxglove opens without plugins.

Written after the run from what the replayer recorded (sim/received.py columns, the per-tick arrays of
sim.metrics.summarize), never in the hot path. It covers the log's rows (the headline's ticks, as ticks.csv);
the pre-roll's ticks are start-up and are left out. Six topics, JSON messages ("json" encoding) with a JSON
Schema each ("jsonschema" encoding), so that Foxglove's panels read every field; each message's log time is
the scheduled time of its tick, so that the tracks line up, on the wall clock (ns since 1970: Foxglove shows the
run's date), mapped once from the replayer's monotonic clock (Recording.wall_offset_ns); the monotonic stamps
stay in the messages as fields (t_sched_ns, t_sent_ns, t_recv_ns: one clock with the report's):

    /observation   one per row sent: q_rad, qd_rad_s as the log recorded them (publish time: when sent)
    /action_chunk  the last chunk planned from each row: steps (q_rad per step), rung, tokens, target passes,
                   drafted/accepted, t_obs_ns/t_ready_ns (the runtime's clock), latency (publish time: receipt)
    /command       the command for each row's tick that got one: q_rad, rung, latency (publish time: receipt)
    /tick          one per row: latency_ms (absent: lost), outcome, deadline_miss 0/1, rung, stage times
    /joint_states  the observation's q, qd as sensor_msgs/msg/JointState (name[], position[], velocity[],
                   header.stamp {sec, nsec} wall clock): Foxglove's 3D panel poses a URDF from it, by joint name
    /joint_commands the command's q in the same schema (a second URDF layer shows command against state)
Joint names: the log's (ArmLog.joint_names), else the URDF joints the run's limits were read for, else
joint_1..joint_D (placeholders; a URDF layer then matches nothing): metadata "edgeinfer.joint_states" says which.

Metadata records: "edgeinfer.config" (the run's configuration, dotted keys), "edgeinfer.headline" (the report's
headline figures) and "edgeinfer.joint_states" (names, where they came from, wall_offset_ns); values are JSON
text. MCAP: https://mcap.dev/spec; Foxglove's JSON channels:
https://docs.foxglove.dev/docs/visualization/message-schemas/introduction.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from pathlib import Path

import msgspec
import numpy as np
from rich.markup import escape

from edgeinfer.core.clock import now_ns
from edgeinfer.core.extras import install_hint
from edgeinfer.core.wire import RUNGS
from edgeinfer.sim.metrics import OUTCOMES, measured_chunks, row_of_tick
from edgeinfer.sim.received import NONE

FILE = "run.mcap"
# Foxglove reads a channel's field types from its JSON Schema: one "type" per field (no ["number", "null"]), an
# object's "properties" listed, an array's items of one type (objects, not arrays, for nested ones). A value
# that does not exist (a lost tick's latency, a stage not timed) is left out of its message, never null.
NUMBERS = {"type": "array", "items": {"type": "number"}}
INT, NUM, STR = {"type": "integer"}, {"type": "number"}, {"type": "string"}
_ROW = {"tick": INT, "row": INT}  # tick: on the log's own grid (as ticks.csv); row: the observation's index
_ABSENT = object()
_STAMP = {"type": "object", "properties": {"sec": INT, "nsec": INT}, "required": ["sec", "nsec"],
          "additionalProperties": False}
# sensor_msgs/msg/JointState as Foxglove reads it from JSON (its schema name picks the 3D panel's joint states),
# plus the row it came from and its monotonic stamp
JOINT_STATE = ("sensor_msgs/msg/JointState", {
    "header": {"type": "object", "properties": {"stamp": _STAMP, "frame_id": STR}, "required": ["stamp", "frame_id"],
               "additionalProperties": False},
    "name": {"type": "array", "items": STR}, "position": NUMBERS, "velocity": NUMBERS, "effort": NUMBERS,
    **_ROW, "t_ns": INT})

SCHEMAS = {  # topic -> (schema name, {field: JSON Schema})
    "/observation": ("edgeinfer.Observation", {**_ROW, "t_sent_ns": INT, "q_rad": NUMBERS, "qd_rad_s": NUMBERS}),
    "/action_chunk": ("edgeinfer.ActionChunk", {
        **_ROW, "t_recv_ns": INT, "seq": INT, "rung": STR, "rung_index": INT, "tokens": INT, "target_passes": INT,
        "drafted": INT,
        "accepted": INT, "n_steps": INT, "step_ms": NUM, "t_obs_ns": INT, "t_ready_ns": INT, "latency_ms": NUM,
        "first_action_ms": NUM,
        "steps": {"type": "array", "items": {"type": "object", "properties": {"q_rad": NUMBERS},
                                             "required": ["q_rad"], "additionalProperties": False}}}),
    "/command": ("edgeinfer.JointCommand", {**_ROW, "t_recv_ns": INT, "chunk_tick": INT, "rung": STR, "rung_index": INT,
                                            "q_rad": NUMBERS, "latency_ms": NUM, "at_control_send_ms": NUM}),
    "/tick": ("edgeinfer.Tick", {
        **_ROW, "t_s": NUM, "t_sched_ns": INT, "latency_ms": NUM, "at_control_send_ms": NUM, "send_lateness_ms": NUM,
        "deadline_ms": NUM, "deadline_miss": INT, "outcome": STR, "outcome_index": INT, "rung": STR,
        "rung_index": INT, "stages_ms": {"type": "object"}}),  # stages_ms: its properties are the run's stages
    "/joint_states": JOINT_STATE,  # t_ns: when the observation was scheduled (its row's tick)
    "/joint_commands": JOINT_STATE,  # t_ns: when the command was received
}
# fields a message may lack: a lost tick has no latency; a hold from no chunk names none
OPTIONAL = {"/tick": ("latency_ms", "at_control_send_ms", "send_lateness_ms"), "/command": ("chunk_tick",)}
# report keys (dotted) in the headline metadata; a missing one is left out
HEADLINE = ("schema", "log", "rate_hz", "deadline_ms", "decode", "engine", "drafter", "budget_ms", "k_max",
            "interrupted", "observations_sent", "commands_received", "deadline_misses", "miss_rate",
            "miss_rate_ci95", "miss_rate_scope", "latency_ms", "latency_ci95_ms", "outcomes", "fallbacks",
            "start_up.time_to_first_command_ms", "chunks.received", "chunks.time_to_chunk_ms", "spec",
            "quality.action_rmse_rad", "slo.verdict", "network.round_trip_ms", "hil.obs_to_command_ms")


def json_schema(topic: str, stages: tuple[str, ...] = ()) -> dict:
    """The JSON Schema (draft 2020-12) of `topic`'s messages; for /tick, stages_ms holds `stages` (each optional:
    a stage not timed on a tick is left out)."""
    name, props = SCHEMAS[topic]
    if topic == "/tick":
        props = props | {"stages_ms": {"type": "object", "properties": dict.fromkeys(stages, NUM),
                                       "additionalProperties": False}}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": name, "type": "object",
            "properties": props, "required": [k for k in props if k not in OPTIONAL.get(topic, ())],
            "additionalProperties": False}


def stage_names(per_tick: dict) -> tuple[str, ...]:
    """per_tick's stage names as message fields (a field path in Foxglove takes letters, digits and _ only)."""
    return tuple(re.sub(r"\W+", "_", k) for k in per_tick["stages_ms"])


def wall_offset_ns() -> int:
    """time.time_ns() - clock.now_ns() (time.perf_counter_ns, CLOCK_MONOTONIC on Linux) now: added to a monotonic
    stamp it gives the wall clock (ns since 1970). Taken once per run (at its start: Recording.start), so every
    stamp moves by the same amount and the run's intervals stay exact."""
    return time.time_ns() - now_ns()


def joint_names(log, report: dict) -> tuple[list[str], str]:
    """(D,) names for /joint_states and where they come from: the log's, else the URDF joints the run's limits
    were read for (report["limits"]["urdf_joints"]), else placeholders joint_1..joint_D."""
    if log.joint_names is not None:
        return list(log.joint_names), f"the log {log.name}"
    urdf = (report.get("limits") or {}).get("urdf_joints")
    if urdf is not None and len(urdf) == log.n_joints:
        return list(urdf), "the URDF of the run's limits"
    return [f"joint_{i + 1}" for i in range(log.n_joints)], "placeholders (the log names no joints)"


def write_run_mcap(rec, log, report: dict, per_tick: dict, cfg, path: Path) -> dict:
    """Write the run as MCAP at `path` (a temporary file renamed: never half a file) and say what was written.

    rec: sim/replay.Recording; log: the ArmLog replayed (rows row-aligned with rec); report, per_tick:
    sim.metrics.summarize's (per_tick's stages_ms: {stage: (n,) ms}); cfg: the run's config dataclass.
    Log and publish times: the monotonic stamps plus rec.wall_offset_ns (None: wall_offset_ns() now).
    Returns {"file": name, "bytes", "write_s" (s, monotonic), "messages": {topic: count}}, or
    {"file": None, "skipped": why} when the mcap library is missing or the file cannot be written.
    """
    try:
        from mcap.writer import Writer
    except ImportError as e:
        return {"file": None, "skipped": f"the mcap library is not installed ({e}): {install_hint('logs')}",
                "missing_library": True}
    t_start = time.perf_counter()
    path = Path(path)
    tmp = path.with_suffix(".mcap.tmp")
    try:
        with open(tmp, "wb") as fh:
            writer = Writer(fh)
            writer.start(profile="", library="edgeinfer")
            stages = stage_names(per_tick)
            channels = {topic: writer.register_channel(topic, "json", writer.register_schema(
                name, "jsonschema", json.dumps(json_schema(topic, stages)).encode()))
                for topic, (name, _) in SCHEMAS.items()}
            counts = dict.fromkeys(SCHEMAS, 0)
            offset = rec.wall_offset_ns if rec.wall_offset_ns is not None else wall_offset_ns()
            names, names_from = joint_names(log, report)
            for topic, log_ns, publish_ns, row, msg in messages(rec, log, report, per_tick, names, offset):
                writer.add_message(channels[topic], log_ns + offset, msgspec.json.encode(msg), publish_ns + offset,
                                   row)
                counts[topic] += 1
            writer.add_metadata("edgeinfer.config", _flat(dataclasses.asdict(cfg)))
            writer.add_metadata("edgeinfer.headline", headline(report, log))
            writer.add_metadata("edgeinfer.joint_states", _flat({"names": names, "names_from": names_from,
                                                                 "wall_offset_ns": offset}))
            writer.finish()
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        return {"file": None, "skipped": f"cannot write {path}: {e}"}
    return {"file": path.name, "bytes": path.stat().st_size, "write_s": round(time.perf_counter() - t_start, 3),
            "messages": counts}


def messages(rec, log, report: dict, per_tick: dict, names: list[str], offset_ns: int):
    """Yield (topic, log_time_ns, publish_time_ns, row, message dict) for every row, in log-time order, times on
    the monotonic clock: its observation and joint state (if sent), its tick, its command and joint command (if
    one came), the chunk planned from it (if any). names: (D,) the joint states' names; offset_ns: monotonic to
    wall clock (wall_offset_ns), for their header stamps."""
    n = len(per_tick["outcome"])
    sched = rec.t_sched_ns[:n].tolist()
    sent = rec.t_sent_ns[:n].tolist()
    skipped = rec.skipped[:n].tolist() if rec.skipped is not None else [False] * n
    pre = rec.pre_roll_ticks
    q_log, qd_log = log.q_rad[:n].tolist(), log.qd_rad_s[:n].tolist()
    tick_msgs = _ticks(per_tick, report["deadline_ms"])
    cmds, ctick = rec.commands, rec.tick[:n]
    has_cmd = (cmds.rung[ctick] != NONE).tolist()
    ch = rec.chunks
    slots, rows = measured_chunks(rec, row_of_tick(rec, n))
    slot_of_row = np.full(n, -1, dtype=np.int64)
    slot_of_row[rows] = slots
    for i in range(n):
        tick, t = tick_msgs[i]["tick"], sched[i]
        if not skipped[i] and sent[i]:
            yield "/observation", t, sent[i], i, {"tick": tick, "row": i, "t_sent_ns": sent[i], "q_rad": q_log[i],
                                                  "qd_rad_s": qd_log[i]}
            yield "/joint_states", t, sent[i], i, _joint_state(names, q_log[i], qd_log[i], tick, i, t, offset_ns)
        yield "/tick", t, t, i, tick_msgs[i] | {"t_sched_ns": t}
        if has_cmd[i]:
            k = int(ctick[i])
            chunk_obs = int(cmds.chunk_obs_seq[k])
            t_recv, q_cmd = int(cmds.t_recv_ns[k]), cmds.q_rad[k].tolist()
            yield "/command", t, t_recv, i, {
                "tick": tick, "row": i, "t_recv_ns": t_recv,
                **({"chunk_tick": chunk_obs - pre} if chunk_obs >= 0 else {}),
                "rung": RUNGS[cmds.rung[k]], "rung_index": int(cmds.rung[k]), "q_rad": q_cmd,
                "latency_ms": tick_msgs[i]["latency_ms"], "at_control_send_ms": tick_msgs[i]["at_control_send_ms"]}
            yield "/joint_commands", t, t_recv, i, _joint_state(names, q_cmd, [], tick, i, t_recv, offset_ns)
        if (s := int(slot_of_row[i])) >= 0:
            c = ch.chunk(s)
            yield "/action_chunk", t, int(ch.t_recv_ns[s]), i, {
                "tick": tick, "row": i, "t_recv_ns": int(ch.t_recv_ns[s]), "seq": c.seq, "rung": c.rung,
                "rung_index": int(ch.rung[s]),
                "tokens": c.tokens, "target_passes": c.target_passes, "drafted": c.drafted, "accepted": c.accepted,
                "n_steps": len(c.steps_rad), "step_ms": c.step_ns / 1e6, "t_obs_ns": c.t_obs_ns,
                "t_ready_ns": c.t_ready_ns, "latency_ms": (int(ch.t_recv_ns[s]) - t) / 1e6,
                "first_action_ms": (int(ch.t_first_recv_ns[s]) - t) / 1e6,
                "steps": [{"q_rad": q} for q in c.steps_rad.tolist()]}


def _joint_state(names: list[str], q: list, qd: list, tick: int, row: int, t_ns: int, offset_ns: int) -> dict:
    """A JOINT_STATE message: q rad, qd rad/s ([]: none) named `names`, stamped t_ns (monotonic) on the wall
    clock (+ offset_ns) as header.stamp {sec, nsec}."""
    sec, nsec = divmod(t_ns + offset_ns, 1_000_000_000)
    return {"header": {"stamp": {"sec": sec, "nsec": nsec}, "frame_id": ""}, "name": names, "position": q,
            "velocity": qd, "effort": [], "tick": tick, "row": row, "t_ns": t_ns}


def _ticks(per_tick: dict, deadline_ms: float) -> list[dict]:
    """One /tick message per row of per_tick, NaN fields left out (JSON has no NaN)."""
    col = {k: np.asarray(per_tick[k]).tolist() for k in ("tick", "t_s", "latency_ms", "at_control_send_ms",
                                                          "send_lateness_ms", "outcome", "rung")}
    stages = dict(zip(stage_names(per_tick), (v.tolist() for v in per_tick["stages_ms"].values())))
    out = []
    for i, (outcome, rung) in enumerate(zip(col["outcome"], col["rung"])):
        msg = {k: v[i] for k, v in col.items()} | {
            "row": i, "deadline_ms": deadline_ms, "deadline_miss": int(outcome != "on_time"),
            "outcome_index": OUTCOMES.index(outcome), "rung_index": RUNGS.index(rung) if rung else NONE,
            "stages_ms": {k: v[i] for k, v in stages.items() if v[i] == v[i]}}
        out.append({k: v for k, v in msg.items() if v == v})  # NaN != NaN
    return out


def headline(report: dict, log) -> dict[str, str]:
    """The HEADLINE figures of `report` and the log's joint names, flattened to dotted keys, values as JSON."""
    picked = {}
    for key in HEADLINE:
        value = report
        for part in key.split("."):
            value = value.get(part, _ABSENT) if isinstance(value, dict) else _ABSENT
        if value is not _ABSENT:
            picked[key] = value
    picked["joint_names"] = log.joint_names
    return _flat(picked)


def _flat(tree: dict, prefix: str = "") -> dict[str, str]:
    """{dotted key: JSON text} of a nested dict (Paths and other objects as their str; NaN as null)."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = msgspec.json.encode(v, enc_hook=str).decode()
    return out


def run_mcap_section(rec, log, report: dict, per_tick: dict, cfg, console=None) -> dict:
    """report.json's "run_mcap": cfg.out/run.mcap written (write_run_mcap's result), or why not (cfg.run_mcap
    false, the mcap library missing, an unwritable file: the last also printed on `console`, a rich Console; the
    missing library is said before the run, session.prepare)."""
    if not cfg.run_mcap:
        return {"file": None, "skipped": "run_mcap is false (--run-mcap false)"}
    result = write_run_mcap(rec, log, report, per_tick, cfg, cfg.out / FILE)
    if result["file"] is None and console is not None and not result.get("missing_library"):  # that: said before
        console.print(f"[yellow]{FILE} skipped: {escape(result['skipped'])}[/yellow]")  # [logs] is not markup
    return result
