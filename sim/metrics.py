"""Turn a replay Recording into the report: latency, deadline misses with confidence bounds, fallback
rungs, speculative decoding statistics and action quality against the recorded future.

The headline figures count the log's rows (the measured ticks); start-up is reported apart (start_up_section:
the pre-roll's ticks, time to first command), and miss_rate_scope says whether the headline still holds any of
it: "steady state" (the pre-roll covered start-up), "start-up included" (the first command came after the
log's first tick) or "whole run" (no pre-roll: start-up counted, as before pre-rolls existed)."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from edgeinfer.core.wire import RUNGS
from edgeinfer.sim.boundaries import boundary_section
from edgeinfer.sim.pacing import replayer_section
from edgeinfer.sim.received import HOLD, NONE, RUNG_NAMES
from edgeinfer.sim.slo import evaluate, parse_slo
from edgeinfer.sim.stats import (
    clopper_pearson_interval,
    histogram_us,
    latency_ci_ms,
    latency_summary_ms,
    rms_ci,
)

# 2: confidence intervals on every latency percentile, an exact (Clopper-Pearson) miss-rate interval, the
# 1 us latency histogram, per-stage times, the SLO verdict. Readers accept 1 (no intervals: nothing judged).
SCHEMA_VERSION = 2
CONFIDENCE = 0.95
OUTCOMES = ("on_time", "late", "lost", "hold")


def tick_outcomes(commands, ticks: np.ndarray, t_due_ns: np.ndarray, deadline_ns: np.ndarray) -> tuple:
    """(latency_ms, at_control_ms, outcome, rung), each (n,), for control ticks `ticks` due at t_due_ns with
    absolute deadlines deadline_ns (int64 ns, replayer clock). commands: sim/received.Commands.
    latency = receipt - due (NaN: lost); at_control = the control loop's send - due; outcome one of OUTCOMES
    (the miss definition of sim/replay.py: every outcome but on_time is a miss); rung "" when lost."""
    code, t_recv = commands.rung[ticks], commands.t_recv_ns[ticks]
    got = code != NONE
    latency_ms = np.where(got, (t_recv - t_due_ns) / 1e6, np.nan)
    at_control_ms = np.where(got, (commands.t_ns[ticks] - t_due_ns) / 1e6, np.nan)
    outcome = np.select([~got, code == HOLD, t_recv > deadline_ns], ["lost", "hold", "late"], "on_time").astype(object)
    return latency_ms, at_control_ms, outcome, RUNG_NAMES[code]


def row_of_tick(rec, n: int) -> np.ndarray:
    """(rec.n_ticks,) int64: the row (0..n-1) observed on each tick; -1 for a tick of none of the first n rows
    (the pre-roll, a gap in the log, a row not reached)."""
    row_of = np.full(rec.n_ticks, -1, dtype=np.int64)
    row_of[rec.tick[:n]] = np.arange(n)
    return row_of


def measured_chunks(rec, row_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(slots, rows), each (k,) int64: the rec.chunks slots planned from a row of row_of (row_of_tick), in the
    order their observations first got a chunk, and those rows. A slot holds the last chunk of its observation
    (a runtime that hands out the first verified step early sends it first, then the whole chunk)."""
    slots = np.flatnonzero(row_of[rec.chunks.obs_seq[:rec.chunks.count]] >= 0)
    return slots, row_of[rec.chunks.obs_seq[slots]]


def _rung_counts(codes: np.ndarray) -> dict[str, int]:
    """{rung: count} of rung codes, in the order each rung first appears."""
    return dict(Counter(RUNG_NAMES[codes].tolist()))


def start_up_section(rec, deadline_ms: float, measured_ticks: np.ndarray) -> dict:
    """Start-up, apart from the headline: time from the stream's first tick (rec.t0_ns) to the first command
    from a valid chunk (any rung but hold) and to the first chunk received (ms, replayer clock; None: none came),
    the tick of that command, the pre-roll's ticks (rec.pre_roll_ticks): observations sent, commands received
    for them, their outcomes and misses, the chunks planned from them (the last one per observation, as in the
    headline's "chunks") by rung; and measured_ticks_before_first_command: how many of `measured_ticks` (the
    headline's) came before that command (0 when the pre-roll covered start-up)."""
    n_pre = rec.pre_roll_ticks
    pre = np.arange(n_pre)
    due = rec.t0_ns + pre * rec.period_ns
    outcome = tick_outcomes(rec.commands, pre, due, due + int(deadline_ms * 1e6))[2]
    cmds = rec.commands
    valid = np.flatnonzero((cmds.rung != NONE) & (cmds.rung != HOLD))
    first = int(valid[np.argmin(cmds.t_recv_ns[valid])]) if len(valid) else None  # the earliest; ties: lowest tick
    t_first, k_first = (int(cmds.t_recv_ns[first]), first) if first is not None else (None, None)
    ms = lambda t: (t - rec.t0_ns) / 1e6 if t is not None else None  # noqa: E731
    outcomes = {k: int(np.sum(outcome == k)) for k in OUTCOMES}
    pre_chunks = rec.chunks.rung[:rec.chunks.count][rec.chunks.obs_seq[:rec.chunks.count] < n_pre]
    return {"pre_roll_ms": n_pre * rec.period_ns / 1e6, "pre_roll_ticks": n_pre,
            "observations_sent": n_pre - rec.pre_roll_skipped, "pre_roll_skipped": rec.pre_roll_skipped,
            "time_to_first_command_ms": ms(t_first), "first_command_tick": k_first,
            "time_to_first_chunk_ms": ms(rec.chunks.first_recv_ns),
            "commands_received": n_pre - outcomes["lost"], "deadline_misses": n_pre - outcomes["on_time"],
            "outcomes": outcomes,
            "chunks": {"received": len(pre_chunks), "rungs": _rung_counts(pre_chunks)},
            "measured_ticks_before_first_command": int(np.sum(measured_ticks < k_first)) if first is not None
            else len(measured_ticks)}


def headline_scope(start_up: dict) -> str:
    """What the headline figures hold (see the module docstring): "whole run", "steady state" or "start-up
    included"."""
    if not start_up["pre_roll_ticks"]:
        return "whole run"
    return "start-up included" if start_up["measured_ticks_before_first_command"] else "steady state"


def summarize(rec, log, cfg, deadline_ms: float, stride: int) -> tuple[dict, dict]:
    """(report dict, per-observation arrays {tick, latency_ms (NaN when lost), outcome, rung, stage times},
    each (N,)).

    Latency of observation i = receipt of the command for its tick - the time observation i was due, both on
    the replayer's clock; the deadline is measured from the same instant. With cfg.slo set, the report's
    "slo" holds slo.evaluate's verdict (else None). Raises slo.SLOError for an unparsable cfg.slo.
    """
    n = int(np.count_nonzero(rec.t_sent_ns)) if rec.interrupted else len(rec.t_sched_ns)
    t_sched, ticks = rec.t_sched_ns[:n], rec.tick[:n]
    latency_ms, at_control_ms, outcome, rung = tick_outcomes(rec.commands, ticks, t_sched,
                                                            t_sched + int(deadline_ms * 1e6))
    fallbacks = Counter({r: 0 for r in RUNGS})
    fallbacks.update(r for r in rung if r)
    outcomes = {k: int(np.sum(outcome == k)) for k in OUTCOMES}
    send_lateness_ms = (rec.t_sent_ns[:n] - t_sched) / 1e6
    misses = n - outcomes["on_time"]
    row_of = row_of_tick(rec, n)
    slots, rows = measured_chunks(rec, row_of)
    stages = stage_times_ms(rec, n, row_of)
    start_up = start_up_section(rec, deadline_ms, ticks)
    slo = getattr(cfg, "slo", None)
    return {
        "schema": "edgeinfer.replay/1",
        "schema_version": SCHEMA_VERSION,
        "confidence": CONFIDENCE,
        "log": log.name,
        "rate_hz": round(log.rate_hz, 3),
        "deadline_ms": deadline_ms,
        **_decode_fields(cfg.runtime, stride, rec.period_ns),
        "interrupted": rec.interrupted,
        "observations_sent": n,
        "commands_received": int(np.sum(outcome != "lost")),
        "latency_ms": latency_summary_ms(latency_ms * 1e6),
        "latency_ci95_ms": latency_ci_ms(latency_ms * 1e6, CONFIDENCE),
        "latency_histogram_us": {"bin_us": 1, "bins": histogram_us(latency_ms * 1e6)},
        "deadline_misses": misses,
        "miss_rate": misses / n if n else None,
        "miss_rate_ci95": list(clopper_pearson_interval(misses, n, CONFIDENCE)),  # its upper end: the bound
        "miss_rate_scope": headline_scope(start_up),  # what the headline figures hold: see the module docstring
        "start_up": start_up,
        "slo": evaluate(parse_slo(slo), latency_ms, misses) | {"objective": slo} if slo else None,
        "stages_ms": {k: latency_summary_ms(v * 1e6) for k, v in stages.items()},
        "outcomes": outcomes,
        "fallbacks": dict(fallbacks),
        "chunks": _chunks_section(rec.chunks, slots, t_sched[rows]),
        "spec": _spec_section(rec.chunks, slots),
        "quality": _quality(rec, slots, log, ticks, row_of, stride),
        "boundaries": boundary_section(rec, lambda s: _measured_chunk(rec, row_of, s)),
        # Harness health: if these are large, misses may come from the replayer, not the system under test.
        "replayer": replayer_section(rec, log),  # send timing error, skipped rows, faults injected
        "harness": _harness_section(rec, send_lateness_ms, at_control_ms, outcome, deadline_ms, start_up),
    }, {"tick": ticks - rec.pre_roll_ticks, "latency_ms": latency_ms, "outcome": outcome, "rung": rung,
        "send_lateness_ms": send_lateness_ms, "at_control_send_ms": at_control_ms, "stages_ms": stages,
        "t_s": (t_sched - rec.t0_ns) / 1e9}


def _decode_fields(rt, stride: int, period_ns: int) -> dict:
    """What decode ran: the report's decode, engine, drafter, budget_ms and k_max, from the RuntimeConfig `rt`."""
    byo = rt.byo_spec is not None
    return {
        "decode": "bring-your-own" if byo else rt.decode,
        "engine": (f"{Path(rt.byo_model).name if rt.byo_model else 'the model'} of {rt.byo_spec.name}" if byo
                   else f"{rt.backend} {rt.precision} {rt.device}"),
        "drafter": rt.drafter if rt.decode == "speculative" and not byo else None,
        "budget_ms": None if byo else rt.scheduler.resolved_budget_ms(rt.replan_every_ticks or stride, period_ns),
        "k_max": rt.scheduler.k_max if rt.decode == "speculative" else 0,
    }


def _chunks_section(ch, slots: np.ndarray, t_due_ns: np.ndarray) -> dict:
    """The "chunks" section of the measured chunks `slots`, t_due_ns the due times of their observations. One
    chunk per observation; a runtime that hands out the first verified step early sends it first, then the whole
    chunk (same observation): the first arrival times the first action, the last one is the chunk."""
    chunk_latency = (ch.t_recv_ns[slots] - t_due_ns).astype(float)
    first_action = (ch.t_first_recv_ns[slots] - t_due_ns).astype(float)
    return {"received": len(slots), "rungs": _rung_counts(ch.rung[slots]),
            "time_to_chunk_ms": latency_summary_ms(chunk_latency),
            "time_to_chunk_ci95_ms": latency_ci_ms(chunk_latency, CONFIDENCE),
            # observation due -> its first verified action step received (an early first step, or the chunk)
            "time_to_first_action_ms": latency_summary_ms(first_action),
            "time_to_first_action_ci95_ms": latency_ci_ms(first_action, CONFIDENCE),
            "early_first_steps": int(np.sum(ch.t_first_recv_ns[slots] != ch.t_recv_ns[slots]))}


def _spec_section(ch, slots: np.ndarray) -> dict:
    """The "spec" section: speculative decoding's figures over the measured chunks `slots`."""
    tokens, passes = int(ch.tokens[slots].sum()), int(ch.target_passes[slots].sum())
    drafted, accepted = int(ch.drafted[slots].sum()), int(ch.accepted[slots].sum())
    return {"acceptance_rate": accepted / drafted if drafted else None,
            "tokens_per_target_pass": tokens / passes if passes else None,
            "target_passes_per_chunk": passes / len(slots) if len(slots) else None,
            "drafted": drafted, "accepted": accepted,
            "speculative_chunks": int(np.sum(ch.drafted[slots] > 0))}  # chunks that drafted at all


def _harness_section(rec, send_lateness_ms: np.ndarray, at_control_ms: np.ndarray, outcome: np.ndarray,
                     deadline_ms: float, start_up: dict) -> dict:
    """The "harness" section: the replayer's and the control loop's own timing, and what was refused."""
    # late at the replayer although the control loop sent in time: transport or harness, not the policy path
    late_but_sent_in_time = int(np.sum((outcome == "late") & (at_control_ms <= deadline_ms)))
    return {"replayer_send_lateness_ms": latency_summary_ms(send_lateness_ms * 1e6),
            "latency_at_control_send_ms": latency_summary_ms(at_control_ms * 1e6),
            "late_but_sent_in_time": late_but_sent_in_time,
            "duplicate_commands": rec.duplicate_commands,
            "ticks_without_observation": int(rec.n_ticks - len(rec.tick) - start_up["pre_roll_ticks"]),
            "rejected_commands": rec.rejected_commands,
            "rejected_chunks": rec.rejected_chunks,
            "malformed_messages": rec.malformed}


# Stages of one observation's path, in order; each is measured between two timestamps the messages carry.
STAGES = {
    "send": "observation due -> sent by the replayer",
    "receive+plan+decode": "observation sent -> chunk ready at the runtime",
    "publish": "chunk ready -> chunk received by the replayer",
    "control": "tick due -> command sent by the control loop",
    "command": "command sent -> command received by the replayer",
}
# Not timestamped by any message yet, so not reported (an ActionChunk carries only t_obs_ns and t_ready_ns).
UNMEASURED_STAGES = ("receive", "plan", "decode (separately)")


def stage_times_ms(rec, n: int, row_of: np.ndarray) -> dict[str, np.ndarray]:
    """{stage: (n,) float ms per observation, NaN where not measured}, stages as in STAGES; row_of: row_of_tick.

    The receive+plan+decode and publish stages exist only for observations a chunk was built from (one per
    chunk step; the last chunk of an observation counts, after an early first step); all timestamps are
    CLOCK_MONOTONIC of one host, so differences across processes are valid.
    """
    out = {k: np.full(n, np.nan) for k in STAGES}
    out["send"] = (rec.t_sent_ns[:n] - rec.t_sched_ns[:n]) / 1e6
    if (skipped := getattr(rec, "skipped", None)) is not None:  # rows skipped after a stall were never sent
        out["send"][np.asarray(skipped[:n], dtype=bool)] = np.nan
    ch, cmds = rec.chunks, rec.commands
    slots, rows = measured_chunks(rec, row_of)
    out["receive+plan+decode"][rows] = (ch.t_ready_ns[slots] - rec.t_sent_ns[rows]) / 1e6
    out["publish"][rows] = (ch.t_recv_ns[slots] - ch.t_ready_ns[slots]) / 1e6
    ticks = rec.tick[:n]
    got = cmds.rung[ticks] != NONE
    out["control"][got] = (cmds.t_ns[ticks[got]] - rec.t_sched_ns[:n][got]) / 1e6
    out["command"][got] = (cmds.t_recv_ns[ticks[got]] - cmds.t_ns[ticks[got]]) / 1e6
    return out


def _measured_chunk(rec, row_of: np.ndarray, obs_seq: int):
    """The last chunk (wire.ActionChunk) planned from observation obs_seq when that is a row of row_of, else None."""
    if not 0 <= obs_seq < len(row_of) or row_of[obs_seq] < 0 or (s := rec.chunks.slot_of_tick[obs_seq]) < 0:
        return None
    return rec.chunks.chunk(int(s))


def _quality(rec, slots: np.ndarray, log, ticks, row_of: np.ndarray, stride: int) -> dict:
    """Action error (rad) against what the arm actually did in this log.

    action_rmse_rad: each tick's commanded position vs the recorded position at that tick (what the robot
    was sent, on equal footing for every decode mode and rung); action_rmse_rad_with_holds: the same with the
    held ticks' commands (the last command again) counted too. chunk_rmse_rad_by_step[h]: chunk target h
    vs the recorded position h chunk steps after the chunk's observation, over the chunks in `slots`
    (measured_chunks).
    """
    code = rec.commands.rung[ticks]
    sent = (code != NONE) & (code != HOLD)
    cmd_err = rec.commands.q_rad[ticks[sent]] - log.q_rad[np.flatnonzero(sent)]  # (m, D), row order
    got = code != NONE
    all_err = rec.commands.q_rad[ticks[got]] - log.q_rad[np.flatnonzero(got)]  # holds included
    ch = rec.chunks
    obs, n_steps = ch.obs_seq[slots], ch.n_steps[slots]
    by_step: dict[int, np.ndarray] = {}  # (m, D) errors, chunk order
    for h in range(1, ch.steps_rad.shape[1]):
        t = obs + h * stride
        row = np.where(t < len(row_of), row_of[np.minimum(t, len(row_of) - 1)], -1)
        if (sel := (n_steps > h) & (row >= 0)).any():
            by_step[h] = ch.steps_rad[slots[sel], h] - log.q_rad[row[sel]]
    rmse = lambda e: float(np.sqrt(np.mean(np.square(e)))) if len(e) else None  # noqa: E731
    ci = rms_ci(cmd_err, batch=50, confidence=CONFIDENCE) if len(cmd_err) else None
    return {"action_rmse_rad": rmse(cmd_err), "action_rmse_rad_ci95": None if ci is None else list(ci),
            "ticks_compared": len(cmd_err),
            "action_rmse_rad_with_holds": rmse(all_err), "ticks_compared_with_holds": len(all_err),
            "chunk_rmse_rad_by_step": [rmse(by_step[h]) for h in sorted(by_step)],
            "chunk_steps_compared": [len(by_step[h]) for h in sorted(by_step)]}


def write_ticks(per_obs: dict, path) -> None:
    """One row per observation: its log row, its tick on the log's grid (on the control loop's, the pre-roll's
    ticks come first), latency_ms at the replayer and at the control loop's send (empty when lost), the
    replayer's own send lateness, outcome and rung."""
    cols = ("tick", "latency_ms", "at_control_send_ms", "send_lateness_ms", "outcome", "rung")
    fmt = lambda v: "" if isinstance(v, float) and np.isnan(v) else (f"{v:.4f}" if isinstance(v, float) else str(v))  # noqa: E731
    with open(path, "w") as fh:
        fh.write("observation," + ",".join(cols) + "\n")
        for i, row in enumerate(zip(*(per_obs[c] for c in cols))):
            fh.write(f"{i}," + ",".join(fmt(v) for v in row) + "\n")
