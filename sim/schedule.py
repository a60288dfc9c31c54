"""Where each recorded sample falls on the control loop's tick grid.

The control loop ticks at a fixed period (the log's median sample period). Sample i of a log is sent at
tick k_i = round(t_s[i] / period); a dropped sample leaves a tick without an observation, as a dropped
sensor packet would, instead of shifting every later observation off its tick.
"""
from __future__ import annotations

import numpy as np
from edgeinfer.sim.logs import ArmLog, LogError


def tick_grid(log: ArmLog, tolerance: float = 0.25) -> np.ndarray:
    """(N,) int64 tick index of every sample. Raises LogError naming the row when a sample lies more than
    `tolerance` periods off the grid or two samples share a tick."""
    period_s = log.period_ns / 1e9
    ticks = np.round(log.t_s / period_s).astype(np.int64)
    off = np.abs(log.t_s - ticks * period_s) / period_s
    bad = np.flatnonzero((off > tolerance) | np.r_[False, np.diff(ticks) < 1])
    if len(bad):
        i = int(bad[0])
        raise LogError(f"{log.name}: time.csv line {i + 1}: t = {float(log.t_s[i]):.6f} s is not on the log's "
                       f"{log.rate_hz:.1f} Hz tick grid (off by {float(off[i]):.2f} periods, or a repeated tick)")
    return ticks


def previous_rows(ticks: np.ndarray, stride: int) -> np.ndarray:
    """(N,) row index of the newest sample at or before tick k_i - stride (row 0 when there is none)."""
    return np.maximum(np.searchsorted(ticks, ticks - stride, side="right") - 1, 0)
