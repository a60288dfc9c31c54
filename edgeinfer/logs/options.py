"""How a log's joints are read: the reader options of edgeinfer.logs.read_log as one config dataclass, for every
command that reads logs (training and distillation; the replayer's LogSourceConfig holds the same names, plus
`episode` and `extra`, which training does not take: episodes are its units, and the policy observes joints
only). Each format takes some of them; read_log refuses one its format does not take, naming it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(kw_only=True)
class ReaderOptions:
    """The options read_log passes to a format's reader (None: unset, the reader's default)."""

    topic: str | None = None  # reader option: the topic holding the joint states (MCAP, bags)
    q_field: str | None = None  # reader option: the message field or LeRobot feature of the joint positions (rad)
    qd_field: str | None = None  # reader option: the message field or LeRobot feature of the joint velocities (rad/s)
    time_source: Literal["header", "log"] | None = None  # reader option: timestamps from the message header or the log
    # reader option: the CSV column map, e.g. "t=stamp_ns,t_unit=ns,q=pos_*,qd=vel_*" (time column and unit,
    # fnmatch patterns of the position and velocity columns; see docs/log-formats.md)
    columns: str | None = None
    csv_separator: str | None = None  # reader option: the CSV field separator, one character or "tab" (None: detected)
    csv_decimal: Literal[".", ","] | None = None  # reader option: the CSV decimal mark (None: detected)
    # reader option: the CSV file's text encoding, a Python codec name such as latin-1 or cp1252 (None: utf-8)
    csv_encoding: str | None = None
    # reader option: the sample rate of a CSV log without a time column, Hz (record i is at i / rate_hz s)
    rate_hz: float | None = None
    # reader option: fill the field a CSV log lacks: "qd" = finite differences of the positions, "q" = integral
    # of the velocities from 0 rad (None: such a log is refused, naming the field)
    derive: Literal["q", "qd"] | None = None
    # reader option: CSV records whose joint cells are empty or not numbers: "error" stops at the first (None:
    # this), "skip" drops them, "fill" holds each column's last good value over runs of at most 3 such records and
    # drops longer runs; skipped and filled records are counted in a warning naming their first lines
    bad_rows: Literal["error", "skip", "fill"] | None = None
    # reader option: a step between records longer than this many median sample periods is a gap, where derive
    # restarts (q: from the last value, qd: from 0) instead of integrating or differencing across it (None: 5)
    gap_periods: float | None = None

    READER_OPTIONS = ("topic", "q_field", "qd_field", "time_source", "columns", "csv_separator", "csv_decimal",
                      "csv_encoding", "rate_hz", "derive", "bad_rows", "gap_periods")

    def __post_init__(self):
        if self.rate_hz is not None and not self.rate_hz > 0:
            raise ValueError(f"{type(self).__name__}.rate_hz must be > 0, got {self.rate_hz}")
        if self.gap_periods is not None and not self.gap_periods > 1:  # a step of 1 period is no gap
            raise ValueError(f"{type(self).__name__}.gap_periods must be > 1, got {self.gap_periods}")

    def reader_options(self) -> dict:
        """The reader options set here, {name: value} (edgeinfer.logs.read_log checks the format takes them)."""
        return {k: getattr(self, k) for k in self.READER_OPTIONS if getattr(self, k) is not None}
