"""Real observations for engine parity and FP8 calibration: windows of the Schunk LWA 4P runs.

Parity and quality gates read the held-out runs (edgeinfer.logs.arm_log.HELD_OUT); calibration reads the
training runs, so that no figure is measured on the data its scales were fitted to. Data directory, first
that is set: the `data_dir` argument, $EDGEINFER_DATA_DIR, then ../shared/data/schunk_lwa4p next to the
repository. Without the runs of a split, the embedded synthetic log stands in and a warning says so:
numbers measured on it are not real-data numbers (`require_real` turns that into an error).
"""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import numpy as np

from edgeinfer.engines.training.dataset import chunk_windows
from edgeinfer.logs.arm_log import LogError, list_schunk_runs, read_schunk, split_of, synthetic_log

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "schunk_lwa4p"
DATA_DIR_ENV = "EDGEINFER_DATA_DIR"
_SYNTHETIC_SECONDS = 30.0


def resolve_data_dir(explicit: str | Path | None = None) -> Path:
    """The Schunk data directory: `explicit`, else $EDGEINFER_DATA_DIR, else DEFAULT_DATA_DIR."""
    if explicit is not None:
        return Path(explicit)
    env = os.environ.get(DATA_DIR_ENV)
    return Path(env) if env else DEFAULT_DATA_DIR


def _read_runs(root: Path, split: str) -> dict:
    """measurement number -> ArmLog for every readable run of `split` ("train" | "held_out") under root."""
    logs = {}
    if root.is_dir():
        for n, path in list_schunk_runs(root).items():
            if split_of(n) != split:
                continue
            try:
                logs[n] = read_schunk(path)
            except LogError as e:  # a damaged copy of one run should not stop the others
                print(f"WARNING: skipping {path}: {e}", file=sys.stderr)
    return logs


@functools.lru_cache(maxsize=8)
def _windows(root: str, horizon: int, stride: int, split: str) -> tuple[np.ndarray, np.ndarray, str]:
    logs = _read_runs(Path(root), split)
    if logs:
        parts = [chunk_windows(log.q_rad, log.qd_rad_s, horizon, stride, log.t_s)[:2] for log in logs.values()]
        feats, offsets = np.concatenate([f for f, _ in parts]), np.concatenate([o for _, o in parts])
        source = f"real: {len(logs)} {split} Schunk runs under {root} (measurements {sorted(logs)})"
    else:
        print(f"WARNING: no {split} Schunk runs under {root} (set {DATA_DIR_ENV}); using the synthetic "
              "minimum-jerk log instead: these figures are NOT on real data", file=sys.stderr)
        log = synthetic_log(seconds=_SYNTHETIC_SECONDS)
        feats, offsets, _ = chunk_windows(log.q_rad, log.qd_rad_s, horizon, stride, log.t_s)
        source = f"synthetic: {log.name}, {_SYNTHETIC_SECONDS:.0f} s (no real data under {root})"
    feats.flags.writeable = offsets.flags.writeable = False  # cached: shared by every caller
    return feats, offsets, source


def held_out_windows(policy, data_dir: str | Path | None = None, split: str = "held_out",
                     require_real: bool = False) -> tuple[np.ndarray, np.ndarray, str]:
    """All windows of the runs of `split`: (raw features (N, obs_dim) float64, recorded future offsets
    (N, H, D) rad, a one-line description of the source). Read-only arrays, cached per directory.
    Raises FileNotFoundError naming the directory when require_real and no such run is there."""
    cfg = policy.cfg
    root = resolve_data_dir(data_dir)
    if require_real and not (root.is_dir() and any(split_of(n) == split for n in list_schunk_runs(root))):
        raise FileNotFoundError(f"no {split} Schunk runs (measurement_N folders) under {root}")
    feats, offsets, source = _windows(str(root), cfg.horizon, cfg.stride_ticks, split)
    return feats, offsets, source


def sample_windows(policy, n: int, seed: int, data_dir: str | Path | None = None, split: str = "held_out",
                   require_real: bool = False):
    """n windows drawn at random (without replacement while there are enough): (raw features (n, obs_dim),
    offsets (n, H, D) rad, source)."""
    feats, offsets, source = held_out_windows(policy, data_dir, split, require_real)
    idx = np.random.default_rng(seed).choice(len(feats), n, replace=n > len(feats))
    return feats[idx], offsets[idx], source


def calibration_features(policy, data_dir: str | Path | None = None, n: int = 512, seed: int = 0) -> np.ndarray:
    """n normalised observations (n, obs_dim) float32 from the training runs, for activation calibration.

    Falls back to the synthetic log (with a printed warning) when no training run is found.
    """
    feats, _, _ = sample_windows(policy, n, seed, data_dir, split="train")
    return policy.normalise(feats)
