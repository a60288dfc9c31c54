"""Where each recorded sample falls on the control loop's tick grid.

The control loop ticks at a fixed period (the log's median sample period). Sample i of a log is sent at
tick k_i = round(t_s[i] / period); a dropped sample leaves a tick without an observation, as a dropped
sensor packet would, instead of shifting every later observation off its tick.
"""
from __future__ import annotations

import numpy as np

from edgeinfer.core.wire import Observation
from edgeinfer.logs.arm_log import ArmLog, LogError


def tick_grid(log: ArmLog, tolerance: float = 0.25) -> np.ndarray:
    """(N,) int64 tick index of every sample. Raises LogError naming the row when a sample lies more than
    `tolerance` periods off the grid or two samples share a tick."""
    period_s = log.period_ns / 1e9
    ticks = np.round(log.t_s / period_s).astype(np.int64)
    off = np.abs(log.t_s - ticks * period_s) / period_s
    bad = np.flatnonzero((off > tolerance) | np.r_[False, np.diff(ticks) < 1])
    if len(bad):
        i = int(bad[0])
        where = f"time.csv line {i + 1}" if log.source == "schunk" else f"record {i} (in time order)"
        raise LogError(f"{log.name}: {where}: t = {float(log.t_s[i]):.6f} s is not on the log's "
                       f"{log.rate_hz:.1f} Hz tick grid (off by {float(off[i]):.2f} periods, or a repeated tick)")
    return ticks


def previous_rows(ticks: np.ndarray, stride: int) -> np.ndarray:
    """(N,) row index of the newest sample at or before tick k_i - stride (row 0 when there is none)."""
    return np.maximum(np.searchsorted(ticks, ticks - stride, side="right") - 1, 0)


def observation(log: ArmLog, ticks: np.ndarray, prev: np.ndarray, i: int, t_ns: int) -> Observation:
    """The Observation of log row i: seq = its tick, t_ns = when it is due (ns, replayer clock), q/qd (D,)
    float64, q_prev = the row `stride` ticks earlier (see previous_rows)."""
    return Observation(int(ticks[i]), int(t_ns), log.q_rad[i], log.qd_rad_s[i], log.q_rad[prev[i]])


def observation_stream(log: ArmLog, stride: int, t0_ns: int = 0, period_ns: int | None = None) -> list[Observation]:
    """Every Observation the replayer sends for `log` (in order), row i due at t0_ns + tick_i * period_ns
    (default the log's period). The same stream from any reader means the same replay."""
    ticks = tick_grid(log)
    prev = previous_rows(ticks, stride)
    period = log.period_ns if period_ns is None else period_ns
    return [observation(log, ticks, prev, i, t0_ns + int(ticks[i]) * period) for i in range(len(log))]
