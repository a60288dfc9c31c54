"""One tick's command: chunk buffer + tick time -> interpolated target, or a hold -> safety clamp.

The one command path of every controller: the control loop node (control/loop.py) and the embedded Controller
(edgeinfer/node/controller.py) both call `command()` once per tick with their own CommandCounters, so holds,
the no-state case, non-finite targets and clamping behave (and are counted) the same in both:

    sample the newest chunk that covers t_ns (control/buffer.py)
      -> none (or no chunk is trusted): hold the last command, else the measured position (rung "hold");
         neither yet: nothing safe to command, none is made (no_state)
      -> clamp to the position box and the velocity limit from the last command (control/safety.py); the first
         command is rate-limited from the measured position. A non-finite target never leaves: the clamp
         replaces it with that reference (nonfinite_targets)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from edgeinfer.control.buffer import ChunkBuffer
from edgeinfer.control.safety import SafetyLimits


@dataclass
class CommandCounters:
    """What the command path did, per tick. Every controller's stats extend this, so the names are shared."""

    ticks: int = 0  # commands made
    holds: int = 0  # commands that held (no trusted chunk covered the tick)
    no_state: int = 0  # ticks before any observation or command: nothing safe to command, none made
    clamped: int = 0  # commands changed by the safety limits
    nonfinite_targets: int = 0  # non-finite interpolated targets replaced by the clamp (never sent)
    rungs: dict = field(default_factory=dict)  # rung name -> commands


class Command(NamedTuple):
    q_rad: np.ndarray  # (D,) float64 joint targets, within the safety limits
    rung: str  # the chunk's rung, "continue" (an older chunk), or "hold"
    chunk_obs_seq: int  # observation the chunk was planned from; -1 for a hold


def command(buffer: ChunkBuffer | None, t_ns: int, last_q_rad: np.ndarray | None,
            measured_q_rad: np.ndarray | None, limits: SafetyLimits, period_s: float,
            counters: CommandCounters) -> Command | None:
    """The command for the tick at t_ns (monotonic ns), or None when there is no state at all yet.

    buffer: the chunks to follow (None: none is trusted, e.g. their runtime is dead: hold). last_q_rad: the last
    command (D,) (None before the first). measured_q_rad: the newest finite observed position (D,) (None before
    any). period_s: the control period the velocity limit applies over. Updates `counters`."""
    sample = buffer.sample(t_ns) if buffer is not None else None
    if sample is None:  # watchdog: nothing valid covers this tick
        q, rung, chunk_seq = (last_q_rad if last_q_rad is not None else measured_q_rad), "hold", -1
        if q is None:
            counters.no_state += 1
            return None
        counters.holds += 1
    else:
        q, rung, chunk_seq = sample
        if not np.all(np.isfinite(q)):  # the clamp below replaces it; count it, never send it
            counters.nonfinite_targets += 1
    reference = last_q_rad if last_q_rad is not None else measured_q_rad
    q, clamped = limits.clamp(q, reference, period_s)
    counters.clamped += clamped
    counters.ticks += 1
    counters.rungs[rung] = counters.rungs.get(rung, 0) + 1
    return Command(q, rung, chunk_seq)
