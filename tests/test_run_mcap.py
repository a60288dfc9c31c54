"""run.mcap (sim/run_mcap.py): a run's observations, chunks, commands and ticks as MCAP that Foxglove opens,
read back with mcap's own reader: written from a Recording built in memory, and by a real `edgeinfer replay`."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.sim import run_mcap
from edgeinfer.sim.metrics import summarize
from edgeinfer.sim.run_config import ReplayConfig
from edgeinfer.sim.run_mcap import FILE, SCHEMAS, run_mcap_section, write_run_mcap

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_runs import PERIOD_NS, STRIDE, recording  # noqa: E402

mcap_reader = pytest.importorskip("mcap.reader")
jsonschema = pytest.importorskip("jsonschema")


def read_back(path: Path) -> tuple[dict, dict, list]:
    """({topic: [(log_time, publish_time, decoded message)]} in file order, {topic: (schema, channel)},
    metadata records), through mcap's reader, the schemas checked against the JSON Schema meta-schema and
    every message validated against its channel's schema."""
    by_topic: dict[str, list] = {}
    channels = {}
    with open(path, "rb") as fh:
        reader = mcap_reader.make_reader(fh)
        for schema, channel, msg in reader.iter_messages(log_time_order=False):
            if channel.topic not in channels:
                assert schema.encoding == "jsonschema" and channel.message_encoding == "json"
                js = json.loads(schema.data)
                jsonschema.Draft202012Validator.check_schema(js)
                foxglove_reads(js, channel.topic)
                channels[channel.topic] = (schema, channel, jsonschema.Draft202012Validator(js))
            data = json.loads(msg.data)
            channels[channel.topic][2].validate(data)
            by_topic.setdefault(channel.topic, []).append((msg.log_time, msg.publish_time, data))
        metadata = list(reader.iter_metadata())
    return by_topic, channels, metadata


def foxglove_reads(schema: dict, where: str) -> None:
    """Assert what Foxglove's JSON Schema parser (foxglove/studio packages/mcap-support/src/parseJsonSchema.ts)
    accepts: an object with "properties", each field one type name (no ["number", "null"]), nested objects with
    their properties, arrays of numbers, strings, booleans or objects (not of arrays)."""
    assert schema["type"] == "object" and isinstance(schema["properties"], dict), where
    for name, field in schema["properties"].items():
        kind = field["type"]
        assert kind in ("boolean", "string", "number", "integer", "object", "array"), f"{where}.{name}: {kind}"
        if kind == "object":
            foxglove_reads(field, f"{where}.{name}")
        if kind == "array":
            assert field["items"]["type"] in ("boolean", "string", "number", "integer", "object"), f"{where}.{name}"
            if field["items"]["type"] == "object":
                foxglove_reads(field["items"], f"{where}.{name}[]")


def synthetic(tmp_path, **kwargs):
    """(rec, log, report, per_tick, cfg, write_run_mcap's result) of a synthetic 2 s run written to tmp_path."""
    rec, log = recording(seconds=2.0, **kwargs)
    cfg = ReplayConfig(out=tmp_path)
    report, per_tick = summarize(rec, log, cfg, PERIOD_NS / 1e6, STRIDE)
    return rec, log, report, per_tick, cfg, write_run_mcap(rec, log, report, per_tick, cfg, tmp_path / FILE)


def test_every_tick_command_chunk_and_observation_is_in_the_file(tmp_path):
    # 5 % of commands lost, and a runtime killed at row 400 (the control loop holds from then on)
    rec, log, report, per_tick, _, result = synthetic(tmp_path, drop_rate=0.05, kill_at_tick=400)
    n = report["observations_sent"]
    assert n == len(log) == 500 and 0 < n - report["commands_received"] < n  # some lost, most not
    msgs, channels, metadata = read_back(tmp_path / FILE)
    assert set(channels) == set(SCHEMAS) == {"/observation", "/action_chunk", "/command", "/tick", "/joint_states",
                                             "/joint_commands"}
    counts = {t: len(m) for t, m in msgs.items()}
    assert counts == result["messages"] == {"/observation": n, "/tick": n, "/command": report["commands_received"],
                                            "/action_chunk": report["chunks"]["received"], "/joint_states": n,
                                            "/joint_commands": report["commands_received"]}
    offset = json.loads({m.name: m.metadata for m in metadata}["edgeinfer.joint_states"]["wall_offset_ns"])
    assert result["bytes"] == (tmp_path / FILE).stat().st_size and not (tmp_path / "run.mcap.tmp").exists()

    # every tick once, in order, at its scheduled time; its latency, outcome and rung as the report counted them
    ticks = msgs["/tick"]
    assert [m["tick"] for _, _, m in ticks] == per_tick["tick"].tolist() == list(range(n))
    assert [t for t, _, _ in ticks] == (rec.t_sched_ns + offset).tolist()  # on the wall clock
    assert [m["t_sched_ns"] for _, _, m in ticks] == rec.t_sched_ns.tolist()  # the monotonic stamp kept
    lat = np.array([m.get("latency_ms", np.nan) for _, _, m in ticks])  # a lost tick's is left out
    np.testing.assert_array_equal(lat, per_tick["latency_ms"])
    assert [m["outcome"] for _, _, m in ticks] == per_tick["outcome"].tolist()
    assert sum(m["deadline_miss"] for _, _, m in ticks) == report["deadline_misses"] > 0
    assert {m["outcome"] for _, _, m in ticks} == {"on_time", "lost", "hold"}
    assert set(ticks[0][2]["stages_ms"]) == {"send", "receive_plan_decode", "publish", "control", "command"}

    # a command for every tick that got one, its q as received, published at its receipt
    cmds = msgs["/command"]
    got = np.flatnonzero(per_tick["outcome"] != "lost")
    assert [m["tick"] for _, _, m in cmds] == got.tolist()
    np.testing.assert_array_equal([m["q_rad"] for _, _, m in cmds], rec.commands.q_rad[got])
    assert [p for _, p, _ in cmds] == (rec.commands.t_recv_ns[got] + offset).tolist()
    assert [m["t_recv_ns"] for _, _, m in cmds] == rec.commands.t_recv_ns[got].tolist()
    assert [m["rung"] for _, _, m in cmds].count("hold") == report["fallbacks"]["hold"] > 50

    obs = msgs["/observation"]
    np.testing.assert_array_equal([m["q_rad"] for _, _, m in obs], log.q_rad)
    np.testing.assert_array_equal([m["qd_rad_s"] for _, _, m in obs], log.qd_rad_s)
    chunk = msgs["/action_chunk"][1][2]  # row 5's: 9 steps of 6 joints, its counts as sent
    assert (chunk["tick"], chunk["n_steps"], len(chunk["steps"]), len(chunk["steps"][0]["q_rad"])) == (5, 9, 9, 6)
    assert (chunk["tokens"], chunk["target_passes"], chunk["drafted"], chunk["accepted"]) == (48, 12, 44, 36)

    log_times = [t for m in msgs.values() for t, _, _ in m]
    file_order = []
    with open(tmp_path / FILE, "rb") as fh:
        file_order = [msg.log_time for _, _, msg in mcap_reader.make_reader(fh).iter_messages(log_time_order=False)]
    assert file_order == sorted(file_order) and len(file_order) == len(log_times)

    meta = {m.name: m.metadata for m in metadata}
    assert json.loads(meta["edgeinfer.headline"]["observations_sent"]) == n
    assert json.loads(meta["edgeinfer.headline"]["deadline_misses"]) == report["deadline_misses"]
    assert json.loads(meta["edgeinfer.headline"]["latency_ms.p99"]) == pytest.approx(report["latency_ms"]["p99"])
    assert json.loads(meta["edgeinfer.config"]["runtime.backend"]) == "auto"  # the default (engines/backends/auto.py)
    assert json.loads(meta["edgeinfer.config"]["out"]) == str(tmp_path)


def test_rows_skipped_after_a_stall_have_a_tick_but_no_observation(tmp_path):
    rec, log = recording(seconds=1.0)
    rec.skipped = np.zeros(len(log), dtype=bool)
    rec.skipped[100:110] = True
    cfg = ReplayConfig(out=tmp_path)
    report, per_tick = summarize(rec, log, cfg, PERIOD_NS / 1e6, STRIDE)
    result = write_run_mcap(rec, log, report, per_tick, cfg, tmp_path / FILE)
    assert result["messages"]["/tick"] == len(log) and result["messages"]["/observation"] == len(log) - 10
    msgs, _, _ = read_back(tmp_path / FILE)
    assert [m["row"] for _, _, m in msgs["/observation"]] == [*range(100), *range(110, len(log))]


def test_without_the_mcap_library_the_run_says_why_and_writes_nothing(tmp_path, monkeypatch):
    rec, log = recording(seconds=0.5)
    cfg = ReplayConfig(out=tmp_path)
    report, per_tick = summarize(rec, log, cfg, PERIOD_NS / 1e6, STRIDE)
    monkeypatch.setitem(sys.modules, "mcap.writer", None)  # import mcap.writer now raises ImportError
    section = run_mcap_section(rec, log, report, per_tick, cfg)
    assert section["file"] is None and "mcap library is not installed" in section["skipped"]
    assert not (tmp_path / FILE).exists()
    cfg.run_mcap = False
    assert run_mcap_section(rec, log, report, per_tick, cfg)["skipped"].startswith("run_mcap is false")


@pytest.mark.slow
def test_cli_replay_writes_a_run_mcap_with_every_tick(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "edgeinfer", "replay", "--duration-s", "2", "--out", str(out),
                           "--plots", "false"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "run.mcap" in proc.stdout
    report = json.loads((out / "report.json").read_text())
    n = report["observations_sent"]
    assert n == 500  # 2 s of the embedded 250 Hz log
    assert report["run_mcap"]["file"] == FILE and report["run_mcap"]["messages"]["/tick"] == n
    msgs, _, metadata = read_back(out / FILE)
    assert [m["tick"] for _, _, m in msgs["/tick"]] == list(range(n))
    timed = sum("latency_ms" in m for _, _, m in msgs["/tick"])
    assert timed == report["commands_received"] == len(msgs["/command"])
    assert len(msgs["/observation"]) == report["replayer"]["rows_sent"]
    assert len(msgs["/action_chunk"]) == report["chunks"]["received"] > 0
    assert json.loads({m.name: m.metadata for m in metadata}["edgeinfer.headline"]["observations_sent"]) == n
    # Recording.start took the wall offset: every log time is today's date, not seconds since boot
    assert all(abs(t - time.time_ns()) < 86_400 * 10**9 for m in msgs.values() for t, _, _ in m)
    assert len(msgs["/joint_states"]) == len(msgs["/observation"]) and msgs["/joint_states"][0][2]["name"]


def test_joint_states_carry_the_logs_joint_names_at_wall_clock_times(tmp_path):
    """Foxglove's 3D panel poses a URDF from sensor_msgs/msg/JointState by joint name, and its timeline shows
    log times as dates: /joint_states names the log's joints, in the log's order, with its q and qd, and every
    log time is within a day of now (not seconds since boot, which Foxglove shows as 1970)."""
    rec, log = recording(seconds=1.0)
    log.joint_names = ["wrist", "elbow", "shoulder", "j4", "j5", "j6"]  # as a reader fills them, any order
    rec.wall_offset_ns = time.time_ns() - time.perf_counter_ns()  # as Recording.start takes it
    cfg = ReplayConfig(out=tmp_path)
    report, per_tick = summarize(rec, log, cfg, PERIOD_NS / 1e6, STRIDE)
    write_run_mcap(rec, log, report, per_tick, cfg, tmp_path / FILE)
    msgs, channels, metadata = read_back(tmp_path / FILE)
    assert channels["/joint_states"][0].name == "sensor_msgs/msg/JointState"
    states = msgs["/joint_states"]
    assert len(states) == len(log) and all(m["name"] == log.joint_names for _, _, m in states)
    np.testing.assert_array_equal([m["position"] for _, _, m in states], log.q_rad)
    np.testing.assert_array_equal([m["velocity"] for _, _, m in states], log.qd_rad_s)
    now = time.time_ns()
    day = 86_400 * 10**9
    every = [t for m in msgs.values() for t, _, _ in m] + [p for m in msgs.values() for _, p, _ in m]
    assert all(abs(t - now) < day for t in every)
    # each stamp is the row's monotonic schedule moved by the one offset: intervals stay exact
    stamps = [m["header"]["stamp"]["sec"] * 10**9 + m["header"]["stamp"]["nsec"] for _, _, m in states]
    assert stamps == [t for t, _, _ in states] == (rec.t_sched_ns + rec.wall_offset_ns).tolist()
    assert [m["t_ns"] for _, _, m in states] == rec.t_sched_ns.tolist()
    assert all(0 <= m["header"]["stamp"]["nsec"] < 10**9 for _, _, m in states)
    commanded = msgs["/joint_commands"]
    assert commanded and all(m["name"] == log.joint_names for _, _, m in commanded)
    np.testing.assert_array_equal([m["position"] for _, _, m in commanded],
                                  rec.commands.q_rad[[m["tick"] for _, _, m in commanded]])
    meta = {m.name: m.metadata for m in metadata}["edgeinfer.joint_states"]
    assert json.loads(meta["names"]) == log.joint_names and json.loads(meta["names_from"]).startswith("the log")
    assert json.loads(meta["wall_offset_ns"]) == rec.wall_offset_ns


def test_joint_names_fall_back_to_the_urdf_of_the_limits_then_to_placeholders(tmp_path):
    rec, log = recording(seconds=0.5)
    cfg = ReplayConfig(out=tmp_path)
    report, per_tick = summarize(rec, log, cfg, PERIOD_NS / 1e6, STRIDE)
    urdf = [f"arm_{i}" for i in range(1, 7)]
    with_urdf = report | {"limits": {"urdf_joints": urdf}}
    assert run_mcap.joint_names(log, with_urdf) == (urdf, "the URDF of the run's limits")
    names, why = run_mcap.joint_names(log, report)
    assert names == [f"joint_{i}" for i in range(1, 7)] and why.startswith("placeholders")
    write_run_mcap(rec, log, report, per_tick, cfg, tmp_path / FILE)
    msgs, _, _ = read_back(tmp_path / FILE)
    assert msgs["/joint_states"][0][2]["name"] == names
    assert abs(msgs["/tick"][0][0] - time.time_ns()) < 86_400 * 10**9  # offset measured at write time
