"""Joint limits (position box, speed, acceleration) and the config every controller shares; the check itself is
control/gate.py."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class SafetyLimits:
    """Per-joint limits, each field from the first source that has it: given here (command line, launch file) >
    the URDF (--urdf) > the policy manifest's "limits" > the Schunk LWA 4P defaults (6 joints only); see
    docs/replay.md#joint-limits.

    The fields left None are filled when a run starts (control/limits.resolve_limits); the gate needs them set.
    A position limit may be infinite (a continuous joint); prismatic joints are in m and m/s. Every command
    passes control/gate.LimitGate, which enforces them.
    """

    # Lower joint position limits, rad (unset: from --urdf, the manifest, else -2.967 on 6 joints).
    q_min_rad: list[float] | None = None
    # Upper joint position limits, rad (unset: from --urdf, the manifest, else 2.967 on 6 joints).
    q_max_rad: list[float] | None = None
    # Joint speed limits between two commands, rad/s: one for every joint, or one per joint (unset: from --urdf,
    # the manifest, else 2.0 on 6 joints).
    qd_max_rad_s: list[float] | float | None = None
    # Joint acceleration limits between two command steps, rad/s^2: one for every joint, or one per joint (unset:
    # no acceleration limit). Checked against the velocity of the last command step (0 before the first).
    qdd_max_rad_s2: list[float] | float | None = None
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
        for name in ("qd_max_rad_s", "qdd_max_rad_s2"):
            if isinstance(value := getattr(self, name), list) and len(value) == 1:
                setattr(self, name, value[0])  # one value on the command line: every joint
        for name in ("q_min_rad", "q_max_rad"):
            if (value := getattr(self, name)) is not None and np.any(np.isnan(value)):
                raise ValueError(f"SafetyLimits.{name} must be numbers (inf: no limit), got {value}")
        if self.q_min_rad is not None and self.q_max_rad is not None:
            if len(self.q_min_rad) != len(self.q_max_rad):
                raise ValueError("SafetyLimits.q_min_rad and q_max_rad must have the same length, got "
                                 f"{len(self.q_min_rad)} and {len(self.q_max_rad)}")
            if any(lo >= hi for lo, hi in zip(self.q_min_rad, self.q_max_rad)):
                raise ValueError("SafetyLimits.q_min_rad must be below q_max_rad for every joint")
        for name, what in (("qd_max_rad_s", "speed"), ("qdd_max_rad_s2", "acceleration")):
            self._check_rate(name, what)
        if not 0 < self.dt_max_s <= 10:  # inf: a stall of any length would turn into a jump
            raise ValueError(f"SafetyLimits.dt_max_s must be in (0, 10] s, got {self.dt_max_s}")

    def _check_rate(self, name: str, what: str) -> None:
        """A speed or acceleration limit: unset, or finite and > 0, one value or one per joint."""
        if (value := getattr(self, name)) is None:
            return
        if isinstance(value, list) and self.q_min_rad is not None and len(value) != len(self.q_min_rad):
            raise ValueError(f"SafetyLimits.{name} has {len(value)} entries, q_min_rad {len(self.q_min_rad)}: "
                             f"give one {what}, or one per joint")
        if not np.all(np.isfinite(value) & (np.asarray(value) > 0)):
            raise ValueError(f"SafetyLimits.{name} must be finite and > 0, got {value}")


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
