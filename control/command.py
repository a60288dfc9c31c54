"""One tick's command: chunk buffer + tick time -> interpolated target, or a hold -> safety clamp.

The one command path of every controller: the control loop node (control/loop.py) and the embedded Controller
(edgeinfer/node/controller.py) both call `command()` once per tick with their own CommandCounters, so holds,
the no-state case, non-finite targets and clamping behave (and are counted) the same in both:

    sample the newest chunk that covers t_ns (control/buffer.py)
      -> none (or no chunk is trusted): hold the last command, else the measured position (rung "hold");
         neither yet: nothing safe to command, none is made (no_state)
      -> clamp to the position box and the velocity limit from the last command (control/safety.py), over the
         measured time since the last command's tick (ros2_control's limiters use the measured period too): a
         caller slower than its configured period, or a late tick, is not held back. The first command is
         rate-limited from the measured position over one configured period. A non-finite target never
         leaves: the clamp replaces it with that reference (nonfinite_targets)
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
    dt_capped: int = 0  # commands after a gap longer than SafetyLimits.dt_max_s (a stall): limited over dt_max_s
    dt_nonpositive: int = 0  # commands whose tick was not after the last command's: no motion allowed
    rungs: dict = field(default_factory=dict)  # rung name -> commands


class Command(NamedTuple):
    q_rad: np.ndarray  # (D,) float64 joint targets, within the safety limits
    rung: str  # the chunk's rung, "continue" (an older chunk), or "hold"
    chunk_obs_seq: int  # observation the chunk was planned from; -1 for a hold


def command(buffer: ChunkBuffer | None, t_ns: int, last_q_rad: np.ndarray | None, last_t_ns: int | None,
            measured_q_rad: np.ndarray | None, limits: SafetyLimits, period_s: float,
            counters: CommandCounters) -> Command | None:
    """The command for the tick at t_ns (monotonic ns), or None when there is no state at all yet.

    buffer: the chunks to follow (None: none is trusted, e.g. their runtime is dead: hold). last_q_rad: the last
    command (D,) and last_t_ns its tick time (None before the first). measured_q_rad: the newest finite observed
    position (D,) (None before any). period_s: the configured control period, s (the first command's dt).
    Updates `counters`."""
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
    q, clamped = limits.clamp(q, reference, elapsed_s(t_ns, last_t_ns, limits, period_s, counters))
    counters.clamped += clamped
    counters.ticks += 1
    counters.rungs[rung] = counters.rungs.get(rung, 0) + 1
    return Command(q, rung, chunk_seq)


def elapsed_s(t_ns: int, last_t_ns: int | None, limits: SafetyLimits, period_s: float,
              counters: CommandCounters) -> float:
    """The time the velocity limit is spread over, s: since the last command's tick (period_s before the first),
    at least 0 (a tick not after the last one: no motion, dt_nonpositive) and at most max(limits.dt_max_s,
    period_s) (a stall: dt_capped)."""
    if last_t_ns is None:
        return period_s
    dt_s = (t_ns - last_t_ns) / 1e9
    if dt_s <= 0:
        counters.dt_nonpositive += 1
        return 0.0
    dt_max_s = max(limits.dt_max_s, period_s)
    if dt_s > dt_max_s:
        counters.dt_capped += 1
        return dt_max_s
    return dt_s
