"""Timestamped joint records, as every reader collects them, turned into one ArmLog.

Readers append records in file order and stop at the first bad one; this module sorts them by timestamp
(counting those that arrived out of order), rejects repeated timestamps, derives the velocities (or positions)
a log lacks, and applies the on_error policy the same way for every format.

Extra channels (ArmLog.extra) come row by row with the records (a LeRobot feature, a CSV column) or as samples
of their own, at their own times (another topic: an IMU, a velocity command). Those are held to the records
(zero-order hold): each record gets the channel's latest sample at or before its time. A record earlier than
a channel's first sample has nothing to hold: it is dropped and counted (ArmLog.dropped_before_extra).
"""
from __future__ import annotations

import warnings
from typing import Literal

import numpy as np

from edgeinfer.logs.arm_log import ArmLog, LogError
from edgeinfer.logs.fields import joint_names_problem
from edgeinfer.logs.plausible import bad_joint_value

OnError = Literal["raise", "truncate"]
# A step longer than this many median sample periods is a gap (reader option gap_periods): a few dropped samples
# are bridged, but integrating a velocity across hours of silence turns one held speed into thousands of rad.
GAP_PERIODS = 5.0


def check_on_error(on_error: str) -> None:
    """Raises ValueError for anything but "raise" or "truncate"."""
    if on_error not in ("raise", "truncate"):
        raise ValueError(f"on_error must be 'raise' or 'truncate', got {on_error!r}")


class Records:
    """Accumulates (t_ns, q, qd | None) per record in file order.

    `fail(index, message)` records the first bad record and raises LogError when on_error="raise"; with
    "truncate" the caller stops reading and keeps what came before. Records are named by `unit` ("record":
    0-based index in file order; "line": the caller passes 1-based text lines). held: the names of the channels
    whose samples come at their own times (add_sample), in the order the ArmLog lists them. joint_names: (D,)
    the joints' names when the file names them once for all records (LeRobot's info.json), else the first
    record's own names (add's `names`: a JointState's name).
    """

    def __init__(self, where: str, on_error: OnError = "raise", unit: str = "record", held: tuple[str, ...] = (),
                 joint_names: list[str] | None = None):
        check_on_error(on_error)
        self.where, self.on_error, self.unit = where, on_error, unit
        self.joint_names = joint_names
        self.t_ns: list[int] = []
        self.q: list[np.ndarray] = []
        self.qd: list[np.ndarray | None] = []
        self.index: list[int] = []  # how errors name each kept record
        self.extra: dict[str, list[np.ndarray]] = {}  # row-aligned channels: one value per kept record
        # held channels, in the order given: (t_ns, value) of each sample
        self.samples: dict[str, tuple[list[int], list[np.ndarray]]] = {name: ([], []) for name in held}
        self.bad_record: int | None = None
        self.error = ""  # the first bad record's message when truncating

    def __len__(self) -> int:
        return len(self.t_ns)

    def add(self, t_ns: int, q, qd=None, index: int | None = None, extra: dict | None = None,
            names=None) -> bool:
        """One record: t_ns int nanoseconds (any epoch), q (D,) rad, qd (D,) rad/s or None; `index` names it in
        errors (default: its 0-based position); extra: {channel: values} row-aligned with it (each a number or
        a 1-D array); names: the record's joint names (None or empty: it names none, and is taken in the order
        named before). Returns False when the record is bad and truncating.
        Raises LogError (naming the record) for a joint count that differs from the first record's, a channel
        whose width differs from its first value's, a non-finite value, a joint value beyond
        plausible.JOINT_LIMIT, or joint names that differ from those named before (a reordered JointState would
        put every joint's value on another) or cannot name the joints (fields.joint_names_problem)."""
        i = len(self.t_ns) if index is None else index
        values = {}
        for name, v in (extra or {}).items():
            values[name] = np.atleast_1d(np.asarray(v, dtype=np.float64)).ravel()
            if (why := _channel_problem(name, values[name], self.extra.get(name))) is not None:
                self.fail(i, why)
                return False
        q = np.asarray(q, dtype=np.float64).ravel()
        qd = None if qd is None or len(qd) == 0 else np.asarray(qd, dtype=np.float64).ravel()
        d = self.q[0].size if self.q else q.size
        if q.size == 0 or q.size != d or (qd is not None and qd.size != d):
            self.fail(i, f"expected {d} joint positions and velocities, got {q.size} and "
                         f"{'none' if qd is None else qd.size}")
            return False
        for field, v in (("q", q), ("qd", qd)):  # non-finite, or beyond any joint (plausible.JOINT_LIMIT)
            if v is not None and (bad := bad_joint_value(field, v)) is not None:
                self.fail(i, f"{bad[1]}: {v[bad[0]]:g} (joint {bad[0]}, from 0)")
                return False
        if names is not None and len(names) and (names := list(names)) != self.joint_names:
            why = (joint_names_problem(names, d) if self.joint_names is None and not self.t_ns else
                   f"joint names {names} differ from {self.joint_names or 'none'} named before")
            if why is not None:
                self.fail(i, why)
                return False
            self.joint_names = names
        self.t_ns.append(int(t_ns))
        self.index.append(i)
        self.q.append(q)
        self.qd.append(qd)
        for name, v in values.items():
            self.extra.setdefault(name, []).append(v)
        return True

    def add_sample(self, channel: str, t_ns: int, values, index: int, where: str) -> bool:
        """One sample of a held channel (values: a 1-D array) at t_ns (the records' epoch); `where` and `index`
        name it in errors ("x.mcap topic /imu" message 12). False when it is bad and truncating. Raises LogError
        (as fail) for a width that differs from the channel's first sample or a non-finite value."""
        values = np.asarray(values, dtype=np.float64).ravel()
        times, kept = self.samples.setdefault(channel, ([], []))
        if (why := _channel_problem(channel, values, kept)) is not None:
            self.fail(index, why, where)
            return False
        times.append(int(t_ns))
        kept.append(values)
        return True

    def fail(self, index: int, message: str, where: str | None = None) -> None:
        """Mark record `index` bad. Raises LogError "<where> <unit> <index>: <message>" unless truncating
        (then the first bad record is kept in `bad_record`). `where` defaults to the records' own; another one
        (a held channel's topic) names its own message, and a truncation then cuts at the next record."""
        text = f"{where or self.where} {self.unit} {index}: {message}"
        if self.on_error == "raise":
            raise LogError(text)
        if self.bad_record is None:
            self.bad_record = index if where is None else len(self.t_ns)
            self.error = text

    def to_arm_log(self, name: str, source: str) -> ArmLog:
        """The records as an ArmLog (see arm_log_from_records); qd from the records when every record had it,
        else derived from q; the row-aligned channels with them, and the held channels held to them (module
        docstring), the records before a held channel's first sample dropped (ArmLog.dropped_before_extra).
        Raises LogError as arm_log_from_records, and naming a held channel that has no sample at all."""
        n = len(self.t_ns)
        extra = {k: np.array(v) for k, v in self.extra.items()}
        keep = np.ones(n, dtype=bool)
        t_ns = np.asarray(self.t_ns, dtype=np.int64)
        for channel, (times, values) in self.samples.items():
            if not times:
                raise LogError(f"{self.where}: extra channel {channel!r} has no samples")
            order = np.argsort(times, kind="stable")
            held = np.searchsorted(np.asarray(times, dtype=np.int64)[order], t_ns, side="right") - 1
            keep &= held >= 0
            extra[channel] = np.asarray(values)[order][np.maximum(held, 0)].reshape(n, -1)
        pick = np.flatnonzero(keep)
        if n >= 2 and pick.size < 2:
            firsts = {k: min(t) - int(t_ns.min()) for k, (t, _) in self.samples.items()}
            raise LogError(f"{self.where}: {pick.size} of {n} records are at or after the first sample of every "
                           f"extra channel (first samples, ns after the first record: {firsts})")
        qd = None if any(v is None for v in self.qd) else [self.qd[i] for i in pick]
        log = arm_log_from_records(name, source, self.where, self.unit, t_ns[pick], [self.q[i] for i in pick], qd,
                                   [self.index[i] for i in pick], self.bad_record, joint_names=self.joint_names,
                                   extra={k: v[pick] for k, v in extra.items()})
        log.dropped_before_extra = n - pick.size
        return log


def _channel_problem(channel: str, values: np.ndarray, before: list | None) -> str | None:
    """Why a channel's value cannot be kept (another width than its first, empty, non-finite), else None."""
    if before and values.size != before[0].size:
        return f"extra channel {channel!r}: {values.size} values, its first had {before[0].size}"
    if not values.size or not np.all(np.isfinite(values)):
        return f"extra channel {channel!r}: {'no values' if not values.size else 'non-finite value'}"
    return None


def arm_log_from_records(name: str, source: str, where: str, unit: str, t_ns, q, qd, index, bad_record=None,
                         joint_names: list[str] | None = None, extra: dict | None = None,
                         gap_periods: float | None = None) -> ArmLog:
    """Records in file order as an ArmLog, sorted by timestamp, t_s starting at 0.

    t_ns: (N,) int ns, any epoch; q, qd: (N, D) rad, rad/s, or None for the one the log lacks, derived after
    sorting, per segment between gaps (find_gaps; gap_periods, default GAP_PERIODS): qd by
    backward_differences(q, t), causal, 0 at each segment's first record; q by the trapezoidal integral of qd
    (scipy.integrate.cumulative_trapezoid) from 0 rad, each later segment from the last value before its gap.
    A derivation that restarts at a gap warns (RuntimeWarning), naming each gap's record, time and length.
    index: (N,) how errors name each record (`unit` and its number, in file order); bad_record: where a
    truncating read stopped. joint_names: (D,) or None; extra: {name: (N, width)} other channels in file order,
    sorted with the records. Raises LogError for fewer than 2 records or two records with the same timestamp.
    """
    cut = f" (truncated at {unit} {bad_record})" if bad_record is not None else ""
    if len(t_ns) < 2:
        raise LogError(f"{where}{cut}: fewer than 2 usable records")
    t_ns = np.asarray(t_ns, dtype=np.int64)
    order = np.argsort(t_ns, kind="stable")
    # a record is out of order when an earlier record in the file has a later timestamp
    reordered = int(np.sum(t_ns < np.maximum.accumulate(t_ns)))
    t_ns = t_ns[order]
    same = np.flatnonzero(np.diff(t_ns) == 0)
    if same.size:
        a, b = sorted((index[order[same[0]]], index[order[same[0] + 1]]))
        after_ns = int(t_ns[same[0]] - t_ns[0])
        raise LogError(f"{where} {unit}s {a} and {b} (in file order): same timestamp ({after_ns} ns after the first "
                       "record): two samples cannot share a time; remove the repeated record")
    t_s = (t_ns - t_ns[0]) / 1e9
    q_derived, qd_derived = q is None, qd is None
    gaps = find_gaps(t_s, GAP_PERIODS if gap_periods is None else gap_periods)
    if q_derived:
        qd = np.asarray(qd, dtype=np.float64)[order]
        q = integrate_segments(qd, t_s, gaps)
    else:
        q = np.asarray(q, dtype=np.float64)[order]
        qd = backward_differences(q, t_s, gaps) if qd_derived else np.asarray(qd, dtype=np.float64)[order]
    if gaps.size and (q_derived or qd_derived):
        shown = ", ".join(f"{unit} {index[order[i]]} at t = {t_s[i]:.3f} s after {_span(t_s[i] - t_s[i - 1])}"
                          for i in gaps[:5])
        warnings.warn(f"{where}: {gaps.size} gap(s) longer than {gap_periods or GAP_PERIODS:g} sample periods "
                      f"({shown}{', ...' if gaps.size > 5 else ''}): derived {'q' if q_derived else 'qd'} restarts "
                      "at each (set gap_periods, --gap-periods, to change what counts as a gap)",
                      RuntimeWarning, stacklevel=2)
    return ArmLog(name=name, t_s=t_s, q_rad=np.ascontiguousarray(q), qd_rad_s=np.ascontiguousarray(qd),
                  truncated_at_row=bad_record, source=source, reordered=reordered,
                  qd_from_differences=qd_derived, q_from_integration=q_derived, joint_names=joint_names,
                  gaps_s=[(float(t_s[i]), float(t_s[i] - t_s[i - 1])) for i in gaps],
                  extra={k: np.asarray(v, dtype=np.float64).reshape(len(order), -1)[order]
                         for k, v in (extra or {}).items()})


def find_gaps(t_s: np.ndarray, gap_periods: float = GAP_PERIODS) -> np.ndarray:
    """(G,) int64 indices i of the records that follow a gap: t_s[i] - t_s[i-1] > gap_periods * the median step.
    t_s: (T,) s, increasing. Each gap starts a new segment of the log."""
    steps = np.diff(t_s)
    if not steps.size:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(steps > gap_periods * float(np.median(steps))) + 1


def integrate_segments(qd: np.ndarray, t_s: np.ndarray, gaps: np.ndarray) -> np.ndarray:
    """Positions (T, D) rad: the trapezoidal integral of qd (T, D) rad/s over t_s (T,) s from 0 rad, within each
    segment between `gaps` (find_gaps); a segment starts from the last value before its gap, so nothing moves
    across a gap. (The trapezoid rule, as scipy.integrate.cumulative_trapezoid, with the gaps' steps left out.)"""
    steps = np.zeros_like(qd, dtype=np.float64)
    steps[1:] = 0.5 * (qd[1:] + qd[:-1]) * np.diff(t_s)[:, None]
    steps[gaps] = 0.0  # the step across a gap: no integration over time with no samples
    return np.cumsum(steps, axis=0)


def backward_differences(q: np.ndarray, t_s: np.ndarray, gaps: np.ndarray | None = None) -> np.ndarray:
    """Velocities (T, D) rad/s of positions q (T, D) rad at times t_s (T,) s, increasing: (q[i] - q[i-1]) /
    (t_s[i] - t_s[i-1]), 0 at the first record and at each record after one of `gaps` (find_gaps; None: none),
    as at a segment's start. Causal: row i uses no later row, as a controller at t_s[i] could compute it.
    (Central differences, np.gradient, would put q[i+1] into qd[i]: a policy trained or replayed on them sees
    one sample of the future, which no robot gives it.)"""
    qd = np.zeros_like(q, dtype=np.float64)
    qd[1:] = np.diff(q, axis=0) / np.diff(t_s)[:, None]
    if gaps is not None:
        qd[gaps] = 0.0
    return qd


def _span(seconds: float) -> str:
    """A gap's length for a warning: '5.2 h', '3.0 min' or '0.045 s'."""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.3g} s"
