"""Uniform bins over a range fitted on training data: what the step and the DCT action tokenizers share
(engines/tokenizer.py, engines/dct_tokenizer.py). Ranges are arrays of any shape (per joint, or per
coefficient and joint); a value's bin is clipped into 0..n_bins-1."""
from __future__ import annotations

import numpy as np


def fitted_range(values: np.ndarray, coverage: float) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) over axis 0 of values (N, ...): the central `coverage` quantile range, widened by 10% of it (and
    1e-6) on each side, so that held-out data a little past the training data still falls inside."""
    lo, hi = np.quantile(values, [(1 - coverage) / 2, (1 + coverage) / 2], axis=0)
    pad = 0.1 * (hi - lo) + 1e-6
    return lo - pad, hi + pad


def checked_range(owner: str, lo, hi, n_bins: int, shape: str, ndim: int) -> tuple[np.ndarray, np.ndarray]:
    """lo, hi as float64 arrays of equal shape with ndim axes (shape: its name in messages, e.g. "(D,)"), hi > lo
    everywhere, n_bins >= 2; raises ValueError naming `owner` and the field otherwise."""
    lo, hi = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
    if lo.shape != hi.shape or lo.ndim != ndim:
        raise ValueError(f"{owner} lo_rad/hi_rad must be {shape} of equal shape, got {lo.shape}, {hi.shape}")
    if not np.all(hi > lo):
        raise ValueError(f"{owner} hi_rad must exceed lo_rad everywhere")
    if n_bins < 2:
        raise ValueError(f"{owner} n_bins must be >= 2, got {n_bins}")
    return lo, hi


def bin_index(value: np.ndarray, lo: np.ndarray, width: np.ndarray, n_bins: int) -> np.ndarray:
    """The bin (int64) of value in bins of `width` from `lo` (broadcast together), clipped into 0..n_bins-1."""
    return np.clip(np.floor((value - lo) / width), 0, n_bins - 1).astype(np.int64)
