"""Training windows from arm logs: observation features at tick t and the recorded future chunk.

For a log with positions q (T, D) and chunk stride s ticks, horizon H, every t with s <= t < T - H*s gives
    features  = observation_features(q[t], qd[t], q[t - s])        (3D,)
    offsets   = q[t + (h+1) s] - q[t],  h = 0..H-1                   (H, D) rad
(windows across a gap in the log left out, given the records' times).
"""
from __future__ import annotations

import numpy as np

from edgeinfer.engines.models.features import observation_features
from edgeinfer.logs.samples import find_gaps


def chunk_windows(q_rad: np.ndarray, qd_rad_s: np.ndarray, horizon: int, stride: int,
                  t_s: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (features (N, 3D), offsets (N, H, D), t_index (N,)) for one log; N may be 0.

    t_s: (T,) s, the records' times. When given, a window whose span (t - stride .. t + horizon * stride) crosses a
    gap in the log (edgeinfer.logs.samples.find_gaps) is left out: its target would be a jump across time with no
    samples (hours, in a real export), which no robot makes and the tokenizer's bins must not be fitted on."""
    n = len(q_rad)
    t = np.arange(stride, n - horizon * stride)
    if t_s is not None and len(t) and (gaps := find_gaps(np.asarray(t_s, dtype=np.float64))).size:
        segment = np.cumsum(np.isin(np.arange(n), gaps))  # the segment of each record
        t = t[segment[t - stride] == segment[t + horizon * stride]]
    if len(t) == 0:
        d = q_rad.shape[1]
        return np.zeros((0, 3 * d)), np.zeros((0, horizon, d)), t
    feats = observation_features(q_rad[t], qd_rad_s[t], q_rad[t - stride])
    future = t[:, None] + stride * np.arange(1, horizon + 1)[None, :]  # (N, H)
    offsets = q_rad[future] - q_rad[t][:, None, :]
    return feats, offsets, t


def step_increments(offsets_rad: np.ndarray) -> np.ndarray:
    """(N, H, D) chunk offsets -> (N*H, D) per-step increments, for fitting tokenizer bins."""
    first = offsets_rad[:, :1]
    inc = np.concatenate([first, np.diff(offsets_rad, axis=1)], axis=1)
    return inc.reshape(-1, offsets_rad.shape[-1])
