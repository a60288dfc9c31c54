"""One tick's command: chunk buffer + tick time -> interpolated target, or a hold -> the limit gate.

The one command path of every controller: the control loop node (control/loop.py), the embedded Controller
(edgeinfer/node/controller.py) and a fleet robot's control (sim/fleet_robot.py) call `command()` once per tick
with their own LimitGate and CommandCounters, so holds, the no-state case, non-finite targets and the limits
behave (and are counted) the same in all:

    sample the newest chunk that covers t_ns (control/buffer.py)
      -> none (or no chunk is trusted): hold the last command, else the measured position clipped to the box
         (rung "hold"); neither yet: nothing safe to command, none is made (no_state)
      -> the limit gate (control/gate.py): position box, speed and acceleration limits from the last command,
         over the measured time since its tick. A non-finite target never leaves: the gate replaces it with that
         reference (nonfinite_targets); a target of another joint count is a hold (joints_refused)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from edgeinfer.control.buffer import ChunkBuffer
from edgeinfer.control.gate import LimitGate


@dataclass
class CommandCounters:
    """What the command path did, per tick. Every controller's stats extend this, so the names are shared."""

    ticks: int = 0  # commands made
    holds: int = 0  # commands that held (no trusted chunk covered the tick, or its target was refused)
    no_state: int = 0  # ticks before any observation or command: nothing safe to command, none made
    clamped: int = 0  # commands changed by the limit gate (any of the three limits below, or a non-finite target)
    clamped_position: int = 0  # commands the position box changed
    clamped_velocity: int = 0  # commands the speed limit changed
    clamped_acceleration: int = 0  # commands the acceleration limit changed (when one is set)
    reference_outside_box: int = 0  # first commands whose measured position was outside the box: clipped into it
    joints_refused: int = 0  # targets of another joint count than the limits': held instead (never broadcast)
    nonfinite_targets: int = 0  # non-finite interpolated targets replaced by the gate (never sent)
    dt_capped: int = 0  # commands after a gap longer than SafetyLimits.dt_max_s (a stall): limited over dt_max_s
    dt_nonpositive: int = 0  # commands whose tick was not after the last command's: no motion allowed
    rungs: dict = field(default_factory=dict)  # rung name -> commands


class Command(NamedTuple):
    q_rad: np.ndarray  # (D,) float64 joint targets, within the safety limits
    rung: str  # the chunk's rung, "continue" (an older chunk), or "hold"
    chunk_obs_seq: int  # observation the chunk was planned from; -1 for a hold


def command(buffer: ChunkBuffer | None, t_ns: int, gate: LimitGate, measured_q_rad: np.ndarray | None,
            period_s: float, counters: CommandCounters) -> Command | None:
    """The command for the tick at t_ns (monotonic ns), or None when there is no state at all yet.

    buffer: the chunks to follow (None: none is trusted, e.g. their runtime is dead: hold). gate: the caller's
    LimitGate, holding its last command. measured_q_rad: the newest finite observed position (D,) (None before
    any). period_s: the configured control period, s (the first command's dt). Updates `counters`."""
    sample = buffer.sample(t_ns) if buffer is not None else None
    target, rung, chunk_seq = sample if sample is not None else (None, "hold", -1)
    if target is not None and not np.all(np.isfinite(target)):  # the gate replaces it; count it, never send it
        counters.nonfinite_targets += 1
    q = gate.admit(target, t_ns, measured_q_rad, period_s, counters)
    if q is None:
        counters.no_state += 1
        return None
    if gate.held:
        rung, chunk_seq = "hold", -1
    counters.holds += rung == "hold"
    counters.ticks += 1
    counters.rungs[rung] = counters.rungs.get(rung, 0) + 1
    return Command(q, rung, chunk_seq)
