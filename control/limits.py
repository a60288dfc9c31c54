"""Where each joint limit comes from: one precedence, applied when a run starts, field by field.

    given (command line, launch file, a SafetyLimits built in code)   > --urdf (control/urdf_limits.py)
      > the policy manifest's "limits" (fitted on its training data)    > the built-in Schunk LWA 4P defaults

For each of q_min_rad, q_max_rad and qd_max_rad_s the first source that has it wins; the result names the
source of each (report.json "limits"). The defaults are the Schunk LWA 4P's, 6 joints: a robot with another
joint count needs one of the other sources, which the joint-count check (joint_count_error) says.

A velocity limit from the URDF at or above urdf_limits.PLACEHOLDER_QD_RAD_S is a placeholder (Reachy 2's URDF
says 100 rad/s): it is kept as given, and warned about, since it leaves the rate limit without effect.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from edgeinfer.control.safety import SafetyLimits
from edgeinfer.control.urdf_limits import PLACEHOLDER_QD_RAD_S, UrdfError, read_urdf_limits
from edgeinfer.core.errors import LogError

FIELDS = ("q_min_rad", "q_max_rad", "qd_max_rad_s")
# The Schunk LWA 4P: +-170 deg on every joint (a conservative reading of the datasheet), 2 rad/s (above the
# 1.3 rad/s peak of the recordings). Only for 6 joints.
DEFAULTS = {"q_min_rad": [-2.967] * 6, "q_max_rad": [2.967] * 6, "qd_max_rad_s": [2.0] * 6}
DEFAULT_SOURCE = "default (Schunk LWA 4P, 6 joints)"


class LimitsError(ValueError):
    """Limits that cannot be resolved: a URDF that lacks one, a malformed manifest "limits"; the message names
    the file and field."""


class JointCountError(LogError):
    """The log, the policy and the limits do not have one joint count; the message names every count and where
    it comes from (a LogError, core/errors.py: the run cannot use this log with this policy and these limits)."""


@dataclass
class ResolvedLimits:
    """The limits a run uses (every field set, no URDF left to read) and where each field came from."""

    limits: SafetyLimits
    sources: dict[str, str]  # field -> "given" | "urdf PATH" | "manifest PATH" | DEFAULT_SOURCE
    urdf_joints: list[str] | None = None  # the URDF joints chosen, in command order (when the URDF was read)
    urdf_how: str | None = None  # how they were chosen
    warnings: list[str] = field(default_factory=list)

    @property
    def n_joints(self) -> int:
        return len(self.limits.q_min_rad)

    def section(self) -> dict:
        """report.json's "limits": the values used (null: no limit, a continuous joint), the source of each."""
        lim = self.limits
        qd = np.broadcast_to(lim.qd_max_rad_s, (self.n_joints,)).tolist()  # a 1-joint robot's is one number
        qdd = None if lim.qdd_max_rad_s2 is None else np.broadcast_to(lim.qdd_max_rad_s2, (self.n_joints,)).tolist()
        return {"q_min_rad": list(lim.q_min_rad), "q_max_rad": list(lim.q_max_rad), "qd_max_rad_s": qd,
                "qdd_max_rad_s2": qdd, "dt_max_s": lim.dt_max_s, "sources": dict(self.sources),
                "urdf_joints": self.urdf_joints, "urdf_joints_chosen": self.urdf_how, "warnings": list(self.warnings)}


def resolve_limits(given: SafetyLimits, joint_names: list[str] | None = None, names_from: str = "the log",
                   manifest_limits: dict | None = None, manifest_name: str = "the policy manifest",
                   counts: dict[str, tuple[int, str]] | None = None) -> ResolvedLimits:
    """The limits a run uses: each field of `given` that is set, else from given.urdf (its joints chosen by
    `joint_names` (D,) or given.urdf_joints, see control/urdf_limits.py), else from `manifest_limits` (the
    manifest's "limits": {"q_min_rad": [D], "q_max_rad": [D], "qd_max_rad_s": [D], ...}), else DEFAULTS. A
    scalar qd_max_rad_s is spread over the joints.

    counts: the joint counts the limits must match, {"the log": (D, where), "the policy": (D, where)}. Raises
    JointCountError naming every count (these and each field's) when they differ; LimitsError (or UrdfError)
    naming the file and field for a URDF joint that lacks a limit taken from it or a malformed manifest "limits".
    """
    urdf = (read_urdf_limits(given.urdf, joint_names, names_from, given.urdf_joints)
            if given.urdf is not None and any(getattr(given, f) is None for f in FIELDS) else None)
    manifest = _manifest_limits(manifest_limits, manifest_name) if manifest_limits is not None else None
    values, sources = {}, {}
    for name in FIELDS:
        if (value := getattr(given, name)) is not None:
            values[name], sources[name] = value, "given"
        elif urdf is not None:
            values[name], sources[name] = _from_urdf(urdf, name), f"urdf {urdf.path}"
        elif manifest is not None:
            values[name], sources[name] = manifest[name], f"manifest {manifest_name}"
        else:
            values[name], sources[name] = list(DEFAULTS[name]), DEFAULT_SOURCE
    if not isinstance(values["qd_max_rad_s"], list):  # one speed for every joint
        values["qd_max_rad_s"] = [float(values["qd_max_rad_s"])] * len(values["q_min_rad"])
    how = f" ({urdf.how})" if urdf is not None else ""
    one_given = [f for f in ("q_min_rad", "q_max_rad") if sources[f] == "given" and len(values[f]) == 1]
    if error := joint_count_error({**(counts or {}), **_limit_counts(values, sources, how)}, one_given):
        raise JointCountError(error)
    try:
        limits = replace(given, urdf=None, urdf_joints=None, **values)
    except ValueError as e:
        raise LimitsError(f"the limits from {sorted(set(sources.values()))}: {e}") from None
    out = ResolvedLimits(limits, sources, urdf.names if urdf else None, urdf.how if urdf else None)
    if urdf is not None and sources["qd_max_rad_s"].startswith("urdf") and (slow := urdf.placeholders()):
        out.warnings.append(f"{urdf.path}: velocity limits of {PLACEHOLDER_QD_RAD_S:g} rad/s or more on {slow} "
                            "look like placeholders: the rate limit does nothing there; pass --qd-max-rad-s")
    return out


def _limit_counts(values: dict, sources: dict, how: str) -> dict[str, tuple[int | dict[int, str], str]]:
    """{"the limits": (D, where)}: their joint count ({D: fields} when the fields disagree) and where each field
    comes from."""
    by_count: dict[int, list[str]] = {}
    by_source: dict[str, list[str]] = {}
    for name in FIELDS:
        by_count.setdefault(len(values[name]), []).append(name)
        by_source.setdefault(sources[name], []).append(name)
    where = ", ".join(f"{'/'.join(names)} {src}{how if src.startswith('urdf') else ''}"
                      for src, names in by_source.items())
    n = next(iter(by_count)) if len(by_count) == 1 else {k: "/".join(v) for k, v in by_count.items()}
    return {"the limits": (n, where)}


def _from_urdf(urdf, name: str) -> list[float]:
    values = getattr(urdf, name)
    if missing := [n for n, v in zip(urdf.names, values) if np.isnan(v)]:
        raise UrdfError(f"{urdf.path}: joint(s) {missing} have no {name} limit in the URDF; pass --"
                        f"{name.replace('_', '-')}")
    return values.tolist()


def _manifest_limits(raw: dict, where: str) -> dict:
    """The manifest's "limits" checked: three lists of numbers of one length. Raises LimitsError naming the field."""
    if not isinstance(raw, dict):
        raise LimitsError(f"{where}: \"limits\" must be a table, got {type(raw).__name__}")
    out = {}
    for name in FIELDS:
        value = raw.get(name)
        if not isinstance(value, list) or not all(isinstance(v, (int, float)) for v in value):
            raise LimitsError(f"{where}: limits.{name} must be a list of numbers, got {value!r}")
        out[name] = [float(v) for v in value]
    if len({len(v) for v in out.values()}) != 1:
        raise LimitsError(f"{where}: limits.q_min_rad, q_max_rad, qd_max_rad_s have "
                          f"{[len(v) for v in out.values()]} entries: they must have one per joint")
    return out


def joint_count_error(counts: dict[str, tuple[int | dict[int, str], str]], one_given: Sequence[str] = ()
                      ) -> str | None:
    """None when every party has the same joint count, else the one message naming them all: counts is
    {"the log": (D, where), "the policy": (D, where), "the limits": (D or {D: its fields}, where)} (in that
    order); one_given: the position limit fields given one value (--q-min-rad -1), which take one per joint. It
    says what to do: the option to fix, unless the log and the policy differ (the caller knows the remedy: a
    policy for this robot)."""
    numbers = {k for n, _ in counts.values() for k in (n if isinstance(n, dict) else [n])}
    if len(numbers) <= 1:
        return None
    verbs = {"the log": "has {} joints", "the policy": "expects {}"}

    def count(n) -> str:
        return " and ".join(f"{k} ({fields})" for k, fields in n.items()) if isinstance(n, dict) else str(n)

    head = ", ".join(f"{who} {verbs.get(who, 'have {}').format(count(n))}" for who, (n, _) in counts.items())
    where = "; ".join(f"{who}: {w}" for who, (_, w) in counts.items())
    hint = ""
    robot = {n for who, (n, _) in counts.items() if who != "the limits"}
    if len(robot) > 1:
        pass  # the log and the policy differ: no limit fixes that (sim/preflight.py says to train a policy)
    elif one_given and (joints := next(iter(robot)) if robot else max(numbers)) > 1:
        flags = " and ".join(f"--{name.replace('_', '-')}" for name in one_given)
        hint = f" - give one value per joint ({joints}) to {flags} (only --qd-max-rad-s takes one for every joint)"
    elif any(DEFAULT_SOURCE in w for _, w in counts.values()):
        hint = (" - the built-in limits are the Schunk LWA 4P's 6 joints: pass --urdf FILE, or --q-min-rad, "
                "--q-max-rad and --qd-max-rad-s, or use a policy whose manifest has \"limits\"")
    elif any("file order" in w for _, w in counts.values()):
        hint = " - choose the URDF joints the policy commands with --urdf-joints"
    return f"joint counts differ: {head} ({where}){hint}"
