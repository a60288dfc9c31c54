"""Turn a replay Recording into the report: latency, deadline misses with confidence bounds, fallback
rungs, speculative decoding statistics and action quality against the recorded future."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
from edgeinfer.sim.stats import latency_summary_ms, wilson_interval

from edgeinfer.wire import RUNGS


def summarize(rec, log, cfg, deadline_ms: float, stride: int) -> tuple[dict, dict]:
    """(report dict, per-observation arrays {tick, latency_ms (NaN when lost), outcome, rung}, each (N,)).

    Latency of observation i = receipt of the command for its tick - the time observation i was due, both on
    the replayer's clock; the deadline is measured from the same instant.
    """
    n = int(np.count_nonzero(rec.t_sent_ns)) if rec.interrupted else len(rec.t_sched_ns)
    t_sched, ticks = rec.t_sched_ns[:n], rec.tick[:n]
    deadline_ns = t_sched + int(deadline_ms * 1e6)
    latency_ms = np.full(n, np.nan)
    at_control_ms = np.full(n, np.nan)
    outcome = np.full(n, "lost", dtype=object)
    rung = np.full(n, "", dtype=object)
    fallbacks = Counter({r: 0 for r in RUNGS})
    for i in range(n):
        if (got := rec.commands.get(int(ticks[i]))) is None:
            continue
        t_recv, cmd = got
        latency_ms[i] = (t_recv - t_sched[i]) / 1e6
        at_control_ms[i] = (cmd.t_ns - t_sched[i]) / 1e6
        fallbacks[cmd.rung] += 1
        rung[i] = cmd.rung
        outcome[i] = "hold" if cmd.rung == "hold" else ("late" if t_recv > deadline_ns[i] else "on_time")
    outcomes = {k: int(np.sum(outcome == k)) for k in ("on_time", "late", "lost", "hold")}
    send_lateness_ms = (rec.t_sent_ns[:n] - t_sched) / 1e6
    # late at the replayer although the control loop sent in time: transport or harness, not the policy path
    late_but_sent_in_time = int(np.sum((outcome == "late") & (at_control_ms <= deadline_ms)))
    misses = n - outcomes["on_time"]
    row_of_tick = {int(k): i for i, k in enumerate(ticks)}
    chunks = [c for _, c in rec.chunks if c.obs_seq in row_of_tick]
    tokens = sum(c.tokens for c in chunks)
    passes = sum(c.target_passes for c in chunks)
    drafted = sum(c.drafted for c in chunks)
    chunk_latency = [t - t_sched[row_of_tick[c.obs_seq]] for t, c in rec.chunks if c.obs_seq in row_of_tick]
    byo = cfg.runtime.byo_spec is not None
    return {
        "schema": "edgeinfer.replay/1",
        "log": log.name,
        "rate_hz": round(log.rate_hz, 3),
        "deadline_ms": deadline_ms,
        "decode": "bring-your-own" if byo else cfg.runtime.decode,
        "engine": (f"{Path(cfg.runtime.byo_model).name if cfg.runtime.byo_model else 'the model'} of "
                   f"{cfg.runtime.byo_spec.name}" if byo
                   else f"{cfg.runtime.backend} {cfg.runtime.precision} {cfg.runtime.device}"),
        "drafter": cfg.runtime.drafter if cfg.runtime.decode == "speculative" and not byo else None,
        "budget_ms": cfg.runtime.scheduler.budget_ms,
        "k_max": cfg.runtime.scheduler.k_max if cfg.runtime.decode == "speculative" else 0,
        "interrupted": rec.interrupted,
        "observations_sent": n,
        "commands_received": int(np.sum(outcome != "lost")),
        "latency_ms": latency_summary_ms(latency_ms * 1e6),
        "deadline_misses": misses,
        "miss_rate": misses / n if n else None,
        "miss_rate_ci95": list(wilson_interval(misses, n)),
        "outcomes": outcomes,
        "fallbacks": dict(fallbacks),
        "chunks": {"received": len(chunks), "rungs": dict(Counter(c.rung for c in chunks)),
                   "time_to_chunk_ms": latency_summary_ms(np.array(chunk_latency, dtype=float)),
                   "time_to_first_action_ms": chunk_latency[0] / 1e6 if chunk_latency else None},
        "spec": {"acceptance_rate": sum(c.accepted for c in chunks) / drafted if drafted else None,
                 "tokens_per_target_pass": tokens / passes if passes else None,
                 "target_passes_per_chunk": passes / len(chunks) if chunks else None},
        "quality": _quality(rec.commands, chunks, log, ticks, row_of_tick, stride),
        # Harness health: if these are large, misses may come from the replayer, not the system under test.
        "harness": {"replayer_send_lateness_ms": latency_summary_ms(send_lateness_ms * 1e6),
                    "latency_at_control_send_ms": latency_summary_ms(at_control_ms * 1e6),
                    "late_but_sent_in_time": late_but_sent_in_time,
                    "duplicate_commands": rec.duplicate_commands,
                    "ticks_without_observation": int(rec.n_ticks - len(rec.tick)),
                    "rejected_commands": rec.rejected_commands,
                    "malformed_messages": rec.malformed},
    }, {"tick": ticks, "latency_ms": latency_ms, "outcome": outcome, "rung": rung,
        "send_lateness_ms": send_lateness_ms, "at_control_send_ms": at_control_ms}


def _quality(commands: dict, chunks: list, log, ticks, row_of_tick: dict, stride: int) -> dict:
    """Action error (rad) against what the arm actually did in this log.

    action_rmse_rad: each tick's commanded position vs the recorded position at that tick (what the robot
    was sent, on equal footing for every decode mode and rung). chunk_rmse_rad_by_step[h]: chunk target h
    vs the recorded position h chunk steps after the chunk's observation.
    """
    cmd_err = [commands[int(k)][1].q_rad - log.q_rad[i] for i, k in enumerate(ticks)
               if int(k) in commands and commands[int(k)][1].rung != "hold"]
    by_step: dict[int, list] = {}
    for c in chunks:
        for h in range(1, len(c.steps_rad)):
            if (row := row_of_tick.get(c.obs_seq + h * stride)) is not None:
                by_step.setdefault(h, []).append(c.steps_rad[h] - log.q_rad[row])
    rmse = lambda e: float(np.sqrt(np.mean(np.square(e)))) if len(e) else None  # noqa: E731
    return {"action_rmse_rad": rmse(cmd_err), "ticks_compared": len(cmd_err),
            "chunk_rmse_rad_by_step": [rmse(by_step[h]) for h in sorted(by_step)],
            "chunk_steps_compared": [len(by_step[h]) for h in sorted(by_step)]}


def write_ticks(per_obs: dict, path) -> None:
    """One row per observation: its log row, control tick, latency_ms at the replayer and at the control
    loop's send (empty when lost), the replayer's own send lateness, outcome and rung."""
    cols = ("tick", "latency_ms", "at_control_send_ms", "send_lateness_ms", "outcome", "rung")
    fmt = lambda v: "" if isinstance(v, float) and np.isnan(v) else (f"{v:.4f}" if isinstance(v, float) else str(v))  # noqa: E731
    with open(path, "w") as fh:
        fh.write("observation," + ",".join(cols) + "\n")
        for i, row in enumerate(zip(*(per_obs[c] for c in cols))):
            fh.write(f"{i}," + ",".join(fmt(v) for v in row) + "\n")
