"""Joint position and velocity limits applied to every command before it leaves the control loop."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class SafetyLimits:
    """Per-joint limits, each field from the first source that has it: given here (command line, launch file) >
    the URDF (--urdf) > the policy manifest's "limits" > the Schunk LWA 4P defaults (6 joints only); see
    docs/replay.md#joint-limits.

    The fields left None are filled when a run starts (control/limits.resolve_limits); clamp() needs them set.
    A position limit may be infinite (a continuous joint); prismatic joints are in m and m/s.
    """

    # Lower joint position limits, rad (unset: from --urdf, the manifest, else -2.967 on 6 joints).
    q_min_rad: list[float] | None = None
    # Upper joint position limits, rad (unset: from --urdf, the manifest, else 2.967 on 6 joints).
    q_max_rad: list[float] | None = None
    # Joint speed limits between two commands, rad/s: one for every joint, or one per joint (unset: from --urdf,
    # the manifest, else 2.0 on 6 joints).
    qd_max_rad_s: list[float] | float | None = None
    # The longest gap between two commands the speed limit is spread over, s: after a longer one (a stall) the
    # step is limited as if this long had passed (or one control period, if that is longer), so a stall never
    # turns into a jump.
    dt_max_s: float = 0.1
    # The robot's URDF: position and velocity limits of its joints, for the fields not given (yourdfpy).
    urdf: Path | None = None
    # The URDF joints the policy commands, in its order: names or fnmatch patterns, comma-separated, e.g.
    # "r_*,l_*" (unset: by the log's or policy's joint names, else its actuated joints in file order).
    urdf_joints: str | None = None

    def __post_init__(self):
        self.urdf = Path(self.urdf) if self.urdf is not None else None
        if isinstance(self.qd_max_rad_s, list) and len(self.qd_max_rad_s) == 1:
            self.qd_max_rad_s = self.qd_max_rad_s[0]  # one value on the command line: every joint
        for name in ("q_min_rad", "q_max_rad"):
            if (value := getattr(self, name)) is not None and np.any(np.isnan(value)):
                raise ValueError(f"SafetyLimits.{name} must be numbers (inf: no limit), got {value}")
        if self.q_min_rad is not None and self.q_max_rad is not None:
            if len(self.q_min_rad) != len(self.q_max_rad):
                raise ValueError("SafetyLimits.q_min_rad and q_max_rad must have the same length, got "
                                 f"{len(self.q_min_rad)} and {len(self.q_max_rad)}")
            if any(lo >= hi for lo, hi in zip(self.q_min_rad, self.q_max_rad)):
                raise ValueError("SafetyLimits.q_min_rad must be below q_max_rad for every joint")
        if isinstance(self.qd_max_rad_s, list) and self.q_min_rad is not None and \
                len(self.qd_max_rad_s) != len(self.q_min_rad):
            raise ValueError(f"SafetyLimits.qd_max_rad_s has {len(self.qd_max_rad_s)} entries, q_min_rad "
                             f"{len(self.q_min_rad)}: give one speed, or one per joint")
        if self.qd_max_rad_s is not None and not np.all(np.isfinite(self.qd_max_rad_s) & (np.asarray(
                self.qd_max_rad_s) > 0)):
            raise ValueError(f"SafetyLimits.qd_max_rad_s must be finite and > 0, got {self.qd_max_rad_s}")
        if not self.dt_max_s > 0:
            raise ValueError(f"SafetyLimits.dt_max_s must be > 0, got {self.dt_max_s}")

    def clamp(self, q_rad: np.ndarray, q_last_rad: np.ndarray | None, dt_s: float) -> tuple[np.ndarray, bool]:
        """Clamp q_rad (D,) to the position box and to qd_max_rad_s * dt_s from the last command q_last_rad (D,),
        dt_s seconds earlier (control/command.py passes the measured time since it). Returns (q_rad, was_clamped).

        A non-finite target is replaced by the last command (or, when there is none, the box centre; 0 clipped
        into the box on a joint with an infinite limit).
        """
        if not np.all(np.isfinite(q_rad)):
            if q_last_rad is not None:
                return np.array(q_last_rad, dtype=np.float64), True
            lo, hi = np.asarray(self.q_min_rad, dtype=np.float64), np.asarray(self.q_max_rad, dtype=np.float64)
            with np.errstate(invalid="ignore"):  # inf - inf on an unlimited joint
                centre = (lo + hi) / 2
            return np.where(np.isfinite(centre), centre, np.clip(0.0, lo, hi)), True
        q = np.clip(q_rad, self.q_min_rad, self.q_max_rad)
        if q_last_rad is not None:
            step = np.multiply(self.qd_max_rad_s, dt_s)
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
    # Joint position and velocity limits (unset fields resolved when the run starts: control/limits.py).
    limits: SafetyLimits = field(default_factory=SafetyLimits)

    def __post_init__(self):
        if not 0 <= self.blend_ms <= 1000:
            raise ValueError(f"{type(self).__name__}.blend_ms must be in [0, 1000], got {self.blend_ms}")
