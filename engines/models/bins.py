"""Uniform bins over a range fitted on training data: what the step and the DCT action tokenizers share
(engines/models/tokenizer.py, engines/models/dct_tokenizer.py). Ranges are arrays of any shape (per joint, or per
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
    """lo, hi as float64 arrays of equal shape with ndim axes (shape: its name in messages, e.g. "(D,)"), finite,
    hi > lo everywhere with a finite bin width, n_bins an integer >= 2; raises ValueError naming `owner`, the field
    and the first bad element otherwise."""
    lo, hi = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
    if lo.shape != hi.shape or lo.ndim != ndim:
        raise ValueError(f"{owner} lo_rad/hi_rad must be {shape} of equal shape, got {lo.shape}, {hi.shape}")
    with np.errstate(over="ignore", invalid="ignore"):  # an overflowing width is refused below, not warned about
        width = hi - lo
    for name, v in (("lo_rad", lo), ("hi_rad", hi), ("hi_rad - lo_rad", width)):
        if not np.all(np.isfinite(v)):
            at = tuple(int(i) for i in np.argwhere(~np.isfinite(v))[0])
            raise ValueError(f"{owner} {name} must be finite, got {v[at]} at {at}")
    if not np.all(hi > lo):
        at = tuple(int(i) for i in np.argwhere(~(hi > lo))[0])
        raise ValueError(f"{owner} hi_rad must exceed lo_rad everywhere, got {hi[at]} <= {lo[at]} at {at}")
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 2:
        raise ValueError(f"{owner} n_bins must be an integer >= 2, got {n_bins!r}")
    return lo, hi


def bin_index(value: np.ndarray, lo: np.ndarray, width: np.ndarray, n_bins: int) -> np.ndarray:
    """The bin (int64) of value in bins of `width` from `lo` (broadcast together), clipped into 0..n_bins-1."""
    return np.clip(np.floor((value - lo) / width), 0, n_bins - 1).astype(np.int64)
