"""Joint position and velocity limits applied to every command before it leaves the control loop."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class SafetyLimits:
    """Per-joint limits. Defaults are the Schunk LWA 4P ranges (±170° on every joint, a conservative
    reading of the datasheet) and 2 rad/s, above the 1.3 rad/s peak seen in the recordings."""

    q_min_rad: list[float] = field(default_factory=lambda: [-2.967] * 6)  # lower joint position limits, rad
    q_max_rad: list[float] = field(default_factory=lambda: [2.967] * 6)  # upper joint position limits, rad
    qd_max_rad_s: float = 2.0  # joint speed limit between two commands, rad/s (every joint)
    # The longest gap between two commands the speed limit is spread over, s: after a longer one (a stall) the
    # step is limited as if this long had passed (or one control period, if that is longer), so a stall never
    # turns into a jump.
    dt_max_s: float = 0.1

    def __post_init__(self):
        if not np.all(np.isfinite(np.r_[self.q_min_rad, self.q_max_rad, self.qd_max_rad_s])):
            raise ValueError("SafetyLimits: limits must be finite numbers")
        if len(self.q_min_rad) != len(self.q_max_rad):
            raise ValueError("SafetyLimits.q_min_rad and q_max_rad must have the same length")
        if any(lo >= hi for lo, hi in zip(self.q_min_rad, self.q_max_rad)):
            raise ValueError("SafetyLimits.q_min_rad must be below q_max_rad for every joint")
        if self.qd_max_rad_s <= 0:
            raise ValueError(f"SafetyLimits.qd_max_rad_s must be > 0, got {self.qd_max_rad_s}")
        if not self.dt_max_s > 0:
            raise ValueError(f"SafetyLimits.dt_max_s must be > 0, got {self.dt_max_s}")

    def clamp(self, q_rad: np.ndarray, q_last_rad: np.ndarray | None, dt_s: float) -> tuple[np.ndarray, bool]:
        """Clamp q_rad (D,) to the position box and to qd_max_rad_s * dt_s from the last command q_last_rad (D,),
        dt_s seconds earlier (control/command.py passes the measured time since it). Returns (q_rad, was_clamped).

        A non-finite target is replaced by the last command (or the box centre when there is none).
        """
        if not np.all(np.isfinite(q_rad)):
            fallback = q_last_rad if q_last_rad is not None else (np.add(self.q_min_rad, self.q_max_rad) / 2)
            return np.array(fallback, dtype=np.float64), True
        q = np.clip(q_rad, self.q_min_rad, self.q_max_rad)
        if q_last_rad is not None:
            step = self.qd_max_rad_s * dt_s
            q = np.clip(q, q_last_rad - step, q_last_rad + step)
        return q, bool(np.any(q != q_rad))


@dataclass(kw_only=True)
class CommandConfig:
    """How every controller turns chunks into commands (control/command.py): the cross-fade at a chunk boundary,
    then the safety clamp. Shared by the control loop node (ControlConfig) and the embedded Controller
    (ControllerConfig), so the two cannot drift apart."""

    # Cross-fade from the previous chunk's targets to a new chunk's at a chunk boundary, ms (control/buffer.py;
    # 0: switch at once).
    blend_ms: float = 10.0
    limits: SafetyLimits = field(default_factory=SafetyLimits)  # joint position and velocity limits

    def __post_init__(self):
        if not 0 <= self.blend_ms <= 1000:
            raise ValueError(f"{type(self).__name__}.blend_ms must be in [0, 1000], got {self.blend_ms}")
