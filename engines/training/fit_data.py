"""Training data from any log the replayer reads (edgeinfer.logs.read_log): the units, the train/held-out split,
the chunk windows of each part, and the joint limits fitted on the training part.

`--data` names one of
    a LeRobot dataset    each episode is a unit (edgeinfer.logs.lerobot_log.list_lerobot_episodes)
    a folder of logs     each log in it is a unit: a Schunk run folder, a rosbag2 folder, a CSV, MCAP or bag
                         file (other entries are skipped), ordered by name with numbers compared as numbers
    one log              one unit, split by time: its last HELD_OUT_FRACTION of rows are held out
A unit is wholly train or wholly held out, and windows (engines/training/dataset.py) are cut inside each unit, so no
window crosses an episode or a file. `--held-out` names the held-out units (episode indices "0,3", or file and
run names, with or without their suffix); by default the Schunk rule for Schunk runs (measurement numbers
n % 5 == 1, edgeinfer.logs.arm_log.HELD_OUT), else the last unit. Every unit must have the same joints and
rate; velocities a log lacks are derived by its reader (finite differences) and the manifest says so.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np

from edgeinfer.core.wire import MAX_JOINTS
from edgeinfer.engines.training.dataset import chunk_windows
from edgeinfer.logs import detect_format, read_log
from edgeinfer.logs.arm_log import ArmLog, LogError, split_of
from edgeinfer.logs.options import ReaderOptions

SCHUNK_DATA = Path("../shared/data/schunk_lwa4p")  # the real Schunk LWA 4P recordings (../shared/data/SOURCES.md)
SCHUNK_RULE = "held_out = measurement numbers n with n % 5 == 1"
HELD_OUT_FRACTION = 0.2  # of a single log's rows, at its end
RATE_TOLERANCE = 0.01  # units whose sample rates differ by more than this fraction are refused
# Limits fitted on the training part (manifest "limits", source "fitted"): the range of q widened on each side
# by Q_MARGIN of it (at least Q_MARGIN_MIN_RAD, so that a joint that never moves keeps some room), and
# QD_FACTOR x the largest |qd| (at least QD_MIN_RAD_S).
Q_MARGIN, Q_MARGIN_MIN_RAD = 0.1, 0.01
QD_FACTOR, QD_MIN_RAD_S = 1.5, 0.01
LIMITS_MARGIN = (f"q: the training data's range widened by {Q_MARGIN:.0%} of it on each side (at least "
                 f"{Q_MARGIN_MIN_RAD} rad); qd: {QD_FACTOR} x the training data's largest |qd| (at least "
                 f"{QD_MIN_RAD_S} rad/s)")
# Default chunk shape: a chunk step of about CHUNK_STEP_S (at least one tick), and as many steps (at most
# MAX_DEFAULT_HORIZON) as keep a chunk at TOKENS_PER_S x its step's duration: 48 tokens per 20 ms, the shipped
# Schunk policy's ratio, so that a chunk decodes within one chunk step wherever the Schunk one does.
CHUNK_STEP_S = 0.020
TOKENS_PER_S = 2400.0
MAX_DEFAULT_HORIZON = 8


def default_stride_ticks(rate_hz: float) -> int:
    """Control ticks per chunk step: round(CHUNK_STEP_S * rate_hz), at least 1 (250 Hz: 5; 30 Hz: 1)."""
    return max(1, round(CHUNK_STEP_S * rate_hz))


def default_horizon(step_s: float, n_joints: int) -> int:
    """Chunk steps H with H * n_joints <= TOKENS_PER_S * step_s, in 2..MAX_DEFAULT_HORIZON (Schunk 6 joints,
    20 ms: 8; Reachy 2 19 joints, 33 ms: 4; GR1 44 joints, 50 ms: 2)."""
    tokens = round(TOKENS_PER_S * step_s, 6)  # 2400 x 0.02 is 48.000000000000007
    # at least 2: a one-step chunk ends when the next one is only being decoded, so every other tick would hold
    return int(np.clip(tokens // n_joints, 2, MAX_DEFAULT_HORIZON))


@dataclass(kw_only=True)
class FitDataConfig(ReaderOptions):
    """The logs a policy is fitted to, how they are read, and which of them are held out."""

    # The logs: a LeRobot dataset (each episode a unit), a folder of logs (each a unit) or one log (split by
    # time); any format `edgeinfer replay --log` reads.
    data: Path | None = None
    # The logs' format (None: detected from each path).
    log_format: Literal["schunk", "csv", "mcap", "rosbag2", "rosbag1", "lerobot"] | None = None
    # The held-out units, comma separated: episode indices ("2", "0,3") or file/run names (None: measurement
    # numbers n % 5 == 1 for Schunk runs, else the last episode or file).
    held_out: str | None = None

    def __post_init__(self):
        super().__post_init__()
        self.data = Path(self.data) if self.data is not None else None


@dataclass(eq=False)
class Unit:
    """What is wholly train or wholly held out: an episode (name: its index), a file or run (its name), or a
    part of a single log ("<name> rows a:b")."""

    name: int | str
    log: ArmLog


@dataclass
class FitData:
    """The data read and split (see the module docstring); load with load_fit_data."""

    cfg: FitDataConfig
    fmt: str
    by: Literal["episode", "file", "time"]
    rule: str
    train: list[Unit]
    held_out: list[Unit]
    # What the dataset's metadata claims against what was found (metadata_claims); None without metadata.
    claims: dict | None = None

    @property
    def warnings(self) -> list[str]:
        """Data the split did not see: the metadata's episodes or frames the files do not hold."""
        c = self.claims
        if c is None or all(c[f"{k}_claimed"] in (None, c[f"{k}_found"]) for k in ("episodes", "frames")):
            return []
        return [f"{c['where']} claims {c['episodes_claimed']} episodes / {c['frames_claimed']} frames; the data "
                f"files hold {c['episodes_found']} episodes / {c['frames_found']} frames: training on "
                f"{len(self.train)} and holding out {len(self.held_out)} of those found"]

    @property
    def units(self) -> list[Unit]:
        return self.train + self.held_out

    @property
    def rate_hz(self) -> float:
        """The units' mean sample rate, Hz (they agree within RATE_TOLERANCE)."""
        return float(np.mean([u.log.rate_hz for u in self.units]))

    @property
    def n_joints(self) -> int:
        return self.train[0].log.n_joints

    def windows(self, part: Literal["train", "held_out"], horizon: int, stride: int,
                with_units: bool = False) -> tuple[np.ndarray, ...]:
        """(features (N, 3D), offsets (N, H, D) rad) of the part's units, in unit order, each window inside one
        unit (engines/dataset.chunk_windows); with_units: also (N,) int, the index in the part of each window's
        unit. Raises ValueError when no unit of the part is long enough for one window ((horizon + 1) x stride
        + 1 rows)."""
        units = getattr(self, part)
        parts = [chunk_windows(u.log.q_rad, u.log.qd_rad_s, horizon, stride, u.log.t_s)[:2] for u in units]
        feats, offsets = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        unit_of = np.repeat(np.arange(len(units)), [len(p[0]) for p in parts])
        if not len(feats):
            raise ValueError(f"{self.cfg.data}: the {part} units {[u.name for u in units]} are too short for one "
                             f"window of {horizon} steps x {stride} ticks; choose other units, or a shorter --horizon "
                             "or --stride-ticks")
        return (feats, offsets, unit_of) if with_units else (feats, offsets)

    def manifest(self, train_windows: int, held_out_windows: int) -> dict:
        """The manifest's "data" entry: where the data came from, how it was read and split."""
        split = {"by": self.by, "rule": self.rule, "held_out_option": self.cfg.held_out,
                 "train": [u.name for u in self.train], "held_out": [u.name for u in self.held_out],
                 "train_windows": train_windows, "held_out_windows": held_out_windows}
        if self.by == "time":
            split["held_out_from_s"] = float(self.held_out[0].log.t_s[0])
        logs = [u.log for u in self.units]
        return {"source": str(self.cfg.data), "source_resolved": str(self.cfg.data.resolve()), "format": self.fmt,
                "reader_options": self.cfg.reader_options(),
                "joint_names": logs[0].joint_names, "rate_hz": round(self.rate_hz, 3),
                "qd_from_differences": any(g.qd_from_differences for g in logs),
                "q_from_integration": any(g.q_from_integration for g in logs), "split": split,
                "metadata_claims": self.claims, "warnings": self.warnings}

    def limits(self) -> dict:
        """The manifest's "limits" entry, fitted on the training units (see LIMITS_MARGIN): per joint (D,)
        q_min_rad, q_max_rad and qd_max_rad_s."""
        q = np.concatenate([u.log.q_rad for u in self.train])
        qd = np.concatenate([u.log.qd_rad_s for u in self.train])
        lo, hi = q.min(0), q.max(0)
        pad = np.maximum(Q_MARGIN * (hi - lo), Q_MARGIN_MIN_RAD)
        qd_max = np.maximum(QD_FACTOR * np.abs(qd).max(0), QD_MIN_RAD_S)
        return {"q_min_rad": (lo - pad).tolist(), "q_max_rad": (hi + pad).tolist(), "qd_max_rad_s": qd_max.tolist(),
                "source": "fitted", "margin": LIMITS_MARGIN}


def load_fit_data(cfg: FitDataConfig) -> FitData:
    """Read every unit of cfg.data and split them (see the module docstring).

    Raises LogError (a ValueError) naming the file and record for an unreadable log, or a folder with no log;
    ValueError naming the unit for joint counts or rates that differ between units, more than MAX_JOINTS
    joints, a --held-out name that matches no unit, or an empty train or held-out part.
    """
    if cfg.data is None:
        raise ValueError(f"{type(cfg).__name__}.data: no logs given")
    fmt, by, units = _read_units(cfg)
    _check_alike(units)
    claims = metadata_claims(cfg.data, units) if fmt == "lerobot" else None
    if len(units) == 1:
        return replace(_time_split(cfg, fmt, units[0]), claims=claims)
    rule, held = _held_out(cfg, by, units)
    if not held:
        raise ValueError(f"{cfg.data}: no {by} is held out by the rule {rule!r}; name some with --held-out")
    train = [u for u in units if u not in held]  # Unit compares by identity
    if not train:
        raise ValueError(f"--held-out {cfg.held_out}: every {by} of {cfg.data} is held out; nothing left to train on")
    return FitData(cfg, fmt, by, rule, train, held, claims)


def metadata_claims(root: Path, units: list[Unit]) -> dict:
    """What a LeRobot dataset's meta/info.json claims against the episodes and frames its data files hold: a
    trimmed copy keeps the full dataset's totals (reachy2_lerobot_v30 claims 14,983 frames and a train split
    0:50 while 3 episodes, 899 frames, are present). Episodes claimed: the largest of total_episodes and the
    ends of its splits ("0:50"). Returns {"where", "episodes_claimed", "frames_claimed", "episodes_found",
    "frames_found"} (a claim info.json lacks is None). Raises LogError naming the file when it is unreadable."""
    path = root / "meta" / "info.json"
    try:
        info = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise LogError(f"{path}: {e}") from None
    ends = [int(m[1]) for v in (info.get("splits") or {}).values() if (m := re.fullmatch(r"\d+:(\d+)", str(v)))]
    episodes = [int(n) for n in (info.get("total_episodes"), *ends) if isinstance(n, int)]
    frames = info.get("total_frames")
    return {"where": str(path), "episodes_claimed": max(episodes) if episodes else None,
            "frames_claimed": frames if isinstance(frames, int) else None,
            "episodes_found": len(units), "frames_found": int(sum(len(u.log) for u in units))}


def _read_units(cfg: FitDataConfig) -> tuple[str, str, list[Unit]]:
    """(format, "episode" | "file", units) of cfg.data."""
    path, options = cfg.data, cfg.reader_options()
    if path.is_dir() and not _is_log(path):
        return _read_folder(cfg)
    fmt = cfg.log_format or detect_format(path)
    if fmt == "lerobot":
        from edgeinfer.logs.lerobot_log import list_lerobot_episodes

        episodes = list_lerobot_episodes(path)
        return fmt, "episode", [Unit(e, read_log(path, fmt, episode=e, **options)) for e in episodes]
    return fmt, "file", [Unit(path.name, read_log(path, fmt, **options))]


def _read_folder(cfg: FitDataConfig) -> tuple[str, str, list[Unit]]:
    """A folder of logs: each entry that is a log (detected from its path) is a unit, in _natural order."""
    logs = sorted((p for p in cfg.data.iterdir() if _is_log(p)), key=_natural)
    if not logs:
        raise LogError(f"{cfg.data}: no log in this folder (Schunk runs, CSV, MCAP, bags, rosbag2 folders) and not "
                       "a log itself")
    for p in logs:
        if detect_format(p) == "lerobot":
            raise LogError(f"{p}: a LeRobot dataset inside a folder of logs; pass the dataset itself as --data")
    units = [Unit(p.name, read_log(p, cfg.log_format, **cfg.reader_options())) for p in logs]
    formats = sorted({u.log.source for u in units})
    return "+".join(formats), "file", units


def _is_log(p: Path) -> bool:
    """Whether `p` is a log by its layout (edgeinfer.logs.detect_format)."""
    try:
        detect_format(p)
    except LogError:
        return False
    return True


def _natural(p: Path) -> list:
    """Sort key: numbers in the name compared as numbers (measurement_2 before measurement_10)."""
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", p.name)]


def _check_alike(units: list[Unit]) -> None:
    first = units[0]
    d, rate = first.log.n_joints, first.log.rate_hz
    if d > MAX_JOINTS:
        raise ValueError(f"{first.name}: {d} joints, more than the {MAX_JOINTS} a message carries (core.wire)")
    for u in units[1:]:
        if u.log.n_joints != d or u.log.joint_names != first.log.joint_names:
            raise ValueError(f"{u.name}: joints {u.log.joint_names or u.log.n_joints} differ from {first.name}'s "
                             f"{first.log.joint_names or d}")
        if abs(u.log.rate_hz - rate) > RATE_TOLERANCE * rate:
            raise ValueError(f"{u.name}: sampled at {u.log.rate_hz:.3f} Hz, {first.name} at {rate:.3f} Hz; a "
                             "chunk step is a number of ticks, so every log must have the same rate")


def _time_split(cfg: FitDataConfig, fmt: str, unit: Unit) -> FitData:
    if cfg.held_out is not None:
        raise ValueError(f"--held-out {cfg.held_out}: {cfg.data} holds one log ({unit.name}), split by time (its "
                         f"last {HELD_OUT_FRACTION:.0%} held out); --held-out names episodes or files")
    n = len(unit.log)
    cut = round((1 - HELD_OUT_FRACTION) * n)
    parts = [Unit(f"{unit.name} rows {a}:{b}", unit.log.rows(slice(a, b))) for a, b in ((0, cut), (cut, n))]
    return FitData(cfg, fmt, "time", f"held_out = the last {HELD_OUT_FRACTION:.0%} of the rows", parts[:1],
                   parts[1:])


def _held_out(cfg: FitDataConfig, by: str, units: list[Unit]) -> tuple[str, list[Unit]]:
    """(rule, held-out units) from cfg.held_out, else the default rule."""
    if cfg.held_out is None:
        numbers = [re.fullmatch(r"measurement_(\d+)", str(u.name)) for u in units]
        if all(u.log.source == "schunk" for u in units) and all(numbers):
            return SCHUNK_RULE, [u for u, m in zip(units, numbers) if split_of(int(m[1])) == "held_out"]
        return f"held_out = the last {by} ({units[-1].name})", units[-1:]
    held = []
    for name in (s.strip() for s in cfg.held_out.split(",")):
        match = [u for u in units if name in (str(u.name), Path(str(u.name)).stem)]
        if not match:
            raise ValueError(f"--held-out {cfg.held_out}: no {by} {name!r} in {cfg.data}; its {by}s: "
                             f"{[u.name for u in units]}")
        held += [u for u in match if u not in held]
    return f"held_out = given (--held-out {cfg.held_out})", held
