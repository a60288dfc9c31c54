"""Generic CSV joint logs, parsed by pyarrow.csv: a header row, one record per line, columns chosen by a column
map, in the dialects real exports use (separator, decimal mark, encoding, ISO-8601 times, no time column).

Column map (a string, so it fits a command-line option or a launch file), comma-separated `key=value`:
    t=NAME          time column (default: the first of t_s, time, timestamp, t, in any letter case)
    t_unit=s|ms|us|ns   unit of a numeric time column (default s; not for ISO-8601 times: refused). ISO-8601
                    times (2022-10-26T08:17:21.847Z, 2022-10-26 10:17:21,847+02:00) are recognised from the first
                    record
    q=PATTERN       joint position columns, an fnmatch pattern or names joined by '|', in header order
                    (default q[0-9]*)
    qd=PATTERN      joint velocity columns (default qd[0-9]*)
Example: "t=stamp_ns,t_unit=ns,q=pos_*,qd=vel_*" (ArmLog.joint_names: what the position pattern's wildcards
matched, pos_shoulder -> shoulder; none for numbering like q0..q5: fields.header_joint_names). Header names are
matched without surrounding spaces; a column matched by two fields (q= and qd=, or the time column) is refused,
naming both.

Reader options besides the map:
    csv_separator   one character, or "tab" (default: the most frequent of , ; tab | in the header line)
    csv_decimal     "." or "," (default: from the first 2000 rows of the columns read: "," when a field is a
                    number with a decimal comma, such as 0,109627604, "." otherwise; refused as ambiguous when they
                    hold both. With ",", a "." in a number is an error: exports that write decimal commas group
                    thousands with it)
    csv_encoding    the file's text encoding, a Python codec name such as latin-1 or cp1252 (default utf-8; a
                    byte that is not valid in it is an error naming its offset and line)
    rate_hz         a log recorded at a fixed rate without a time column: record i is at i / rate_hz s
    derive          "qd": velocities as finite differences of the positions, for a log that has none;
                    "q": positions as the integral of the velocities from 0 rad, for a log that has none.
                    Without it, a log lacking either is refused, naming the field and this option.
    gap_periods     a step longer than this many median sample periods is a gap (default 5): derive restarts at
                    each (q from the last value, qd from 0) and warns naming it (samples.find_gaps)
    bad_rows        records with an empty or unparseable joint cell (a UR export's "" cells): "error" (default)
                    refuses the first, naming its line and column; "skip" drops them; "fill" holds each column's
                    last good value over runs of at most csv_values.FILL_MAX_ROWS records, drops longer runs.
                    Either warns with the counts and the first lines (ArmLog.rows_skipped, rows_filled)
    extra           other channels into ArmLog.extra, "NAME=PATTERN,..." (patterns as q=), e.g. "imu.gyro=gyro_*"
Times become integer ns relative to the first record (ISO-8601 times with a zone offset are converted to UTC, so
a daylight-saving change inside the log is no jump), then seconds from the earliest record. Values a joint log
cannot hold are refused (csv_values, plausible): a time beyond ±4e18 ns, a median step that is no joint log's
rate (0.01 Hz..100 kHz; the error names the t_unit that would fit), a joint value beyond plausible.JOINT_LIMIT.
Errors name the file, the line (the CSV record, header = line 1: the text line unless a quoted field spans
lines) and the column.
"""
from __future__ import annotations

import codecs
import dataclasses
import fnmatch
import itertools
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeinfer.logs import csv_values as cv
from edgeinfer.logs.arm_log import ArmLog, LogError
from edgeinfer.logs.fields import header_joint_names
from edgeinfer.logs.samples import OnError, arm_log_from_records, check_on_error

_TIME_NAMES = ("t_s", "time", "timestamp", "t")
_SEPARATORS = (",", ";", "\t", "|")
_SNIFF_BYTES = 64 * 1024
# Rows the decimal mark is detected from: a mark seen only later fails that field's conversion, naming its line
# (and csv_decimal, when it is a decimal comma); reading every row with a regex would double a read's time.
_SNIFF_ROWS = 2000
_KEYS = ("t", "t_unit", "q", "qd")  # of the column map
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
        if not sep or key not in _KEYS or not value:
            raise ValueError(f"column map term {term!r}: expected one of {', '.join(k + '=' for k in _KEYS)} "
                             "with a value")
        if key == "t_unit" and value not in cv.UNIT_NS:
            raise ValueError(f"column map term {term!r}: t_unit must be one of {sorted(cv.UNIT_NS)}")
        out[key] = value
    return out


@dataclass
class CsvText:
    """A CSV's columns to read, as text, before conversion.

    separator, decimal, encoding: the dialect (given or detected). names: the header's names, stripped.
    fields: {"t": [index] or [] (rate_hz), "q": [...], "qd": [...]} header indices in header order; extra:
    {channel: [indices]}. text: {header index: pyarrow string array, fields trimmed}, one entry per row;
    lines: (N,) int the line of each row (header = line 1; blank lines are no rows). invalid: (line, why) of the
    first row with the wrong number of fields (the rows stop before it), or None.
    """

    separator: str
    decimal: str
    encoding: str
    names: list[str]
    fields: dict[str, list[int]]
    extra: dict[str, list[int]]
    text: dict
    lines: np.ndarray
    invalid: tuple[int, str] | None


def read_text(path: str | Path, cmap: dict, csv_separator: str | None = None, csv_decimal: str | None = None,
              csv_encoding: str | None = None, rate_hz: float | None = None, derive: str | None = None,
              extra: str | None = None) -> CsvText:
    """The columns `cmap` (parse_columns) and `extra` choose, as text, with the dialect detected where an option
    does not give it (module docstring). Raises LogError for a missing file, a file that is not text in its
    encoding (naming the byte offset and line), no header, a column missing, matched twice or named twice, an
    ambiguous decimal mark; ValueError for a bad option."""
    import pyarrow as pa
    import pyarrow.compute as pc

    path = Path(path)
    sep = _check_options(cmap, csv_separator, csv_decimal, csv_encoding, rate_hz, derive)
    encoding = csv_encoding or "utf-8"
    if not path.is_file():
        raise LogError(f"{path}: missing file")
    sep = sep or sniff_separator(path, encoding)
    header = _header(path, sep, encoding)
    names = [h.strip() for h in header]
    fields = _select(path, header, cmap, rate_hz, derive)
    chosen = [i for cols in fields.values() for i in cols]
    x_cols = _extra_columns(path, header, extra, chosen)  # extra channel -> its columns
    chosen += [i for cols in x_cols.values() for i in cols]
    table, invalid = _read_columns(path, sep, encoding, [header[i] for i in chosen])
    if invalid is not None:  # rows before the first malformed one are records 2.. (the header is line 1)
        table = table.slice(0, invalid[0] - 2)
    lines = np.arange(2, table.num_rows + 2)
    if table.num_rows:  # a blank line (every chosen field empty) is no record
        filled = np.stack([pc.utf8_length(c).to_numpy() for c in table.columns]).any(axis=0)
        table, lines = table.filter(pa.array(filled)), lines[filled]
    text = {i: pc.utf8_trim_whitespace(c.combine_chunks()) for i, c in zip(chosen, table.columns)}
    decimal = csv_decimal or _decimal_mark(path, [(names[i], text[i]) for i in chosen], lines)
    return CsvText(sep, decimal, encoding, names, fields, x_cols, text, lines, invalid)


def read_csv_log(path: str | Path, columns: str | None = None, on_error: OnError = "raise",
                 csv_separator: str | None = None, csv_decimal: str | None = None, rate_hz: float | None = None,
                 derive: str | None = None, extra: str | None = None, csv_encoding: str | None = None,
                 bad_rows: str | None = None, gap_periods: float | None = None) -> ArmLog:
    """Read a headered CSV through the column map and options (module docstring) into an ArmLog sorted by time:
    t_s (T,) float64 s from 0; q_rad, qd_rad_s (T, D) float64.

    Raises LogError "<file> line <n> column '<name>': ..." as read_text, and for a row with the wrong number of
    fields, a value that is not a number (or not an ISO-8601 time like the first record's), a non-finite or
    implausible value (a time beyond ±4e18 ns, a joint value beyond plausible.JOINT_LIMIT), or two records with
    the same time (bad_rows "skip" or "fill" drops or fills a record with an empty or unparseable joint cell
    instead, warning). With on_error="truncate" the records before the first bad line are kept and
    `truncated_at_row` is that line (a file pyarrow cannot parse at all still raises). Raises LogError whatever
    on_error says for t_unit with ISO-8601 times and for times whose median step is no joint log's rate
    (csv_values.RATE_HZ; the error suggests a t_unit). ValueError for a malformed column map or option.
    """
    check_on_error(on_error)
    path = Path(path)
    cmap = parse_columns(columns)
    if bad_rows not in (None, "error", "skip", "fill"):
        raise ValueError(f"bad_rows must be 'error', 'skip' or 'fill', got {bad_rows!r}")
    text = read_text(path, cmap, csv_separator, csv_decimal, csv_encoding, rate_hz, derive, extra)
    skipped = filled = np.zeros(0, dtype=np.int64)
    if bad_rows in ("skip", "fill"):
        text, skipped, filled = _repair(path, text, bad_rows)
    lines = text.lines
    columns = [(kind, i) for kind, cols in text.fields.items() for i in cols]  # kind: "t", "q", "qd"; "x": extra
    columns += [("x", i) for cols in text.extra.values() for i in cols]
    values, problems = {}, []
    for kind, i in columns:
        col = text.text[i]
        if kind == "t":
            v, n_ok, reason = _times_ns(path, text, i, cmap["t_unit"])
        elif kind == "x":
            v, n_ok, reason = cv.finite_values(col, text.decimal)
        else:
            v, n_ok, reason = cv.joint_values(col, text.decimal, kind)
            if reason and bad_rows in (None, "error") and cv.unusable(col[n_ok:n_ok + 1], text.decimal)[0]:
                reason += "; set bad_rows (--bad-rows skip or fill) to drop or fill such records"
        values[i] = v
        if reason:
            problems.append((n_ok, f"line {lines[n_ok]} column {text.names[i]!r}: {reason}"))
    n = len(lines)
    bad_line = message = None
    if problems:
        n, message = min(problems, key=lambda p: p[0])
        bad_line = int(lines[n])
    elif text.invalid is not None:
        bad_line, message = text.invalid
        message = f"line {bad_line}: {message}"
    if message is not None and on_error == "raise":
        raise LogError(f"{path} {message}")
    if not text.fields["t"]:
        t_ns = np.round(np.arange(n) * (1e9 / rate_hz)).astype(np.int64)
    else:
        t_col = text.fields["t"][0]
        t_ns = values[t_col][:n]
        if cv.is_number(text.text[t_col], text.decimal) and (why := cv.implausible_rate(t_ns, cmap["t_unit"] or "s")):
            raise LogError(f"{path} column {text.names[t_col]!r}: {why}")
    q, qd = (np.stack([values[i][:n] for i in text.fields[f]], axis=1) if text.fields[f] else None for f in ("q", "qd"))
    x = {name: np.stack([values[i][:n] for i in cols], axis=1) for name, cols in text.extra.items()}
    named = "q" if text.fields["q"] else "qd"  # the joints' columns: positions, or velocities with derive="q"
    names = header_joint_names([text.names[i] for i in text.fields[named]], cmap[named])
    log = arm_log_from_records(path.stem, "csv", str(path), "line", t_ns, q, qd, lines[:n], bad_line, extra=x,
                               gap_periods=gap_periods, joint_names=names)
    log.rows_skipped, log.rows_filled = int(skipped.size), int(filled.size)
    return log


def _repair(path: Path, text: CsvText, mode: str) -> tuple[CsvText, np.ndarray, np.ndarray]:
    """(text without the records bad_rows `mode` drops, the bad ones it fills filled; the lines skipped; the
    lines filled), as csv_values.repair_rows decides; warns (RuntimeWarning) with the counts and first lines."""
    import pyarrow as pa

    joints = {i: text.text[i] for f in ("q", "qd") for i in text.fields[f]}
    columns, keep, filled = cv.repair_rows(joints, text.decimal, mode)
    skipped_lines, filled_lines = text.lines[~keep], text.lines[filled]
    for what, lines in (("skipped", skipped_lines), ("filled from the last good record", filled_lines)):
        if lines.size:
            first = ", ".join(map(str, lines[:5])) + (", ..." if lines.size > 5 else "")
            warnings.warn(f"{path}: bad_rows={mode!r}: {lines.size} record(s) with empty or unparseable joint cells "
                          f"{what} (lines {first})", RuntimeWarning, stacklevel=3)
    if keep.all() and not filled.any():
        return text, skipped_lines, filled_lines
    mask = pa.array(keep)
    cols = {i: (columns.get(i, col)).filter(mask) for i, col in text.text.items()}
    return dataclasses.replace(text, text=cols, lines=text.lines[keep]), skipped_lines, filled_lines


def _times_ns(path: Path, text: CsvText, i: int, unit: str | None) -> tuple[np.ndarray, int, str | None]:
    """The time column `i` as csv_values converts it: numbers in `unit` (default s) or ISO-8601 times, as the
    first record is. Raises LogError for a unit given with ISO-8601 times."""
    col = text.text[i]
    if len(col) == 0 or cv.is_number(col, text.decimal):
        return cv.numeric_times_ns(col, text.decimal, unit or "s")
    times = cv.iso_times_ns(col)
    if unit is not None and times[1]:
        raise LogError(f"{path} line {text.lines[0]} column {text.names[i]!r}: t_unit={unit!r} is set, but the "
                       f"times are ISO-8601 ({col[0].as_py()!r}); t_unit applies to numeric times only: drop it "
                       "from the column map")
    return times


def _check_options(cmap: dict, separator: str | None, decimal: str | None, encoding: str | None,
                   rate_hz: float | None, derive: str | None) -> str | None:
    """The separator character (None: detect it). Raises ValueError naming the bad option."""
    sep = "\t" if separator == "tab" else separator
    if sep is not None and (len(sep) != 1 or sep in "\"\r\n"):
        raise ValueError(f"csv_separator must be one character (not a quote or line break) or 'tab', got {separator!r}")
    if decimal not in (None, ".", ","):
        raise ValueError(f"csv_decimal must be '.' or ',', got {decimal!r}")
    if sep is not None and sep == decimal:
        raise ValueError(f"csv_separator and csv_decimal are both {sep!r}")
    if encoding is not None:
        try:
            codecs.lookup(encoding)
        except LookupError:
            raise ValueError(f"csv_encoding {encoding!r} is not a text encoding Python knows (latin-1, cp1252, "
                             "utf-16, ...)") from None
    if rate_hz is not None and not (np.isfinite(rate_hz) and rate_hz > 0):
        raise ValueError(f"rate_hz must be > 0, got {rate_hz}")
    if rate_hz is not None and (cmap.get("t") or cmap["t_unit"]):
        raise ValueError("set either a time column (t= or t_unit= in the column map) or rate_hz, not both")
    if derive not in (None, "q", "qd"):
        raise ValueError(f"derive must be 'q' or 'qd', got {derive!r}")
    return sep


def sniff_separator(path: Path, encoding: str = "utf-8") -> str:
    """The most frequent of , ; tab | in the header line, outside quotes (ties and none: ",")."""
    import re

    with path.open("rb") as fh:
        lines = fh.read(_SNIFF_BYTES).decode(encoding, errors="replace").splitlines()
    header = re.sub(r'"[^"]*"', "", lines[0]) if lines else ""  # a quoted name may hold any character
    return max(_SEPARATORS, key=header.count)


def _decimal_mark(path: Path, columns: list[tuple[str, object]], lines: np.ndarray) -> str:
    """"," when a field of `columns` (in their first _SNIFF_ROWS rows) is a number with a decimal comma, else "."
    (module docstring). Raises LogError naming one field of each when they hold both."""
    comma, point = (cv.first_match(columns, mark, _SNIFF_ROWS) for mark in (cv.DECIMAL_COMMA, cv.DECIMAL_POINT))
    if comma and point:
        raise LogError(f"{path}: decimal mark unclear: line {lines[comma[0]]} column {comma[1]!r} reads {comma[2]!r} "
                       f"(a decimal comma), line {lines[point[0]]} column {point[1]!r} reads {point[2]!r} (a decimal "
                       "point); set csv_decimal (--csv-decimal) to the file's mark")
    return "," if comma else "."


_HEADER_BYTES = 1 << 20  # checked for the encoding before pyarrow reads the header (its first block)


def _header(path: Path, sep: str, encoding: str) -> list[str]:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    with path.open("rb") as fh:  # text pyarrow cannot decode reaches its row handler as an "Exception ignored"
        head = fh.read(_HEADER_BYTES)
    try:
        codecs.getincrementaldecoder(encoding)().decode(head)  # a character cut at the end of head waits, no error
    except UnicodeDecodeError:
        raise LogError(_undecodable(path, encoding) or f"{path}: not {encoding} text") from None
    try:
        with pacsv.open_csv(path, read_options=pacsv.ReadOptions(use_threads=False, encoding=encoding),
                            parse_options=pacsv.ParseOptions(delimiter=sep, invalid_row_handler=lambda row: "skip")
                            ) as reader:
            return reader.schema.names
    except (pa.ArrowInvalid, UnicodeDecodeError) as e:
        raise LogError(_undecodable(path, encoding) or f"{path} line 1: no header row ({e})") from None


def _undecodable(path: Path, encoding: str) -> str | None:
    """Where `path` first fails to decode in `encoding`: "<file> byte <offset> (line <n>): ..." naming the
    csv_encoding option, or None when all of it decodes."""
    decoder = codecs.getincrementaldecoder(encoding)()
    offset = newlines = 0
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            pending = len(decoder.getstate()[0])  # bytes of a character the last chunk left unfinished
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as e:
                at = max(e.start - pending, 0)
                line = newlines + chunk.count(b"\n", 0, at) + 1
                return (f"{path} byte {offset + at} (line {line}): not "
                        f"{encoding} text ({e.reason}: {e.object[e.start:e.end]!r}); set csv_encoding "
                        "(--csv-encoding) to the file's encoding, e.g. latin-1 or cp1252")
            offset, newlines = offset + len(chunk), newlines + chunk.count(b"\n")
    return None


def _match(names: list[str], pattern: str) -> list[int]:
    alternatives = pattern.split("|")
    return [i for i, h in enumerate(names) if any(fnmatch.fnmatchcase(h, a) for a in alternatives)]


def _time_column(names: list[str]) -> str | None:
    """The header name that is a time column by its name (_TIME_NAMES, any letter case), or None."""
    return next((h for n in _TIME_NAMES for h in names if h.casefold() == n), None)


def _select(path: Path, header: list[str], cmap: dict, rate_hz: float | None, derive: str | None
            ) -> dict[str, list[int]]:
    """Header indices of the time column ("t": [] with rate_hz), position and velocity columns ("q", "qd").
    Raises LogError naming line 1 for a column that is missing, matched by two fields (naming both), named
    twice, or a missing field without `derive`."""
    names = [h.strip() for h in header]
    fields: dict[str, list[int]] = {"t": []}
    patterns = {"t": cmap.get("t"), "q": cmap["q"], "qd": cmap["qd"]}
    if rate_hz is None:
        t_name = patterns["t"] = cmap.get("t") or _time_column(names)
        if t_name not in names:
            raise LogError(f"{path} line 1: no time column {t_name or '/'.join(_TIME_NAMES)!r} in {names}; name it "
                           "with t= in the column map (--columns), or set rate_hz (--rate-hz) for a log recorded "
                           "at a fixed rate")
        fields["t"] = [names.index(t_name)]
    else:
        found = _time_column(names)
        if found is not None:  # its stamps would be ignored: every gap and jitter in them silently lost
            raise LogError(f"{path} line 1: rate_hz is set but the log has a time column {found!r}; leave rate_hz "
                           "unset to replay its stamps (or rename the column if it is not time)")
    fields |= {f: _match(names, patterns[f]) for f in ("q", "qd")}
    for a, b in itertools.combinations(fields, 2):
        if both := [names[i] for i in fields[a] if i in fields[b]]:
            raise LogError(f"{path} line 1: columns {both} match both {a}={patterns[a]!r} and {b}={patterns[b]!r}; "
                           "a column is one field's: narrow a pattern (names joined by '|' list them exactly)")
    what = {"q": "joint position", "qd": "joint velocity"}
    for field in ("q", "qd"):
        found = [names[i] for i in fields[field]]
        if derive == field and found:
            raise LogError(f"{path} line 1: derive={field!r} fills a missing field, but columns {found} match "
                           f"{field}={cmap[field]!r}")
        if derive != field and not found:
            raise LogError(f"{path} line 1: no {what[field]} column matches {field}={cmap[field]!r} in {names}; "
                           f"name them with {field}= in the column map (--columns), or set {_OPTION[field]}")
    if fields["q"] and fields["qd"] and len(fields["q"]) != len(fields["qd"]):
        raise LogError(f"{path} line 1: {len(fields['q'])} position columns but {len(fields['qd'])} velocity columns")
    for i in (i for cols in fields.values() for i in cols):
        if header.count(header[i]) > 1:
            raise LogError(f"{path} line 1 column {names[i]!r}: the header names {header.count(header[i])} columns so: "
                           "rename the repeated columns in the export, or map the joints with --columns")
    return fields


def _extra_columns(path: Path, header: list[str], extra: str | None, used: list[int]) -> dict[str, list[int]]:
    """{channel: header indices} of the `extra` option "NAME=PATTERN,..." (patterns as q=). Raises LogError
    naming line 1 for a pattern that matches no column or a column already read (time, joints, a channel)."""
    from edgeinfer.logs.fields import parse_extra

    names, out, used = [h.strip() for h in header], {}, set(used)
    for name, pattern in parse_extra(extra).items():
        cols = _match(names, pattern)
        if not cols or used & set(cols):
            why = f"also read as {sorted(names[i] for i in used & set(cols))}" if cols else f"no column in {names}"
            raise LogError(f"{path} line 1: extra channel {name}={pattern!r}: {why}")
        used |= set(cols)
        out[name] = cols
    return out


def _read_columns(path: Path, sep: str, encoding: str, names: list[str]):
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
            path, read_options=pacsv.ReadOptions(use_threads=False, encoding=encoding),
            parse_options=pacsv.ParseOptions(delimiter=sep, ignore_empty_lines=False, invalid_row_handler=on_invalid),
            convert_options=pacsv.ConvertOptions(include_columns=names, column_types=dict.fromkeys(names, pa.string())))
    except (pa.ArrowInvalid, UnicodeDecodeError) as e:
        raise LogError(_undecodable(path, encoding) or f"{path}: unreadable CSV ({e})") from None
    return table, (invalid[0] if invalid else None)
