"""Joint position and velocity limits from a robot's URDF, for the joints a policy commands, in its order.

The URDF is read with yourdfpy (https://github.com/clemense/yourdfpy), without meshes or a scene graph: only the
`<joint>` elements matter. Which URDF joints, in which order, is decided once (`select_joints`):

    --urdf-joints given         its comma-separated names or fnmatch patterns, each expanded over the actuated
                                joints in file order ("r_*,l_*": the right arm's joints, then the left's)
    else joint names known      the log's (or the policy's) joint names, each looked up by exact name
    else                        every actuated joint in file order (a count that differs from the policy's is
                                reported by the joint-count check, with the hint to pass --urdf-joints)

Actuated: revolute, continuous and prismatic joints that do not mimic another (a mimic joint follows its
master, nobody commands it). A continuous joint has no position limit: -inf/+inf (not +-pi: a wrist may turn
past a half turn and keep going). A limit the URDF lacks (no lower/upper on a revolute or prismatic joint, a
velocity of 0 or none) is NaN here: control/limits.py refuses it, naming the joint, when that field is taken
from the URDF. Prismatic joints are in m and m/s (the SafetyLimits field names say rad).
"""
from __future__ import annotations

import fnmatch
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ACTUATED_TYPES = ("revolute", "continuous", "prismatic")
# A URDF velocity limit at or above this is a placeholder (Reachy 2's URDF says 100 rad/s on every joint; no arm
# joint turns that fast): it is used as given, since the URDF is what the user named, but warned about.
PLACEHOLDER_QD_RAD_S = 50.0


class UrdfError(ValueError):
    """A URDF that cannot be read, or joints that cannot be chosen in it; the message names the file."""


@dataclass(frozen=True)
class UrdfJoint:
    name: str
    type: str
    lower: float  # rad (m for prismatic); -inf for continuous, NaN when the URDF gives none
    upper: float  # rad (m); +inf for continuous, NaN when the URDF gives none
    velocity: float  # rad/s (m/s); NaN when the URDF gives none (or 0)


@dataclass(frozen=True)
class UrdfLimits:
    """The limits of the chosen joints, (D,) float64 each, in command order."""

    path: Path
    names: list[str]  # the URDF joints chosen, in command order
    how: str  # how they were chosen (for the report)
    q_min_rad: np.ndarray
    q_max_rad: np.ndarray
    qd_max_rad_s: np.ndarray

    def placeholders(self) -> list[str]:
        """The chosen joints whose velocity limit is a placeholder (>= PLACEHOLDER_QD_RAD_S)."""
        return [n for n, v in zip(self.names, self.qd_max_rad_s) if v >= PLACEHOLDER_QD_RAD_S]


def actuated_joints(path: Path) -> list[UrdfJoint]:
    """The actuated joints of the URDF at `path` (see the module docstring), in file order. Raises UrdfError
    naming the file when it is missing or not a URDF yourdfpy can parse."""
    import yourdfpy  # only a run given a URDF imports it (and its trimesh)

    path = Path(path)
    if not path.is_file():
        raise UrdfError(f"URDF not found: {path}")
    logging.getLogger("yourdfpy").setLevel(logging.ERROR)  # it logs every mesh it does not load
    try:
        urdf = yourdfpy.URDF.load(str(path), build_scene_graph=False, build_collision_scene_graph=False,
                                  load_meshes=False, load_collision_meshes=False)
    except Exception as e:  # yourdfpy raises KeyError, ValueError, lxml errors...: all mean "not a URDF"
        raise UrdfError(f"{path}: not a readable URDF ({type(e).__name__}: {e})") from None
    out = []
    for j in urdf.robot.joints:
        if j.type not in ACTUATED_TYPES or j.mimic is not None:
            continue
        lim = j.limit
        lower, upper = (-np.inf, np.inf) if j.type == "continuous" else (_num(lim, "lower"), _num(lim, "upper"))
        velocity = _num(lim, "velocity")
        out.append(UrdfJoint(j.name, j.type, lower, upper, velocity if velocity > 0 else np.nan))
    return out


def _num(limit, name: str) -> float:
    value = getattr(limit, name, None) if limit is not None else None
    return float(value) if value is not None else np.nan


def select_joints(path: Path, joints: list[UrdfJoint], joint_names: list[str] | None = None,
                  names_from: str = "the log", urdf_joints: str | None = None) -> tuple[list[UrdfJoint], str]:
    """The joints of `joints` (actuated_joints(path)) the policy commands, in its order, and how they were
    chosen (see the module docstring). Raises UrdfError naming the URDF for a name or pattern that matches
    no actuated joint, and for a joint chosen twice."""
    by_name = {j.name: j for j in joints}
    if urdf_joints is not None:
        chosen, how = [], f"--urdf-joints {urdf_joints!r}"
        for item in (s.strip() for s in urdf_joints.split(",")):
            hits = [j for j in joints if fnmatch.fnmatchcase(j.name, item)] if item else []
            if not hits:
                raise UrdfError(f"{path}: --urdf-joints item {item!r} matches no actuated joint; its actuated "
                                f"joints: {list(by_name)}")
            chosen += hits
    elif joint_names is not None:
        missing = [n for n in joint_names if n not in by_name]
        if missing:
            raise UrdfError(f"{path}: no actuated joint named {missing} (the joint names of {names_from}); its "
                            f"actuated joints: {list(by_name)}. Choose them with --urdf-joints")
        chosen, how = [by_name[n] for n in joint_names], f"by the joint names of {names_from}"
    else:
        chosen, how = joints, "its actuated joints in file order"
    names = [j.name for j in chosen]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise UrdfError(f"{path}: joint(s) {twice} chosen twice ({how})")
    return chosen, how


def read_urdf_limits(path: Path, joint_names: list[str] | None = None, names_from: str = "the log",
                     urdf_joints: str | None = None) -> UrdfLimits:
    """The limits of the URDF at `path` for the joints chosen by select_joints. Raises UrdfError naming the
    file."""
    path = Path(path)
    chosen, how = select_joints(path, actuated_joints(path), joint_names, names_from, urdf_joints)
    return UrdfLimits(path, [j.name for j in chosen], how, np.array([j.lower for j in chosen], dtype=np.float64),
                      np.array([j.upper for j in chosen], dtype=np.float64),
                      np.array([j.velocity for j in chosen], dtype=np.float64))
