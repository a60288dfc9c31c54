"""Log readers: every supported format becomes one ArmLog, so the replayer builds the same Observation stream
from any of them.

    format    path                                          library
    schunk    directory with time.csv + trajectory.csv      (numpy)
    csv       *.csv with a header row and a column map      pyarrow.csv
    mcap      *.mcap (ROS 2 cdr or JSON channels)           mcap, mcap-ros2-support
    rosbag2   directory with metadata.yaml, or its *.db3    rosbags
    rosbag1   *.bag                                         rosbags
    lerobot   directory with meta/info.json (v2.1, v3.0)    pyarrow

Readers are looked up by name and imported on first use, so a Schunk replay imports none of these libraries;
pyarrow comes with the base install, the others with `pip install 'edgeinfer[logs]'` (core/extras.py: checked before
a command starts its work, by require_reader).
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Literal

from edgeinfer.core.extras import install_hint, require
from edgeinfer.logs.arm_log import ArmLog, LogError, read_schunk
from edgeinfer.logs.samples import check_on_error

FORMATS: tuple[str, ...] = ("schunk", "csv", "mcap", "rosbag2", "rosbag1", "lerobot")

# format -> (module, function, options it accepts besides path and on_error)
_READERS = {
    "csv": ("edgeinfer.logs.csv_log", "read_csv_log",
            {"columns", "csv_separator", "csv_decimal", "csv_encoding", "rate_hz", "derive", "extra",
             "bad_rows", "gap_periods"}),
    "mcap": ("edgeinfer.logs.mcap_log", "read_mcap_log", {"topic", "q_field", "qd_field", "time_source", "extra"}),
    "rosbag2": ("edgeinfer.logs.rosbag_log", "read_rosbag_log",
                {"topic", "q_field", "qd_field", "time_source", "extra"}),
    "rosbag1": ("edgeinfer.logs.rosbag_log", "read_rosbag_log",
                {"topic", "q_field", "qd_field", "time_source", "extra"}),
    "lerobot": ("edgeinfer.logs.lerobot_log", "read_lerobot_log", {"episode", "q_field", "qd_field", "extra"}),
}

# format -> the optional modules (extra "logs") its reader needs; mcap_ros2 only for ROS 2 (cdr) channels
_NEEDS = {"mcap": ("mcap",), "rosbag2": ("rosbags",), "rosbag1": ("rosbags",)}


def require_reader(path: str | Path, fmt: str | None = None) -> str:
    """The format of the log at `path` (fmt None: detected), after checking that its reader's optional modules are
    installed: raises core.extras.MissingExtra naming the extra (`pip install 'edgeinfer[logs]'`), LogError for a
    path that is missing or in no format. Commands call it before their work starts."""
    fmt = fmt or detect_format(path)
    if fmt in _NEEDS:
        require("logs", f"reading {fmt} logs", _NEEDS[fmt])
    return fmt


def detect_format(path: str | Path) -> str:
    """The format of `path` from its layout (see the module table). Raises LogError when the path is missing or
    matches no format."""
    path = Path(path)
    if path.is_dir():
        if (path / "time.csv").is_file():
            return "schunk"
        if (path / "meta" / "info.json").is_file():
            return "lerobot"
        if (path / "metadata.yaml").is_file():
            return "rosbag2"
        raise LogError(f"{path}: a directory but not a Schunk run (time.csv), a LeRobot dataset (meta/info.json) "
                       "or a rosbag2 bag (metadata.yaml)")
    if not path.exists():
        raise LogError(f"log not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix == ".bag":
        return "rosbag1"
    if suffix == ".db3" or (suffix == ".mcap" and (path.parent / "metadata.yaml").is_file()):
        return "rosbag2"
    if suffix == ".mcap":
        return "mcap"
    raise LogError(f"{path}: unknown log format (suffix {suffix!r}); expected one of {list(FORMATS)}")


def read_log(path: str | Path, fmt: str | None = None, on_error: Literal["raise", "truncate"] = "raise",
             **options) -> ArmLog:
    """Read any supported log into an ArmLog: t_s (T,) float64 s from 0, increasing; q_rad, qd_rad_s (T, D).

    fmt: one of FORMATS, or None to detect it from the path. options: passed to that format's reader
    (topic, q_field, qd_field, time_source for bags and MCAP; columns, csv_separator, csv_decimal, csv_encoding,
    rate_hz, derive, bad_rows, gap_periods for CSV; episode, q_field, qd_field for LeRobot; extra for all of
    these: "NAME=SOURCE,..." other channels into ArmLog.extra, SOURCE "TOPIC:FIELD|FIELD" for MCAP and bags, a
    feature for LeRobot, a column pattern for CSV, docs/log-formats.md); None values are ignored. Raises LogError naming
    the file and record for unreadable input (on_error="truncate" keeps the records before it), ValueError for
    an unknown format, an option the format does not take, or a bad on_error. RuntimeError names the extra when
    an optional library is missing.
    """
    check_on_error(on_error)
    fmt = require_reader(path, fmt) if fmt in (None, *_NEEDS) else fmt
    options = {k: v for k, v in options.items() if v is not None}
    if fmt == "schunk":
        if options:
            raise ValueError(f"format 'schunk' takes no options, got {sorted(options)}")
        return read_schunk(path, on_error=on_error)
    if fmt not in _READERS:
        raise ValueError(f"unknown log format {fmt!r}; expected one of {list(FORMATS)}")
    module, func, accepted = _READERS[fmt]
    if unknown := set(options) - accepted:
        raise ValueError(f"format {fmt!r} does not take option(s) {sorted(unknown)}; it takes {sorted(accepted)}")
    try:
        reader = getattr(importlib.import_module(module), func)
        return reader(path, on_error=on_error, **options)
    except ModuleNotFoundError as e:
        raise RuntimeError(f"reading {fmt} logs needs {e.name}: {install_hint('logs')}") from e
