"""The joint values a log can hold: every reader refuses a record with a value no joint can have, naming it, so
that an absurd finite value (1e300 rad, a corrupt record) does not reach the replay and overflow a metric (its
square is inf) with no word of where it came from."""
from __future__ import annotations

import numpy as np

# Bound on |value|, rad (positions) and rad/s (velocities): past any real joint (1e5 rad is 15,900 turns of a
# continuous joint, 1e5 rad/s is 955,000 rpm), yet wide enough for a log in another unit (degrees, encoder
# counts) to be read; a value beyond it is a corrupt record or a unit error.
JOINT_LIMIT = {"q": 1e5, "qd": 1e5}
_WHAT = {"q": ("position", "rad"), "qd": ("velocity", "rad/s")}


def bad_joint_value(field: str, values) -> tuple[int, str] | None:
    """The first value of `values` (array-like, any shape, taken flat) of `field` ("q": positions, rad; "qd":
    velocities, rad/s) that no joint can hold: (its flat index, why: "non-finite joint position" or "joint
    position beyond ±1e+05 rad, ..."), or None when every value is finite and within JOINT_LIMIT. Callers add
    where it is and the value."""
    flat = np.asarray(values, dtype=np.float64).ravel()
    ok = np.abs(flat) <= JOINT_LIMIT[field]  # NaN compares False
    if ok.all():
        return None
    i = int(np.argmin(ok))
    what, unit = _WHAT[field]
    if not np.isfinite(flat[i]):
        return i, f"non-finite joint {what}"
    return i, (f"joint {what} beyond ±{JOINT_LIMIT[field]:.0e} {unit}, the bound of a plausible one (a corrupt record "
               "or a unit error?)")
