"""CSV text to values for edgeinfer.logs.csv_log: numbers in either decimal mark, joint values, times (numbers in a
unit, or ISO-8601) as int64 ns, and the checks that a time, a joint value and a log's sample rate are plausible.

Each converter takes one column as a pyarrow string array (fields trimmed) and returns (values, how many rows
come before the first bad one, why that one is bad, quoting its text, or None), so the reader names the line.
"""
from __future__ import annotations

import math
import re

import numpy as np

from edgeinfer.logs.plausible import bad_joint_value

UNIT_NS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
# Bound on |t| of a numeric time, ns: two such times differ by less than an int64 holds (9.2e18 ns), with room
# for float rounding. As epoch stamps: 1843-03-31 to 2096-10-02; as times from a start: 126 years.
T_LIMIT_NS = 4 * 10**18
_T_RANGE = "±4e18 ns: epoch stamps 1843..2096"
# Sample rates a joint log can have, Hz: one record per 100 s to 100 kHz. A median step outside them is a time
# column read in the wrong unit (ns stamps read as seconds: one record per 46 days).
RATE_HZ = (0.01, 100e3)
_TYPICAL_HZ = 100.0  # where several units give a plausible rate, the hint names the one nearest this
# A number with a decimal comma (0,109627604) or a decimal point (0.109627604); integers have neither.
DECIMAL_COMMA = r"[-+]?\d+,\d+(?:[eE][-+]?\d+)?"
DECIMAL_POINT = r"[-+]?(?:\d+\.\d*|\.\d+)(?:[eE][-+]?\d+)?"


def first_match(columns: list[tuple[str, object]], pattern: str, rows: int) -> tuple[int, str, str] | None:
    """(row, column name, text) of the earliest of the first `rows` rows where a field of `columns` ([(name,
    string array)]) is all of regex `pattern`, or None."""
    import pyarrow.compute as pc

    best = None
    for name, text in columns:
        hit = pc.match_substring_regex(text[:rows], f"^(?:{pattern})$").fill_null(False).to_numpy(zero_copy_only=False)
        if hit.any() and (best is None or int(np.argmax(hit)) < best[0]):
            row = int(np.argmax(hit))
            best = (row, name, text[row].as_py())
    return best


def _cast_prefix(text, typ):
    """(pyarrow's cast of the longest prefix of `text` that casts to `typ`, its length): the whole column, or the
    rows before the first value pyarrow cannot cast, found by bisection with the same cast."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        return pc.cast(text, typ), len(text)
    except pa.ArrowInvalid:
        ok, bad = 0, len(text)  # text[:ok] casts, text[:bad] does not
        while bad - ok > 1:
            mid = (ok + bad) // 2
            try:
                pc.cast(text[:mid], typ)
                ok = mid
            except pa.ArrowInvalid:
                bad = mid
        return pc.cast(text[:ok], typ), ok


def _number_text(text, decimal: str):
    import pyarrow.compute as pc

    if decimal == ",":  # "." then fails the cast: these exports group thousands with it
        text = pc.replace_substring(pc.replace_substring(text, ".", "?"), ",", ".")
    return text


def is_number(text, decimal: str) -> bool:
    """Whether the first field of `text` is a number (in decimal mark `decimal`)."""
    import pyarrow as pa

    return len(text) > 0 and _cast_prefix(_number_text(text[:1], decimal), pa.float64())[1] == 1


def floats(text, decimal: str) -> tuple[np.ndarray, int, str | None]:
    """(float64 values of the rows before the first one that is not a number, their count, why or None).
    Non-finite numbers ("nan", "inf", "1e400") are values here; the callers judge them."""
    import pyarrow as pa

    values, n = _cast_prefix(_number_text(text, decimal), pa.float64())
    values = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float64)
    if n == len(text):
        return values, n, None
    field = text[n].as_py()
    hint = " (decimal mark '.': set csv_decimal=',')" if decimal == "." and re.fullmatch(DECIMAL_COMMA, field) else ""
    return values, n, f"not a number{hint}: {field!r}"


def finite_values(text, decimal: str) -> tuple[np.ndarray, int, str | None]:
    """A numeric column as float64, as floats(); a non-finite value is bad."""
    values, n, reason = floats(text, decimal)
    if not (finite := np.isfinite(values)).all():
        n = int(np.argmin(finite))
        return values[:n], n, f"non-finite value: {text[n].as_py()!r}"
    return values, n, reason


def joint_values(text, decimal: str, field: str) -> tuple[np.ndarray, int, str | None]:
    """A joint column of `field` ("q" rad, "qd" rad/s) as float64, as floats(); a value that is not finite or
    beyond plausible.JOINT_LIMIT is bad."""
    values, n, reason = floats(text, decimal)
    bad = bad_joint_value(field, values)
    if bad is not None:
        return values[:bad[0]], bad[0], f"{bad[1]}: {text[bad[0]].as_py()!r}"
    return values, n, reason


def numeric_times_ns(text, decimal: str, unit: str) -> tuple[np.ndarray, int, str | None]:
    """Times in `unit` (a UNIT_NS key) as int64 ns from the first record: integers exactly (a 1.7e18 ns stamp does
    not fit a float64), other numbers rounded to the ns. A non-finite time, or one beyond ±T_LIMIT_NS, is bad;
    the error names the range and, when the value would fit a finer unit, that unit as a hint."""
    import pyarrow as pa
    import pyarrow.compute as pc

    unit_ns = UNIT_NS[unit]
    try:
        values = pc.cast(_number_text(text, decimal), pa.int64()).to_numpy()
        n, reason = len(values), None
        limit = T_LIMIT_NS // unit_ns
        ok = (values <= limit) & (values >= -limit)
    except pa.ArrowInvalid:
        values, n, reason = floats(text, decimal)
        with np.errstate(over="ignore", invalid="ignore"):
            ok = np.abs(values) * unit_ns < T_LIMIT_NS  # NaN compares False
    if not ok.all():
        n = int(np.argmin(ok))
        reason = _time_range_problem(float(values[n]), unit, text[n].as_py())
    if n == 0:
        return np.zeros(0, dtype=np.int64), 0, reason
    if values.dtype == np.int64:
        return (values[:n] - values[0]) * unit_ns, n, reason
    return np.round((values[:n] - values[0]) * unit_ns).astype(np.int64), n, reason


def _time_range_problem(value: float, unit: str, field: str) -> str:
    if not math.isfinite(value):
        return f"non-finite time: {field!r}"
    finer = [u for u, ns in UNIT_NS.items() if ns < UNIT_NS[unit] and abs(value) * ns < T_LIMIT_NS]
    hint = f"; is the column in {finer[0]}? set t_unit={finer[0]} in the column map (--columns)" if finer else ""
    limit = T_LIMIT_NS / UNIT_NS[unit]
    return f"time {field!r} beyond ±{limit:g} {unit}, the range of a numeric time ({_T_RANGE}){hint}"


def iso_times_ns(text) -> tuple[np.ndarray, int, str | None]:
    """ISO-8601 times (2022-10-26T08:17:21.847Z; a decimal comma, 08:17:21,847, as ISO 8601 allows; with a zone
    offset, converted to UTC, or without one: the first record decides) as int64 ns from the first record. One
    beyond ±T_LIMIT_NS of 1970 is bad."""
    import pyarrow as pa
    import pyarrow.compute as pc

    stamps = pc.replace_substring_regex(text, r"(:\d\d),(\d)", r"\1.\2")
    for typ in (pa.timestamp("ns", tz="UTC"), pa.timestamp("ns")):  # with a zone offset, then without
        if _cast_prefix(stamps[:1], typ)[1]:
            cast, n = _cast_prefix(stamps, typ)
            ns = cast.cast(pa.int64()).to_numpy()
            reason = None if n == len(text) else f"not an ISO-8601 time like the first: {text[n].as_py()!r}"
            if not (ok := np.abs(ns) < T_LIMIT_NS).all():
                n = int(np.argmin(ok))
                reason = f"time {text[n].as_py()!r} beyond the range of a time ({_T_RANGE})"
            return ns[:n] - ns[0] if n else ns[:0], n, reason
    return np.zeros(0, dtype=np.int64), 0, f"not a number or an ISO-8601 time: {text[0].as_py()!r}"


def implausible_rate(t_ns: np.ndarray, unit: str) -> str | None:
    """Why times `t_ns` (int ns, read in `unit`) cannot be a joint log's, or None: their median step between
    distinct times is a rate outside RATE_HZ. The reason names the unit that would give a plausible rate (the
    one nearest _TYPICAL_HZ) as a hint."""
    steps = np.diff(np.sort(t_ns))
    steps = steps[steps > 0]
    if not steps.size:
        return None
    step = float(np.median(steps)) / UNIT_NS[unit]  # in `unit`
    rate = {u: UNIT_NS["s"] / (step * ns) for u, ns in UNIT_NS.items()}
    if RATE_HZ[0] <= rate[unit] <= RATE_HZ[1]:
        return None
    fits = [u for u, hz in rate.items() if RATE_HZ[0] <= hz <= RATE_HZ[1]]
    hint = ""
    if fits:
        best = min(fits, key=lambda u: abs(math.log10(rate[u] / _TYPICAL_HZ)))
        hint = f"; is it in {best}? set t_unit={best} in the column map (--columns)"
    return (f"median step {step:g} {unit} between records, a rate of {rate[unit]:.3g} Hz, outside the "
            f"{RATE_HZ[0]:g} Hz..{RATE_HZ[1] / 1e3:g} kHz of a joint log{hint}")


# bad_rows="fill" holds the last good value over at most this many consecutive bad records: a sensor's brief
# dropout; a longer run is no measurement to invent, and is skipped.
FILL_MAX_ROWS = 3


def unusable(text, decimal: str) -> np.ndarray:
    """(N,) bool: the fields of `text` (a pyarrow string array, fields trimmed) that are no finite number in
    decimal mark `decimal`: empty, null, other text, "nan" or "inf"."""
    import pyarrow.compute as pc

    number = DECIMAL_COMMA if decimal == "," else DECIMAL_POINT
    pattern = rf"^(?:{number}|[-+]?\d+(?:[eE][-+]?\d+)?)$"  # with the integers, which have no decimal mark
    return ~pc.match_substring_regex(text, pattern).fill_null(False).to_numpy(zero_copy_only=False)


def repair_rows(columns: dict, decimal: str, mode: str) -> tuple[dict, np.ndarray, np.ndarray]:
    """Apply bad_rows `mode` ("skip" or "fill") to the joint columns {index: pyarrow string array (N,)}: a row is
    bad when a field of any of them is unusable(). Returns (the columns, bad fields of filled rows replaced by
    the column's last good field; (N,) bool the rows to keep; (N,) bool the rows filled). "skip" keeps the
    good rows; "fill" also keeps runs of at most FILL_MAX_ROWS bad rows that follow a good one."""
    import pyarrow as pa
    import pyarrow.compute as pc

    cells = {i: unusable(col, decimal) for i, col in columns.items()}
    n = len(next(iter(columns.values()))) if columns else 0
    bad = np.logical_or.reduce(list(cells.values())) if cells else np.zeros(n, dtype=bool)
    filled = np.zeros(n, dtype=bool)
    if mode == "fill" and bad.any():
        edges = np.diff(np.r_[0, bad.astype(np.int8), 0])
        for start, end in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)):
            if start > 0 and end - start <= FILL_MAX_ROWS:  # a first row has no good value to hold
                filled[start:end] = True
        columns = {i: pc.fill_null_forward(pc.if_else(pa.array(cells[i]), pa.scalar(None, pa.string()), col))
                   for i, col in columns.items()}
    return columns, ~bad | filled, filled
