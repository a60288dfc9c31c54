"""Timestamped joint records, as every reader collects them, turned into one ArmLog.

Readers append records in file order and stop at the first bad one; this module sorts them by timestamp
(counting those that arrived out of order), rejects repeated timestamps, derives the velocities (or positions)
a log lacks, and applies the on_error policy the same way for every format.
"""
from __future__ import annotations

from typing import Literal

import numpy as np

from edgeinfer.logs.arm_log import ArmLog, LogError

OnError = Literal["raise", "truncate"]


def check_on_error(on_error: str) -> None:
    """Raises ValueError for anything but "raise" or "truncate"."""
    if on_error not in ("raise", "truncate"):
        raise ValueError(f"on_error must be 'raise' or 'truncate', got {on_error!r}")


class Records:
    """Accumulates (t_ns, q, qd | None) per record in file order.

    `fail(index, message)` records the first bad record and raises LogError when on_error="raise"; with
    "truncate" the caller stops reading and keeps what came before. Records are named by `unit` ("record":
    0-based index in file order; "line": the caller passes 1-based text lines).
    """

    def __init__(self, where: str, on_error: OnError = "raise", unit: str = "record"):
        check_on_error(on_error)
        self.where, self.on_error, self.unit = where, on_error, unit
        self.t_ns: list[int] = []
        self.q: list[np.ndarray] = []
        self.qd: list[np.ndarray | None] = []
        self.index: list[int] = []  # how errors name each kept record
        self.bad_record: int | None = None
        self.error = ""  # the first bad record's message when truncating

    def __len__(self) -> int:
        return len(self.t_ns)

    def add(self, t_ns: int, q, qd=None, index: int | None = None) -> bool:
        """One record: t_ns int nanoseconds (any epoch), q (D,) rad, qd (D,) rad/s or None; `index` names it in
        errors (default: its 0-based position). Returns False when the record is bad and truncating.
        Raises LogError (naming the record) for a joint count that differs from the first record's or a
        non-finite value."""
        i = len(self.t_ns) if index is None else index
        q = np.asarray(q, dtype=np.float64).ravel()
        qd = None if qd is None or len(qd) == 0 else np.asarray(qd, dtype=np.float64).ravel()
        d = self.q[0].size if self.q else q.size
        if q.size == 0 or q.size != d or (qd is not None and qd.size != d):
            self.fail(i, f"expected {d} joint positions and velocities, got {q.size} and "
                         f"{'none' if qd is None else qd.size}")
            return False
        if not np.all(np.isfinite(q)) or (qd is not None and not np.all(np.isfinite(qd))):
            self.fail(i, "non-finite joint value")
            return False
        self.t_ns.append(int(t_ns))
        self.index.append(i)
        self.q.append(q)
        self.qd.append(qd)
        return True

    def fail(self, index: int, message: str) -> None:
        """Mark record `index` bad. Raises LogError "<where> <unit> <index>: <message>" unless truncating
        (then the first bad record is kept in `bad_record`)."""
        text = f"{self.where} {self.unit} {index}: {message}"
        if self.on_error == "raise":
            raise LogError(text)
        if self.bad_record is None:
            self.bad_record = index
            self.error = text

    def to_arm_log(self, name: str, source: str) -> ArmLog:
        """The records as an ArmLog (see arm_log_from_records); qd from the records when every record had it,
        else derived from q. Raises LogError as arm_log_from_records."""
        qd = None if any(v is None for v in self.qd) else self.qd
        return arm_log_from_records(name, source, self.where, self.unit, self.t_ns, self.q, qd, self.index,
                                    self.bad_record)


def arm_log_from_records(name: str, source: str, where: str, unit: str, t_ns, q, qd, index, bad_record=None,
                         joint_names: list[str] | None = None, extra: dict | None = None) -> ArmLog:
    """Records in file order as an ArmLog, sorted by timestamp, t_s starting at 0.

    t_ns: (N,) int ns, any epoch; q, qd: (N, D) rad, rad/s, or None for the one the log lacks, derived after
    sorting (qd: np.gradient(q, t), second-order central differences inside, one-sided at the ends, numpy docs;
    q: the trapezoidal integral of qd from 0 rad, scipy.integrate.cumulative_trapezoid). index: (N,) how errors
    name each record (`unit` and its number, in file order); bad_record: where a truncating read stopped.
    joint_names: (D,) or None; extra: {name: (N, width)} other channels in file order, sorted with the records.
    Raises LogError for fewer than 2 records or two records with the same timestamp.
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
        raise LogError(f"{where} {unit}s {a} and {b} (in file order): same timestamp {int(t_ns[same[0]])} ns")
    t_s = (t_ns - t_ns[0]) / 1e9
    q_derived, qd_derived = q is None, qd is None
    if q_derived:
        from scipy.integrate import cumulative_trapezoid

        qd = np.asarray(qd, dtype=np.float64)[order]
        q = cumulative_trapezoid(qd, t_s, axis=0, initial=0.0)
    else:
        q = np.asarray(q, dtype=np.float64)[order]
        qd = np.gradient(q, t_s, axis=0) if qd_derived else np.asarray(qd, dtype=np.float64)[order]
    return ArmLog(name=name, t_s=t_s, q_rad=np.ascontiguousarray(q), qd_rad_s=np.ascontiguousarray(qd),
                  truncated_at_row=bad_record, source=source, reordered=reordered,
                  qd_from_differences=qd_derived, q_from_integration=q_derived, joint_names=joint_names,
                  extra={k: np.asarray(v, dtype=np.float64).reshape(len(order), -1)[order]
                         for k, v in (extra or {}).items()})
