"""Arm logs: the Schunk LWA 4P reader, the fixed train/held-out split, and the embedded synthetic default.

On-disk layout (one folder per run, no headers, comma separated, 250 Hz):
    time.csv        (T, 1)    seconds
    trajectory.csv  (T, 2*D)  q1..qD rad, then qd1..qdD rad/s
    input.csv       (T-1, D)  motor torques; not read here

Split (fixed by measurement number, never by random draw, so every model and report agrees):
    HELD_OUT = {n in 1..99 : n % 5 == 1}  -> 1, 6, 11, ..., 96 (20 runs the model never trains on)
    TRAIN    = the other 60 runs (multiples of 5 do not exist in the dataset).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from edgeinfer.core.errors import LogError

HELD_OUT: frozenset[int] = frozenset(n for n in range(1, 100) if n % 5 == 1)
TRAIN: frozenset[int] = frozenset(n for n in range(1, 100) if n % 5 not in (0, 1))

# Start pose of the real recordings (measurement_1, row 1, rounded); the synthetic log moves around it.
Q0_RAD = np.array([1.06, -1.0, -1.37, 0.0, 0.58, -0.77])
_MAX_OFFSET_RAD = 0.6
# Joint range covered by the 80 real recordings (rad); the synthetic log stays inside it, where the policy
# was trained.
_Q_MIN_RAD = np.array([-0.59, -1.0, -2.12, -1.66, -1.14, -1.69])
_Q_MAX_RAD = np.array([1.25, 0.99, 1.65, 0.47, 1.53, 1.32])
_MAX_SPEED_RAD_S = 0.8
# Peak of the minimum-jerk velocity profile is 1.875 * dq / T; keep 10 % below the limit.
_MINJERK_PEAK = 1.875
_SPEED_MARGIN = 0.9


@dataclass
class ArmLog:
    """One recorded (or synthesised) joint trajectory.

    t_s: (T,) float64 seconds from log start, strictly increasing.
    q_rad: (T, D) float64 joint positions. qd_rad_s: (T, D) float64 joint velocities.
    truncated_at_row: where a read with on_error="truncate" stopped, else None: the 1-based line of a CSV
        file, the 0-based record (message, row) index of any other format.
    source: the format it was read from ("schunk", "csv", "mcap", "rosbag2", "rosbag1", "lerobot", "synthetic").
    reordered: records that arrived out of timestamp order in the file (the reader sorted them).
    qd_from_differences: True when the file had no velocities and qd_rad_s is a finite difference of q.
    q_from_integration: True when the file had no positions and q_rad is the integral of qd from 0 rad.
    joint_names: (D,) the joints' names where the log names them (a JointState's name, a CSV header, a
        LeRobot feature's names), else None.
    extra: other numeric channels read with the joints, each (T, width) float64 row-aligned with t_s
        (an IMU's angular velocity, a velocity command, ...); keys are the names observation specs use.
    dropped_before_extra: records dropped for coming before an extra channel's first sample (logs/samples.py).
    rows_skipped, rows_filled: CSV records dropped, or held from the last good value, for empty or unparseable
        joint cells (reader option bad_rows).
    gaps_s: [(t_s of the record after the gap, length s)] of every step longer than the reader's gap_periods
        (logs/samples.py); a derived q or qd restarts at each.
    Raises ValueError if shapes disagree.
    """

    name: str
    t_s: np.ndarray
    q_rad: np.ndarray
    qd_rad_s: np.ndarray
    truncated_at_row: int | None = None
    source: str = "schunk"
    reordered: int = 0
    qd_from_differences: bool = False
    q_from_integration: bool = False
    joint_names: list[str] | None = None
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    dropped_before_extra: int = 0  # records earlier than an extra channel's first sample (none to hold), dropped
    rows_skipped: int = 0
    rows_filled: int = 0
    gaps_s: list[tuple[float, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.t_s.ndim != 1 or self.q_rad.ndim != 2 or self.q_rad.shape != self.qd_rad_s.shape:
            raise ValueError(f"{self.name}: want t_s (T,), q/qd (T, D); got {self.t_s.shape}, "
                             f"{self.q_rad.shape}, {self.qd_rad_s.shape}")
        if self.q_rad.shape[0] != self.t_s.shape[0]:
            raise ValueError(f"{self.name}: {self.t_s.shape[0]} times but {self.q_rad.shape[0]} rows")
        if self.joint_names is not None and len(self.joint_names) != self.q_rad.shape[1]:
            raise ValueError(f"{self.name}: {len(self.joint_names)} joint names for {self.q_rad.shape[1]} joints")
        for key, value in self.extra.items():
            if value.ndim != 2 or value.shape[0] != self.t_s.shape[0]:
                raise ValueError(f"{self.name}: extra channel {key!r} is {value.shape}, want ({len(self.t_s)}, width)")

    def rows(self, index) -> ArmLog:
        """The log restricted to rows `index` (a slice, an index array or a boolean mask over rows), every
        row-aligned array (times, joints, extra channels) cut the same way."""
        return dataclasses.replace(self, t_s=self.t_s[index], q_rad=self.q_rad[index],
                                   qd_rad_s=self.qd_rad_s[index],
                                   extra={k: v[index] for k, v in self.extra.items()})

    @property
    def rate_hz(self) -> float:
        """Sample rate in Hz: 1 / period_s (see period_ns)."""
        return 1.0 / self._period_s()

    @property
    def period_ns(self) -> int:
        """Sample period in integer nanoseconds.

        Each step is counted in whole median periods (a dropped sample counts 2), then the period is the
        least-squares slope of time against that count, so neither jitter nor a dropped sample moves it.
        """
        return int(round(self._period_s() * 1e9))

    def _period_s(self) -> float:
        dt = np.diff(self.t_s)
        median = float(np.median(dt))
        count = np.r_[0.0, np.cumsum(np.maximum(np.round(dt / median), 1))]
        # The least-squares slope in closed form, sum(c t) / sum(c c) over the centred count and times, each
        # scaled to at most 1 first: np.polyfit's lstsq gives 0 (rank deficient) on huge times.
        t_scale, c_scale = float(np.abs(self.t_s).max()) or 1.0, float(count[-1])
        c, t = count / c_scale, self.t_s / t_scale
        c, t = c - c.mean(), t - t.mean()
        return float(np.dot(c, t) / np.dot(c, c) * (t_scale / c_scale))

    @property
    def n_joints(self) -> int:
        return int(self.q_rad.shape[1])

    def __len__(self) -> int:
        return int(self.t_s.shape[0])


def _parse_line(line: str, ncols: int) -> tuple[np.ndarray | None, str]:
    """One CSV line -> (values, "") or (None, reason)."""
    fields = line.split(",")
    if len(fields) != ncols:
        return None, f"expected {ncols} columns, got {len(fields)}"
    try:
        row = np.array([float(f) for f in fields])
    except ValueError:
        return None, f"not a number: {line.strip()[:60]!r}"
    if not np.all(np.isfinite(row)):
        return None, "non-finite value"
    return row, ""


def _read_csv(path: Path, ncols: int) -> tuple[np.ndarray, tuple[int, str] | None]:
    """Read a headerless numeric CSV -> ((R, ncols) good rows before the first bad one, (line, reason) | None)."""
    if not path.is_file():
        raise LogError(f"{path}: missing file")
    lines = path.read_text().splitlines()
    while lines and not lines[-1].strip():  # a trailing newline or blank tail is not a row
        lines.pop()
    try:
        # Fast path; comments=None so '#' is a bad row rather than silently skipped.
        arr = np.loadtxt(lines, delimiter=",", ndmin=2, dtype=np.float64, comments=None)
        if arr.shape == (len(lines), ncols) and np.all(np.isfinite(arr)):
            return arr, None
    except ValueError:
        pass
    # Slow path only for broken files: walk line by line so the error points at the first bad row.
    rows = []
    for i, line in enumerate(lines):
        row, reason = _parse_line(line, ncols)
        if row is None:
            return np.array(rows, dtype=np.float64).reshape(-1, ncols), (i + 1, reason)
        rows.append(row)
    raise AssertionError("unreachable: fast path rejected a file with no bad row")


def read_schunk(path: str | Path, on_error: Literal["raise", "truncate"] = "raise") -> ArmLog:
    """Read one measurement folder (time.csv + trajectory.csv) into an ArmLog.

    t_s is shifted to start at 0. on_error="raise" raises LogError at the first bad row; "truncate" keeps
    every row before it and records its 1-based line in `truncated_at_row`.
    Raises LogError: missing file, wrong column count, non-finite value, non-increasing time, length
    mismatch between the two files, or fewer than 2 usable rows (even when truncating).
    Raises ValueError for an unknown on_error.
    """
    if on_error not in ("raise", "truncate"):
        raise ValueError(f"on_error must be 'raise' or 'truncate', got {on_error!r}")
    path = Path(path)
    time_path, traj_path = path / "time.csv", path / "trajectory.csv"
    traj_cols = _traj_columns(traj_path)
    t, t_bad = _read_csv(time_path, 1)
    traj, traj_bad = _read_csv(traj_path, traj_cols)
    t = t[:, 0]

    # Each problem as (1-based line, message); the earliest one decides where a truncation cuts.
    problems: list[tuple[int, str]] = []
    if t_bad:
        problems.append((t_bad[0], f"{time_path} line {t_bad[0]}: {t_bad[1]}"))
    if traj_bad:
        problems.append((traj_bad[0], f"{traj_path} line {traj_bad[0]}: {traj_bad[1]}"))
    steps = np.flatnonzero(np.diff(t) <= 0)
    if steps.size:
        line = int(steps[0]) + 2  # diff index i compares rows i and i+1 (0-based) -> line i+2
        problems.append((line, f"{time_path} line {line}: time not increasing ({float(t[line - 2])} -> "
                               f"{float(t[line - 1])})"))
    if len(t) != len(traj):
        # Checked even when a parse error exists: the shorter file bounds what a truncation can keep.
        line = min(len(t), len(traj)) + 1
        problems.append((line, f"{path}: length mismatch at line {line}: time.csv has {len(t)} rows, "
                               f"trajectory.csv has {len(traj)}"))

    bad_row = None
    if problems:
        # Earliest line wins; on a tie the parse error (appended first) is the more useful message.
        bad_row, msg = min(problems, key=lambda p: p[0])
        if on_error == "raise":
            raise LogError(msg)
    n = min(len(t), len(traj)) if bad_row is None else bad_row - 1
    if n < 2:
        raise LogError(f"{path}: fewer than 2 usable rows" + (f" (first bad line {bad_row})" if bad_row else ""))
    d = traj_cols // 2
    t = t[:n]
    return ArmLog(name=path.name, t_s=t - t[0], q_rad=np.ascontiguousarray(traj[:n, :d]),
                  qd_rad_s=np.ascontiguousarray(traj[:n, d:]), truncated_at_row=bad_row)


def _traj_columns(traj_path: Path) -> int:
    """Column count of trajectory.csv from its first line (must be even: q then qd). Raises LogError."""
    if not traj_path.is_file():
        raise LogError(f"{traj_path}: missing file")
    with traj_path.open() as f:
        first = f.readline()
    ncols = len(first.split(","))
    if not first.strip() or ncols % 2:
        raise LogError(f"{traj_path} line 1: expected an even number of columns (q then qd), got {ncols}")
    return ncols


def write_schunk(log: ArmLog, path: str | Path) -> Path:
    """Write `log` in the Schunk layout under `path` (created); input.csv is zeros, one row fewer.

    Floats are written with repr, so read_schunk(write_schunk(log, p)) gives back the same values.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    _write_rows(path / "time.csv", log.t_s[:, None])
    _write_rows(path / "trajectory.csv", np.hstack([log.q_rad, log.qd_rad_s]))
    _write_rows(path / "input.csv", np.zeros((max(len(log) - 1, 0), log.n_joints)))
    return path


def _write_rows(path: Path, arr: np.ndarray) -> None:
    # repr is the shortest text that parses back to the same float64; %.17g would bloat 0.004.
    path.write_text("".join(",".join(map(repr, row)) + "\n" for row in arr.tolist()))


def list_schunk_runs(root: str | Path) -> dict[int, Path]:
    """Map measurement number -> folder for every `measurement_N` under root, sorted by N.

    Raises LogError if root is not a directory.
    """
    root = Path(root)
    if not root.is_dir():
        raise LogError(f"{root}: not a directory")
    runs = {}
    for p in root.iterdir():
        m = re.fullmatch(r"measurement_(\d+)", p.name)
        if m and p.is_dir():
            runs[int(m.group(1))] = p
    return dict(sorted(runs.items()))


def split_of(n: int) -> Literal["train", "held_out"]:
    """Split of measurement number n (see module docstring). Raises ValueError for a run that cannot exist."""
    if not 1 <= n <= 99 or n % 5 == 0:
        raise ValueError(f"no measurement {n}: runs are 1..99 except multiples of 5")
    return "held_out" if n in HELD_OUT else "train"


def _minjerk(tau: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Minimum-jerk shape s(tau) and ds/dtau on tau in [0, 1] (Flash & Hogan 1985)."""
    s = tau**3 * (10 - 15 * tau + 6 * tau**2)
    ds = 30 * tau**2 * (1 - tau) ** 2
    return s, ds


def synthetic_log(seconds: float = 3.0, rate_hz: float = 250.0, seed: int = 0) -> ArmLog:
    """Deterministic 6-joint log of minimum-jerk point-to-point moves, the default without ../shared.

    Each move lasts 0.6-1.5 s between random targets within +-0.6 rad of Q0_RAD and inside the real
    recordings' joint range; step sizes are capped so the peak speed 1.875*dq/T stays below 0.8 rad/s.
    qd is the analytic derivative. Returns (T,) / (T, 6) float64
    with T = round(seconds * rate_hz). Raises ValueError for non-positive seconds or rate, or T < 2.
    """
    if seconds <= 0 or rate_hz <= 0:
        raise ValueError(f"seconds and rate_hz must be > 0, got {seconds}, {rate_hz}")
    rng = np.random.default_rng(seed)
    n = int(round(seconds * rate_hz))
    if n < 2:
        raise ValueError(f"{seconds} s at {rate_hz} Hz gives fewer than 2 samples")
    t = np.arange(n, dtype=np.float64) / rate_hz
    q = np.empty((n, Q0_RAD.size))
    qd = np.empty_like(q)
    q_from, t_from = Q0_RAD.copy(), 0.0
    while t_from <= t[-1]:
        dur = float(rng.uniform(0.6, 1.5))
        step_max = _SPEED_MARGIN * _MAX_SPEED_RAD_S * dur / _MINJERK_PEAK
        lo = np.maximum(np.maximum(Q0_RAD - _MAX_OFFSET_RAD, _Q_MIN_RAD), q_from - step_max)
        hi = np.minimum(np.minimum(Q0_RAD + _MAX_OFFSET_RAD, _Q_MAX_RAD), q_from + step_max)
        q_to = rng.uniform(lo, hi)
        sel = (t >= t_from) & (t < t_from + dur)
        s, ds = _minjerk((t[sel] - t_from) / dur)
        q[sel] = q_from + np.outer(s, q_to - q_from)
        qd[sel] = np.outer(ds / dur, q_to - q_from)
        q_from, t_from = q_to, t_from + dur
    return ArmLog(name=f"synthetic-minjerk-seed{seed}", t_s=t, q_rad=q, qd_rad_s=qd, source="synthetic")
