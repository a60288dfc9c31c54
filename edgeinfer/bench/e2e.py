"""End-to-end scenarios of the bench: a slice of a real log replayed through the real processes and sockets
(edgeinfer.sim.replay: replayer -> runtime -> control -> replayer over ZeroMQ), once per repeat. The two
nodes of every replay are new processes forked from one server that imported edgeinfer once
(edgeinfer.procs.forkserver, ReplayConfig.fork_nodes): no interpreter start and torch import per node and
replay, the same `edgeinfer serve` / `edgeinfer control` code, warm-up and handshake. No plots are drawn.

Latency of an observation = its command received at the replayer - the observation's scheduled send time,
on the replayer's monotonic clock; a deadline miss is a tick without a valid command by its deadline
(sim/replay.py defines both). The scenario shapes the log, not the code: idle gaps shift later bursts of the
slice in time by whole control periods (the arm's data stay continuous), and overload replays the slice
with ReplayConfig.time_scale (observations at time_scale x the log's rate).
"""
from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import numpy as np
from rich.console import Console

from edgeinfer.bench.scenarios import ReplayScenario
from edgeinfer.logs.arm_log import ArmLog, LogError, write_schunk
from edgeinfer.node.runtime import RuntimeConfig
from edgeinfer.sim.replay import replay
from edgeinfer.sim.run_config import ReplayConfig

REPLAY_TIME_SCALE = "time_scale" in {f.name for f in dataclasses.fields(ReplayConfig)}


def scenario_log(log: ArmLog, sc: ReplayScenario) -> ArmLog:
    """The slice [start_s, start_s + seconds) of `log` shaped by the scenario: with idle gaps, burst b (rows
    whose time falls in [b * burst_s, (b+1) * burst_s) of the slice) is shifted later by b gaps, each gap
    rounded to whole periods so every sample stays on the control loop's tick grid. Raises LogError naming
    the log when the slice holds fewer than two samples."""
    t = log.t_s - log.t_s[0]
    idx = np.flatnonzero((t >= sc.start_s) & (t < sc.start_s + sc.seconds))
    if len(idx) < 2:
        raise LogError(f"{log.name}: fewer than 2 samples in [{sc.start_s}, {sc.start_s + sc.seconds}) s "
                       f"(the log is {t[-1]:.2f} s long)")
    period_s = log.period_ns / 1e9
    ticks = np.round((t[idx] - t[idx[0]]) / period_s)
    if sc.burst_s is not None:
        gap_ticks = max(1, round(sc.gap_s / period_s))
        burst = np.floor(ticks * period_s / sc.burst_s + 1e-9)
        ticks = ticks + burst * gap_ticks
    return ArmLog(f"{log.name}-{sc.name}", ticks * period_s, log.q_rad[idx], log.qd_rad_s[idx])


def _latencies_ms(ticks_csv: Path) -> np.ndarray:
    """(N,) float64 latency of every observation in a replay's ticks.csv; NaN where no command came."""
    with open(ticks_csv, newline="") as fh:
        return np.array([float(r["latency_ms"]) if r["latency_ms"] else np.nan for r in csv.DictReader(fh)])


def run_scenario(log: ArmLog, sc: ReplayScenario, runtime: RuntimeConfig, out: Path,
                 console: Console | None = None) -> dict:
    """One replay of scenario `sc` on `log` with the runtime configured by `runtime` (its warmup_chunks
    replaced by the scenario's). Artefacts (report.json, ticks.csv, logs) go under out/. Returns the
    figures of that run plus `latency_ms`, the (N,) per-observation latencies (NaN: no command).
    Raises RuntimeError when the scenario needs time_scale and ReplayConfig has none, and whatever
    sim.replay.replay raises (LogError, RuntimeError, TimeoutError)."""
    options = {}
    if sc.time_scale != 1.0:
        if not REPLAY_TIME_SCALE:
            raise RuntimeError(f"scenario {sc.name!r}: this sim.replay has no ReplayConfig.time_scale")
        options["time_scale"] = sc.time_scale
    log_dir = write_schunk(scenario_log(log, sc), out / "log")
    rt = dataclasses.replace(runtime, warmup_chunks=sc.warmup_chunks)
    # nodes forked from a server that imported edgeinfer once (edgeinfer/procs/forkserver.py): the same processes and
    # sockets without an interpreter start and torch import per node and replay; no plots (the bench's
    # figures come from ticks.csv and report.json)
    cfg = ReplayConfig(log=log_dir, out=out, deadline_ms=sc.deadline_ms, runtime=rt, fork_nodes=True, plots=False,
                       **options)
    report = replay(cfg, console or Console(quiet=True))
    latency_ms = _latencies_ms(out / "ticks.csv")
    return {
        "log": log.name,
        "out": str(out),
        "observations": report["observations_sent"],
        "commands_received": report["commands_received"],
        "outcomes": report["outcomes"],
        "deadline_misses": report["deadline_misses"],
        "deadline_ms": report["deadline_ms"],
        "interrupted": report["interrupted"],
        "fallbacks": report["fallbacks"],
        "tokens_per_target_pass": report["spec"]["tokens_per_target_pass"],
        # observation sent -> the chunk built from it received at the replayer (p50, p90, p99, p999, max, mean)
        "time_to_chunk_ms": report["chunks"]["time_to_chunk_ms"],
        "action_rmse_rad": report["quality"]["action_rmse_rad"],
        "late_but_sent_in_time": report["harness"]["late_but_sent_in_time"],
        "replayer_send_lateness_max_ms": report["harness"]["replayer_send_lateness_ms"]["max"],
        "process_exit_codes": report["process_exit_codes"],
        "latency_ms": latency_ms,
    }
