"""Generic CSV joint logs: one header row, one record per line, columns chosen by a column map.

Column map (a string, so it fits a command-line option or a launch file), comma-separated `key=value`:
    t=NAME          time column (default: the first of t_s, time, timestamp, t)
    t_unit=s|ms|us|ns   unit of the time column (default s)
    q=PATTERN       joint position columns, an fnmatch pattern or names joined by '|', in header order
                    (default q[0-9]*)
    qd=PATTERN      joint velocity columns (default qd[0-9]*; when none match, qd is a finite difference of q)
Example: "t=stamp_ns,t_unit=ns,q=pos_*,qd=vel_*".
"""
from __future__ import annotations

import csv
import fnmatch
from pathlib import Path

import numpy as np

from edgeinfer.logs.arm_log import ArmLog, LogError
from edgeinfer.logs.samples import OnError, Records

_UNIT_NS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
_TIME_NAMES = ("t_s", "time", "timestamp", "t")


def parse_columns(spec: str | None) -> dict[str, str]:
    """The column map as {key: value}; raises ValueError naming the bad term."""
    out = {"t_unit": "s", "q": "q[0-9]*", "qd": "qd[0-9]*"}
    for term in (spec or "").split(","):
        if not term.strip():
            continue
        key, sep, value = term.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in ("t", "t_unit", "q", "qd") or not value:
            raise ValueError(f"column map term {term!r}: expected t=, t_unit=, q= or qd= with a value")
        if key == "t_unit" and value not in _UNIT_NS:
            raise ValueError(f"column map term {term!r}: t_unit must be one of {sorted(_UNIT_NS)}")
        out[key] = value
    return out


def _select(header: list[str], pattern: str) -> list[int]:
    names = pattern.split("|")
    return [i for i, h in enumerate(header) if any(fnmatch.fnmatchcase(h, n) for n in names)]


def read_csv_log(path: str | Path, columns: str | None = None, on_error: OnError = "raise") -> ArmLog:
    """Read a headered CSV through the column map (see module docstring) into an ArmLog (sorted by time).

    Raises LogError naming the file and 1-based line: missing file, no header, a mapped column that is not
    there, a non-numeric or non-finite value, a short row. With on_error="truncate" the rows before the
    first bad line are kept and `truncated_at_row` is that line. ValueError for a malformed column map.
    """
    path = Path(path)
    cmap = parse_columns(columns)
    if not path.is_file():
        raise LogError(f"{path}: missing file")
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader, [])]
        if not header:
            raise LogError(f"{path} line 1: no header row")
        t_name = cmap.get("t") or next((n for n in _TIME_NAMES if n in header), None)
        if t_name not in header:
            raise LogError(f"{path} line 1: no time column {t_name or '/'.join(_TIME_NAMES)!r} in {header}")
        t_col = header.index(t_name)
        q_cols = [i for i in _select(header, cmap["q"]) if i != t_col]
        qd_cols = [i for i in _select(header, cmap["qd"]) if i != t_col and i not in q_cols]
        if not q_cols:
            raise LogError(f"{path} line 1: no joint position column matches {cmap['q']!r} in {header}")
        if qd_cols and len(qd_cols) != len(q_cols):
            raise LogError(f"{path} line 1: {len(q_cols)} position columns but {len(qd_cols)} velocity columns")
        rec = Records(str(path), on_error, unit="line")  # 1-based text lines, like read_schunk
        scale = _UNIT_NS[cmap["t_unit"]]
        width = max([t_col, *q_cols, *qd_cols]) + 1
        for row in reader:
            line = reader.line_num
            if not any(f.strip() for f in row):
                continue
            if len(row) < width:
                rec.fail(line, f"expected at least {width} columns, got {len(row)}")
                break
            try:
                t_ns = _time_ns(row[t_col], scale)
                q = [float(row[i]) for i in q_cols]
                qd = [float(row[i]) for i in qd_cols] if qd_cols else None
            except ValueError:
                rec.fail(line, f"not a number: {','.join(row)[:60]!r}")
                break
            if t_ns is None:
                rec.fail(line, "non-finite time")
                break
            if not rec.add(t_ns, q, qd, index=line):
                break
    return rec.to_arm_log(path.stem, "csv")


def _time_ns(text: str, unit_ns: int) -> int | None:
    """A time field in integer ns: integers exactly (a 1.7e18 ns stamp does not fit a float64), others rounded;
    None when not finite. Raises ValueError for text that is not a number."""
    text = text.strip()
    try:
        return int(text) * unit_ns
    except ValueError:
        t = float(text)
    return int(round(t * unit_ns)) if np.isfinite(t) else None
