"""Turn a replay Recording into the report: latency, deadline misses with confidence bounds, fallback
rungs, speculative decoding statistics and action quality against the recorded future."""
from __future__ import annotations

from collections import Counter

import numpy as np
from edgeinfer.sim.stats import latency_summary_ms, wilson_interval

from edgeinfer.wire import RUNGS


def summarize(rec, log, cfg, deadline_ms: float, stride: int) -> tuple[dict, dict]:
    """(report dict, per-tick arrays {latency_ms (N,) float with NaN when lost, outcome (N,), rung (N,)})."""
    n = len(rec.t_sched_ns)
    deadline_ns = rec.t_sched_ns + int(deadline_ms * 1e6)
    latency_ms = np.full(n, np.nan)
    outcome = np.full(n, "lost", dtype=object)
    rung = np.full(n, "", dtype=object)
    fallbacks = Counter({r: 0 for r in RUNGS})
    for seq, (t_recv, cmd) in rec.commands.items():
        if not 0 <= seq < n:
            continue
        latency_ms[seq] = (t_recv - rec.t_sent_ns[seq]) / 1e6
        fallbacks[cmd.rung] += 1
        rung[seq] = cmd.rung
        outcome[seq] = "hold" if cmd.rung == "hold" else ("late" if t_recv > deadline_ns[seq] else "on_time")
    outcomes = {k: int(np.sum(outcome == k)) for k in ("on_time", "late", "lost", "hold")}
    misses = n - outcomes["on_time"]
    chunks = [c for _, c in rec.chunks]
    tokens = sum(c.tokens for c in chunks)
    passes = sum(c.target_passes for c in chunks)
    drafted = sum(c.drafted for c in chunks)
    chunk_latency = [(t - rec.t_sent_ns[c.obs_seq]) for t, c in rec.chunks if 0 <= c.obs_seq < n]
    return {
        "schema": "edgeinfer.replay/1",
        "log": log.name,
        "rate_hz": round(log.rate_hz, 3),
        "deadline_ms": deadline_ms,
        "decode": cfg.runtime.decode,
        "drafter": cfg.runtime.drafter if cfg.runtime.decode == "speculative" else None,
        "budget_ms": cfg.runtime.scheduler.budget_ms,
        "k_max": cfg.runtime.scheduler.k_max if cfg.runtime.decode == "speculative" else 0,
        "observations_sent": n,
        "commands_received": len([s for s in rec.commands if 0 <= s < n]),
        "latency_ms": latency_summary_ms(latency_ms[~np.isnan(latency_ms)] * 1e6),
        "deadline_misses": misses,
        "miss_rate": misses / n,
        "miss_rate_ci95": list(wilson_interval(misses, n)),
        "outcomes": outcomes,
        "fallbacks": dict(fallbacks),
        "chunks": {"received": len(chunks), "rungs": dict(Counter(c.rung for c in chunks)),
                   "time_to_chunk_ms": latency_summary_ms(np.array(chunk_latency, dtype=float)),
                   "time_to_first_action_ms": chunk_latency[0] / 1e6 if chunk_latency else None},
        "spec": {"acceptance_rate": drafted and sum(c.accepted for c in chunks) / drafted or None,
                 "tokens_per_target_pass": tokens / passes if passes else None,
                 "target_passes_per_chunk": passes / len(chunks) if chunks else None},
        "quality": _quality(rec.commands, chunks, log, stride),
        "malformed_messages": rec.malformed,
    }, {"latency_ms": latency_ms, "outcome": outcome, "rung": rung}


def write_ticks(ticks: dict, path) -> None:
    """One row per control tick: tick, latency_ms (empty when lost), outcome, rung."""
    with open(path, "w") as fh:
        fh.write("tick,latency_ms,outcome,rung\n")
        for i, (lat, out, rung) in enumerate(zip(ticks["latency_ms"], ticks["outcome"], ticks["rung"])):
            fh.write(f"{i},{'' if np.isnan(lat) else f'{lat:.4f}'},{out},{rung}\n")


def _quality(commands: dict, chunks: list, log, stride: int) -> dict:
    """Action error (rad) against what the arm actually did in this log.

    action_rmse_rad: each tick's commanded position vs the recorded position at that tick (what the robot
    was sent, on equal footing for every decode mode and rung). chunk_rmse_rad_by_step[h]: chunk target h
    vs the recorded position h chunk steps after the chunk's observation.
    """
    cmd_err = [c.q_rad - log.q_rad[s] for s, (_, c) in commands.items() if 0 <= s < len(log) and c.rung != "hold"]
    by_step: dict[int, list] = {}
    for c in chunks:
        for h in range(1, len(c.steps_rad)):
            t = c.obs_seq + h * stride
            if t < len(log):
                by_step.setdefault(h, []).append(c.steps_rad[h] - log.q_rad[t])
    rmse = lambda e: float(np.sqrt(np.mean(np.square(e)))) if len(e) else None  # noqa: E731
    return {"action_rmse_rad": rmse(cmd_err), "ticks_compared": len(cmd_err),
            "chunk_rmse_rad_by_step": [rmse(by_step[h]) for h in sorted(by_step)],
            "chunk_steps_compared": [len(by_step[h]) for h in sorted(by_step)]}
