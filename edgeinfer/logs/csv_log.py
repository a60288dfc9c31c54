"""Generic CSV joint logs, parsed by pyarrow.csv: a header row, one record per line, columns chosen by a column
map, in the dialects real exports use (separator, decimal mark, ISO-8601 times, no time column).

Column map (a string, so it fits a command-line option or a launch file), comma-separated `key=value`:
    t=NAME          time column (default: the first of t_s, time, timestamp, t, in any letter case)
    t_unit=s|ms|us|ns   unit of a numeric time column (default s); ISO-8601 times (2022-10-26T08:17:21.847Z,
                    2022-10-26 10:17:21.847+02:00) are recognised from the first record
    q=PATTERN       joint position columns, an fnmatch pattern or names joined by '|', in header order
                    (default q[0-9]*)
    qd=PATTERN      joint velocity columns (default qd[0-9]*)
Example: "t=stamp_ns,t_unit=ns,q=pos_*,qd=vel_*". Header names are matched without surrounding spaces.

Reader options besides the map:
    csv_separator   one character, or "tab" (default: the most frequent of , ; tab | in the header line)
    csv_decimal     "." or "," (default: "," when the separator is not "," and a field in the file's first
                    64 KiB is a number with a decimal comma, such as 0,109627604; with ",", a "." in a number
                    is an error: exports that write decimal commas group thousands with it)
    rate_hz         a log recorded at a fixed rate without a time column: record i is at i / rate_hz s
    derive          "qd": velocities as finite differences of the positions, for a log that has none;
                    "q": positions as the integral of the velocities from 0 rad, for a log that has none.
                    Without it, a log lacking either is refused, naming the field and this option.
Times become integer ns relative to the first record (ISO-8601 times with a zone offset are converted to UTC, so
a daylight-saving change inside the log is no jump), then seconds from the earliest record.
Errors name the file, the line (the CSV record, header = line 1: the text line unless a quoted field spans
lines) and the column.
"""
from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import numpy as np

from edgeinfer.logs.arm_log import ArmLog, LogError
from edgeinfer.logs.samples import OnError, arm_log_from_records, check_on_error

_UNIT_NS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
_TIME_NAMES = ("t_s", "time", "timestamp", "t")
_SEPARATORS = (",", ";", "\t", "|")
_SNIFF_BYTES = 64 * 1024
_DECIMAL_COMMA = re.compile(r'\s*"?[-+]?\d+,\d+(?:[eE][-+]?\d+)?"?\s*')
_OPTION = {"q": "derive='q' (--derive q) to integrate the velocities from 0 rad",
           "qd": "derive='qd' (--derive qd) for finite differences of the positions"}


def parse_columns(spec: str | None) -> dict[str, str | None]:
    """The column map as {key: value} (t_unit None when not given); raises ValueError naming the bad term."""
    out: dict[str, str | None] = {"t_unit": None, "q": "q[0-9]*", "qd": "qd[0-9]*"}
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


def read_csv_log(path: str | Path, columns: str | None = None, on_error: OnError = "raise",
                 csv_separator: str | None = None, csv_decimal: str | None = None, rate_hz: float | None = None,
                 derive: str | None = None) -> ArmLog:
    """Read a headered CSV through the column map and options (module docstring) into an ArmLog sorted by time:
    t_s (T,) float64 s from 0; q_rad, qd_rad_s (T, D) float64.

    Raises LogError "<file> line <n> column '<name>': ..." for a missing file, no header, a mapped column that
    is not there (or a missing position/velocity field without `derive`), a row with the wrong number of
    fields, a value that is not a number (or not an ISO-8601 time like the first record's), a non-finite
    value, or two records with the same time. With on_error="truncate" the records before the first bad line
    are kept and `truncated_at_row` is that line (a file pyarrow cannot parse at all still raises).
    ValueError for a malformed column map or option.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    check_on_error(on_error)
    path = Path(path)
    cmap = parse_columns(columns)
    sep = _check_options(cmap, csv_separator, csv_decimal, rate_hz, derive)
    if not path.is_file():
        raise LogError(f"{path}: missing file")
    sep, decimal = sniff_dialect(path, sep, csv_decimal)
    header = _header(path, sep)
    t_col, q_cols, qd_cols = _select(path, header, cmap, rate_hz, derive)
    chosen = [i for i in [t_col, *q_cols, *qd_cols] if i is not None]
    table, invalid = _read_text(path, sep, [header[i] for i in chosen])
    if invalid is not None:  # rows before the first malformed one are records 2.. (the header is line 1)
        table = table.slice(0, invalid[0] - 2)
    lines = np.arange(2, table.num_rows + 2)
    if table.num_rows:  # a blank line (every chosen field empty) is no record
        filled = np.stack([pc.utf8_length(c).to_numpy() for c in table.columns]).any(axis=0)
        table, lines = table.filter(pa.array(filled)), lines[filled]
    text = [pc.utf8_trim_whitespace(c) for c in table.columns]
    values, problems = [], []
    unit_ns = _UNIT_NS[cmap["t_unit"] or "s"]
    for i, col in zip(chosen, text):
        v, n_ok, reason = _times_ns(col, decimal, unit_ns) if i == t_col else _floats(col, decimal)
        values.append(v)
        if reason:
            problems.append((n_ok, f"line {lines[n_ok]} column {header[i].strip()!r}: {reason} "
                                   f"{col[n_ok].as_py()!r}"))
    n = len(lines)
    bad_line = message = None
    if problems:
        n, message = min(problems, key=lambda p: p[0])
        bad_line = int(lines[n])
    elif invalid is not None:
        bad_line, message = invalid
        message = f"line {bad_line}: {message}"
    if message is not None and on_error == "raise":
        raise LogError(f"{path} {message}")
    if t_col is None:
        t_ns = np.round(np.arange(n) * (1e9 / rate_hz)).astype(np.int64)
    else:
        t_ns, values = values[0][:n], values[1:]
    q = np.stack([v[:n] for v in values[:len(q_cols)]], axis=1) if q_cols else None
    qd = np.stack([v[:n] for v in values[len(q_cols):]], axis=1) if qd_cols else None
    return arm_log_from_records(path.stem, "csv", str(path), "line", t_ns, q, qd, lines[:n], bad_line)


def _check_options(cmap: dict, separator: str | None, decimal: str | None, rate_hz: float | None,
                   derive: str | None) -> str | None:
    """The separator character (None: detect it). Raises ValueError naming the bad option."""
    sep = "\t" if separator == "tab" else separator
    if sep is not None and (len(sep) != 1 or sep in "\"\r\n"):
        raise ValueError(f"csv_separator must be one character (not a quote or line break) or 'tab', got {separator!r}")
    if decimal not in (None, ".", ","):
        raise ValueError(f"csv_decimal must be '.' or ',', got {decimal!r}")
    if sep is not None and sep == decimal:
        raise ValueError(f"csv_separator and csv_decimal are both {sep!r}")
    if rate_hz is not None and not (np.isfinite(rate_hz) and rate_hz > 0):
        raise ValueError(f"rate_hz must be > 0, got {rate_hz}")
    if rate_hz is not None and (cmap.get("t") or cmap["t_unit"]):
        raise ValueError("set either a time column (t= or t_unit= in the column map) or rate_hz, not both")
    if derive not in (None, "q", "qd"):
        raise ValueError(f"derive must be 'q' or 'qd', got {derive!r}")
    return sep


def sniff_dialect(path: Path, separator: str | None = None, decimal: str | None = None) -> tuple[str, str]:
    """(separator, decimal mark) of a CSV: those given, else detected from its first 64 KiB (module docstring)."""
    with path.open("rb") as fh:
        lines = fh.read(_SNIFF_BYTES).decode("utf-8", errors="replace").splitlines()
    header = re.sub(r'"[^"]*"', "", lines[0]) if lines else ""  # a quoted name may hold any character
    sep = separator or max(_SEPARATORS, key=header.count)  # ties and none: ","
    if decimal is None:
        comma = sep != "," and any(_DECIMAL_COMMA.fullmatch(f) for line in lines[1:] for f in line.split(sep))
        decimal = "," if comma else "."
    return sep, decimal


def _header(path: Path, sep: str) -> list[str]:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    try:
        with pacsv.open_csv(path, read_options=pacsv.ReadOptions(use_threads=False),
                            parse_options=pacsv.ParseOptions(delimiter=sep, invalid_row_handler=lambda row: "skip")
                            ) as reader:
            return reader.schema.names
    except pa.ArrowInvalid as e:
        raise LogError(f"{path} line 1: no header row ({e})") from None


def _match(names: list[str], pattern: str) -> list[int]:
    alternatives = pattern.split("|")
    return [i for i, h in enumerate(names) if any(fnmatch.fnmatchcase(h, a) for a in alternatives)]


def _time_column(names: list[str]) -> str | None:
    """The header name that is a time column by its name (_TIME_NAMES, any letter case), or None."""
    return next((h for n in _TIME_NAMES for h in names if h.casefold() == n), None)


def _select(path: Path, header: list[str], cmap: dict, rate_hz: float | None, derive: str | None
            ) -> tuple[int | None, list[int], list[int]]:
    """Header indices of the time column (None with rate_hz), position and velocity columns. Raises LogError
    naming line 1 for a column that is missing, named twice, or a missing field without `derive`."""
    names = [h.strip() for h in header]
    t_col = None
    if rate_hz is None:
        t_name = cmap.get("t")
        if t_name is None:
            t_name = _time_column(names)
        if t_name not in names:
            raise LogError(f"{path} line 1: no time column {t_name or '/'.join(_TIME_NAMES)!r} in {names}; name it "
                           "with t= in the column map (--columns), or set rate_hz (--rate-hz) for a log recorded "
                           "at a fixed rate")
        t_col = names.index(t_name)
    else:
        found = _time_column(names)
        if found is not None:  # its stamps would be ignored: every gap and jitter in them silently lost
            raise LogError(f"{path} line 1: rate_hz is set but the log has a time column {found!r}; leave rate_hz "
                           "unset to replay its stamps (or rename the column if it is not time)")
    cols = {"q": [i for i in _match(names, cmap["q"]) if i != t_col]}
    cols["qd"] = [i for i in _match(names, cmap["qd"]) if i != t_col and i not in cols["q"]]
    what = {"q": "joint position", "qd": "joint velocity"}
    for field in ("q", "qd"):
        found = [names[i] for i in cols[field]]
        if derive == field and found:
            raise LogError(f"{path} line 1: derive={field!r} fills a missing field, but columns {found} match "
                           f"{field}={cmap[field]!r}")
        if derive != field and not found:
            raise LogError(f"{path} line 1: no {what[field]} column matches {field}={cmap[field]!r} in {names}; "
                           f"name them with {field}= in the column map (--columns), or set {_OPTION[field]}")
    if cols["q"] and cols["qd"] and len(cols["q"]) != len(cols["qd"]):
        raise LogError(f"{path} line 1: {len(cols['q'])} position columns but {len(cols['qd'])} velocity columns")
    for i in [t_col, *cols["q"], *cols["qd"]]:
        if i is not None and header.count(header[i]) > 1:
            raise LogError(f"{path} line 1 column {names[i]!r}: the header names {header.count(header[i])} columns so")
    return t_col, cols["q"], cols["qd"]


def _read_text(path: Path, sep: str, names: list[str]):
    """(the columns `names` as a pyarrow Table of strings, (line, reason) of the first row with the wrong number
    of fields or None). Single-threaded, so that pyarrow numbers rows; blank lines are kept as empty rows, so
    that row r is line r + 2 up to the first malformed row."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    invalid = []

    def on_invalid(row) -> str:
        invalid.append((row.number, f"expected {row.expected_columns} fields, got {row.actual_columns}"))
        return "skip"

    try:
        table = pacsv.read_csv(
            path, read_options=pacsv.ReadOptions(use_threads=False),
            parse_options=pacsv.ParseOptions(delimiter=sep, ignore_empty_lines=False, invalid_row_handler=on_invalid),
            convert_options=pacsv.ConvertOptions(include_columns=names, column_types=dict.fromkeys(names, pa.string())))
    except pa.ArrowInvalid as e:
        raise LogError(f"{path}: unreadable CSV ({e})") from None
    return table, (invalid[0] if invalid else None)


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


def _floats(text, decimal: str) -> tuple[np.ndarray, int, str | None]:
    """(float64 values, how many rows before the first bad one, why it is bad or None)."""
    import pyarrow as pa

    values, n = _cast_prefix(_number_text(text, decimal), pa.float64())
    values = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float64)
    if n < len(text):
        hint = " (decimal mark '.': set csv_decimal=',')" if _DECIMAL_COMMA.fullmatch(text[n].as_py()) else ""
        return values, n, f"not a number{hint}:"
    if not np.all(finite := np.isfinite(values)):
        n = int(np.argmin(finite))
        return values[:n], n, "non-finite value"
    return values, n, None


def _times_ns(text, decimal: str, unit_ns: int) -> tuple[np.ndarray, int, str | None]:
    """Times as int64 ns relative to the first record, from numbers in unit_ns (integers exactly: a 1.7e18 ns
    stamp does not fit a float64) or ISO-8601 strings (the first record decides which, and whether they carry a
    zone offset). Returns as _floats."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(text) == 0:
        return np.zeros(0, dtype=np.int64), 0, None
    numbers = _number_text(text, decimal)
    if _cast_prefix(numbers[:1], pa.float64())[1]:
        try:
            ints = pc.cast(numbers, pa.int64()).to_numpy()
            return (ints - ints[0]) * unit_ns, len(text), None
        except pa.ArrowInvalid:
            times, n, reason = _floats(text, decimal)
            return np.round((times - times[0]) * unit_ns).astype(np.int64) if n else times, n, reason
    for typ in (pa.timestamp("ns", tz="UTC"), pa.timestamp("ns")):  # with a zone offset, then without
        if _cast_prefix(text[:1], typ)[1]:
            stamps, n = _cast_prefix(text, typ)
            ns = stamps.cast(pa.int64()).to_numpy()
            return ns - ns[0] if n else ns, n, None if n == len(text) else "not an ISO-8601 time like the first:"
    return np.zeros(0, dtype=np.int64), 0, "not a number or an ISO-8601 time:"
