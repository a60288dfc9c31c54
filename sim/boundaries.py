"""Chunk boundaries in a replay: how far apart consecutive chunks' plans are where one takes over from the
other, and how much of that reaches the robot.

From the replayer's recording alone (every command and chunk it received):
    raw_jump_rad        at each tick where the command's chunk changes, max over joints of |new chunk's
                        target - previous chunk's target| at that tick (what an unstitched switch commands)
    step_at_boundary_rad  max over joints of |command[n] - command[n-1]| at those ticks (what was commanded)
    step_elsewhere_rad  the same between consecutive commands from one chunk: the arm's own motion per tick
Holds are not boundaries (a hold repeats the last command). Summaries are p50, p99 and max in rad.
"""
from __future__ import annotations

import numpy as np

from edgeinfer.control.buffer import target_at


def _summary(x: list[float]) -> dict[str, float | None]:
    if not x:
        return {"count": 0, "p50": None, "p99": None, "max": None}
    a = np.asarray(x)
    return {"count": len(x), "p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "max": float(a.max())}


def boundary_section(rec, chunks_by_obs: dict) -> dict:
    """rec: the replay Recording (commands {tick: (t_recv_ns, JointCommand)}, t0_ns, period_ns);
    chunks_by_obs: {obs_seq: ActionChunk}, the whole chunk of each observation. Returns the summaries above."""
    raw, at_boundary, elsewhere = [], [], []
    prev = None
    for n in sorted(rec.commands):
        cmd = rec.commands[n][1]
        if cmd.rung == "hold" or cmd.chunk_obs_seq < 0:
            prev = None
            continue
        if prev is not None and prev[0] == n - 1:
            step = float(np.max(np.abs(cmd.q_rad - prev[1].q_rad)))
            if cmd.chunk_obs_seq != prev[1].chunk_obs_seq:
                at_boundary.append(step)
                new, old = chunks_by_obs.get(cmd.chunk_obs_seq), chunks_by_obs.get(prev[1].chunk_obs_seq)
                t = rec.t0_ns + n * rec.period_ns
                q_new = target_at(new, t) if new is not None else None
                q_old = target_at(old, t) if old is not None else None
                if q_new is not None and q_old is not None:
                    raw.append(float(np.max(np.abs(q_new - q_old))))
            else:
                elsewhere.append(step)
        prev = (n, cmd)
    return {"raw_jump_rad": _summary(raw), "step_at_boundary_rad": _summary(at_boundary),
            "step_elsewhere_rad": _summary(elsewhere)}
