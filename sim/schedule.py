"""Where each recorded sample falls on the control loop's tick grid.

The control loop ticks at a fixed period (the log's median sample period). Sample i of a log is sent at
tick k_i = round(t_s[i] / period); a dropped sample leaves a tick without an observation, as a dropped
sensor packet would, instead of shifting every later observation off its tick.
"""
from __future__ import annotations

import numpy as np

from edgeinfer.core.wire import Observation, pack_channels
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


# A step of more than this many periods between consecutive samples is a gap in the log (one dropped sample is
# a step of 2). The replay treats a gap as dropped samples: its ticks stay empty, later samples keep their ticks.
GAP_PERIODS = 3


def gap_report(ticks: np.ndarray, period_ns: int, min_periods: int = GAP_PERIODS) -> dict:
    """The log's gaps: steps of more than `min_periods` ticks between consecutive samples. ticks: (N,) int64
    (tick_grid); period_ns: the log's period. Returns {"count", "empty_ticks" (inside those gaps), "longest_s"
    (the longest step, log time), "rows" (the first 10 rows after a gap), "min_periods"}."""
    steps = np.diff(np.asarray(ticks, dtype=np.int64))
    at = np.flatnonzero(steps > min_periods)
    return {"count": int(at.size), "empty_ticks": int(np.sum(steps[at] - 1)),
            "longest_s": float(steps[at].max()) * period_ns / 1e9 if at.size else 0.0,
            "rows": (at + 1)[:10].tolist(), "min_periods": min_periods}


def shorten_gaps(ticks: np.ndarray, max_gap_ticks: int) -> tuple[np.ndarray, dict]:
    """ticks (N,) int64 (tick_grid) with every step longer than max_gap_ticks (>= 1) cut to max_gap_ticks: the
    samples after a long gap keep their order and spacing, max_gap_ticks after the one before it. Returns (the new
    ticks, {"count": gaps cut, "ticks_removed": ticks taken out in all, "rows": the first 10 rows after a cut gap}),
    so that a log with hours between two sessions replays in seconds."""
    ticks = np.asarray(ticks, dtype=np.int64)
    excess = np.maximum(np.diff(ticks) - max_gap_ticks, 0)
    at = np.flatnonzero(excess)
    out = ticks - np.r_[0, np.cumsum(excess)]
    return out, {"count": int(at.size), "ticks_removed": int(excess.sum()), "rows": (at + 1)[:10].tolist()}


def replay_ticks(log: ArmLog, max_gap_s: float) -> tuple[np.ndarray, dict]:
    """The ticks a run sends the log's rows on: tick_grid, its gaps longer than max_gap_s shortened to it
    (shorten_gaps; the dict adds "max_gap_s"). Raises LogError as tick_grid."""
    ticks, shortened = shorten_gaps(tick_grid(log), max(1, round(max_gap_s * 1e9 / log.period_ns)))
    return ticks, {**shortened, "max_gap_s": max_gap_s}


def previous_rows(ticks: np.ndarray, stride: int) -> np.ndarray:
    """(N,) row index of the newest sample at or before tick k_i - stride (row 0 when there is none)."""
    return np.maximum(np.searchsorted(ticks, ticks - stride, side="right") - 1, 0)


def observation(log: ArmLog, ticks: np.ndarray, prev: np.ndarray, i: int, t_ns: int) -> Observation:
    """The Observation of log row i: seq = its tick, t_ns = when it is due (ns, replayer clock), q/qd (D,)
    float64, q_prev = the row `stride` ticks earlier (see previous_rows), the row's extra channels (extra_of)."""
    return Observation(int(ticks[i]), int(t_ns), log.q_rad[i], log.qd_rad_s[i], log.q_rad[prev[i]], *extra_of(log, i))


def extra_of(log: ArmLog, i: int) -> tuple[np.ndarray | None, str]:
    """(Observation.extra, Observation.extra_layout) of log row i: its extra channels in the log's order;
    (None, "") for a log without them."""
    return pack_channels({name: v[i] for name, v in log.extra.items()})


def observation_stream(log: ArmLog, stride: int, t0_ns: int = 0, period_ns: int | None = None) -> list[Observation]:
    """Every Observation the replayer sends for `log` (in order), row i due at t0_ns + tick_i * period_ns
    (default the log's period). The same stream from any reader means the same replay."""
    ticks = tick_grid(log)
    prev = previous_rows(ticks, stride)
    period = log.period_ns if period_ns is None else period_ns
    return [observation(log, ticks, prev, i, t0_ns + int(ticks[i]) * period) for i in range(len(log))]
