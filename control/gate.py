"""The limit gate: the one check between every command source and the wire.

Every command the control loop, the embedded Controller or a fleet robot's control makes passes
`LimitGate.admit` (through control/command.py), which enforces, per joint and against the last *commanded*
position (the reference):

    target of the wrong joint count, or none (a hold)  -> the reference            (joints_refused)
    non-finite target                                  -> the reference            (nonfinite_targets, command.py)
    |q - ref| <= qd_max * dt                           speed                       (clamped_velocity)
    |(q - ref)/dt - v_last| <= qdd_max * dt            acceleration, when set      (clamped_acceleration)
    q_min <= q <= q_max                                the position box, last      (clamped_position)

The reference is always inside the box: it is the last command (inside by induction), clipped to the box
again in case the limits changed, or, before the first command, the measured position clipped to the box
(reference_outside_box counts a measurement outside it). A measurement outside the box never becomes a
reference: this is what let one observation at q0 = 1e6 rad turn every later command into 1e6 (the velocity
clip around an out-of-box reference undid the box clip). With the reference inside the box, clipping to the
box last keeps the speed bound: the box is convex and holds the reference, so the clip only moves q toward it.
The acceleration limit gives way to the box (a target at the box edge is not braked early: the arm's own limits
are the position box); it is counted, and the speed and box bounds hold for every command whatever the
inputs (tests/test_limit_gate.py states these as hypothesis properties).

dt is the measured time since the last command's tick (ros2_control's limiters use the measured period too), at
most max(dt_max_s, period) after a stall (dt_capped) and 0 for a tick not after the last one (no motion,
dt_nonpositive); the first command moves at most one configured period from the measured position.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from edgeinfer.control.safety import SafetyLimits


class GateCounters(Protocol):
    """What the gate counts (CommandCounters has every field)."""

    clamped: int
    clamped_position: int
    clamped_velocity: int
    clamped_acceleration: int
    reference_outside_box: int
    joints_refused: int
    dt_capped: int
    dt_nonpositive: int


class LimitGate:
    """Holds the last command (its reference) and admits each new one within the limits.

    `limits` is read at every call (its fields must be set: control/limits.resolve_limits), so a caller may change
    it in place. Not thread-safe: one command source per gate."""

    def __init__(self, limits: SafetyLimits):
        self.limits = limits
        self.last_q_rad: np.ndarray | None = None  # (D,) float64, the last command, inside the box
        self.last_t_ns: int | None = None  # its tick time, monotonic ns
        self.last_v_rad_s: np.ndarray | None = None  # (D,) velocity of the last command step (acceleration limit)
        self.held = False  # the last admit() held: no target, or one of the wrong joint count

    @property
    def n_joints(self) -> int:
        return len(self.limits.q_min_rad)

    def admit(self, target_q_rad: np.ndarray | None, t_ns: int, measured_q_rad: np.ndarray | None,
              period_s: float, counters: GateCounters) -> np.ndarray | None:
        """The command for the tick at t_ns (monotonic ns): target_q_rad (D,) float64 rad within the limits, or
        the reference when it is None (a hold) or not (D,) for the limits' D joints (joints_refused). A non-finite
        target becomes the reference (the box centre, 0 on an unlimited joint, when there is none).

        measured_q_rad: the newest observed position (D,) (None: none yet); used only before the first command.
        period_s: the configured control period, s (the first command's dt). Returns a fresh (D,) float64 array
        inside the box and within qd_max_rad_s * dt of the reference; None when there is nothing to command (a
        hold with neither a command nor a finite measurement so far). Updates `counters` and the gate's state."""
        lo = np.asarray(self.limits.q_min_rad, dtype=np.float64)
        hi = np.asarray(self.limits.q_max_rad, dtype=np.float64)
        ref = self._reference(measured_q_rad, lo, hi, counters)
        target = None if target_q_rad is None else np.asarray(target_q_rad, dtype=np.float64)
        if target is not None and target.shape != lo.shape:  # never broadcast a 1-joint target to every joint
            counters.joints_refused += 1
            target = None
        self.held = target is None
        if target is None:
            if ref is None:
                return None
            target = ref
        finite = bool(np.all(np.isfinite(target)))
        q = target if finite else ref if ref is not None else _centre(lo, hi)
        if ref is not None:
            q = self._rate_limited(q, ref, self._elapsed_s(t_ns, period_s, counters), counters)
        boxed = np.clip(q, lo, hi)
        counters.clamped_position += bool(np.any(boxed != q))
        counters.clamped += bool(np.any(boxed != target))  # a non-finite target is never equal
        if ref is not None and self.last_t_ns is not None and t_ns > self.last_t_ns:
            self.last_v_rad_s = (boxed - ref) / ((t_ns - self.last_t_ns) / 1e9)
        self.last_q_rad, self.last_t_ns = boxed, t_ns
        return boxed

    def _reference(self, measured_q_rad, lo: np.ndarray, hi: np.ndarray, counters: GateCounters):
        """The last command, else the finite measured position of the right shape, clipped to the box; None."""
        if self.last_q_rad is not None:
            return np.clip(self.last_q_rad, lo, hi)
        if measured_q_rad is None:
            return None
        measured = np.asarray(measured_q_rad, dtype=np.float64)
        if measured.shape != lo.shape or not np.all(np.isfinite(measured)):
            return None
        ref = np.clip(measured, lo, hi)
        counters.reference_outside_box += bool(np.any(ref != measured))
        return ref

    def _rate_limited(self, q: np.ndarray, ref: np.ndarray, dt_s: float, counters: GateCounters) -> np.ndarray:
        """q within the speed (and acceleration) limits from ref over dt_s."""
        step = np.multiply(self.limits.qd_max_rad_s, dt_s)
        out = np.clip(q, ref - step, ref + step)
        counters.clamped_velocity += bool(np.any(out != q))
        if self.limits.qdd_max_rad_s2 is not None and dt_s > 0:
            v_last = self.last_v_rad_s if self.last_v_rad_s is not None else np.zeros_like(ref)
            dv = np.multiply(self.limits.qdd_max_rad_s2, dt_s)
            v = (out - ref) / dt_s
            v_ok = np.clip(v, v_last - dv, v_last + dv)
            if np.any(v_ok != v):
                counters.clamped_acceleration += 1
                out = np.clip(ref + v_ok * dt_s, ref - step, ref + step)  # rounding never passes the speed bound
        return out

    def _elapsed_s(self, t_ns: int, period_s: float, counters: GateCounters) -> float:
        """The time the speed limit is spread over, s: since the last command's tick (period_s before the first),
        at least 0 (a tick not after the last one: no motion, dt_nonpositive) and at most max(dt_max_s, period_s)
        (a stall: dt_capped)."""
        if self.last_t_ns is None:
            return period_s
        dt_s = (t_ns - self.last_t_ns) / 1e9
        if dt_s <= 0:
            counters.dt_nonpositive += 1
            return 0.0
        dt_max_s = max(self.limits.dt_max_s, period_s)
        if dt_s > dt_max_s:
            counters.dt_capped += 1
            return dt_max_s
        return dt_s


def _centre(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The box centre; 0 clipped into the box on a joint with an infinite limit."""
    with np.errstate(invalid="ignore"):  # inf - inf on an unlimited joint
        centre = (lo + hi) / 2
    return np.where(np.isfinite(centre), centre, np.clip(0.0, lo, hi))
