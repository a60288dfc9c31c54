"""Chunk boundaries in a replay: how far apart consecutive chunks' plans are where one takes over from the
other, and how much of that reaches the robot.

From the replayer's recording alone (every command it received, the last chunk of each observation):
    raw_jump_rad        at each tick where the command's chunk changes, max over joints of |new chunk's
                        target - previous chunk's target| at that tick (what an unstitched switch commands)
    step_at_boundary_rad  max over joints of |command[n] - command[n-1]| at those ticks (what was commanded)
    step_elsewhere_rad  the same between consecutive commands from one chunk: the arm's own motion per tick
Holds are not boundaries (a hold repeats the last command). Summaries are p50, p99 and max in rad.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from edgeinfer.control.buffer import target_at
from edgeinfer.core.wire import ActionChunk
from edgeinfer.sim.received import HOLD, NONE


def _summary(x: np.ndarray) -> dict[str, float | None]:
    if not len(x):
        return {"count": 0, "p50": None, "p99": None, "max": None}
    return {"count": len(x), "p50": float(np.percentile(x, 50)), "p99": float(np.percentile(x, 99)),
            "max": float(x.max())}


def boundary_section(rec, chunk_of: Callable[[int], ActionChunk | None]) -> dict:
    """rec: the replay Recording (commands: sim/received.Commands; t0_ns, period_ns); chunk_of(obs_seq): the
    whole chunk planned from that observation, None when there is none to compare. Returns the summaries above."""
    cmds = rec.commands
    valid = (cmds.rung != NONE) & (cmds.rung != HOLD) & (cmds.chunk_obs_seq >= 0)
    n = np.flatnonzero(valid[1:] & valid[:-1]) + 1  # ticks whose previous tick also has a command from a chunk
    step = np.abs(cmds.q_rad[n] - cmds.q_rad[n - 1]).max(axis=1)  # (len(n),)
    switch = cmds.chunk_obs_seq[n] != cmds.chunk_obs_seq[n - 1]
    raw = []
    for k in n[switch].tolist():
        new, old = chunk_of(int(cmds.chunk_obs_seq[k])), chunk_of(int(cmds.chunk_obs_seq[k - 1]))
        t = rec.t0_ns + k * rec.period_ns
        q_new = target_at(new, t) if new is not None else None
        q_old = target_at(old, t) if old is not None else None
        if q_new is not None and q_old is not None:
            raw.append(float(np.max(np.abs(q_new - q_old))))
    return {"raw_jump_rad": _summary(np.array(raw)), "step_at_boundary_rad": _summary(step[switch]),
            "step_elsewhere_rad": _summary(step[~switch])}
