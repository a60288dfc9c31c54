"""Action tokenizer: per-joint uniform bins over chunk-step increments, with error feedback.

An action chunk is H future joint-position targets q[t + (h+1) * stride], h = 0..H-1, for D joints.
Each (step, joint) becomes one token in 0..n_bins-1, ordered step-major (h0 j0..jD-1, h1 j0, ...).

A token encodes the *increment* from the previously decoded step, not the absolute offset, because
increments of smooth arm motion have the same spread at every horizon (absolute offsets grow with h and
would waste bins on the short horizons). Quantising increments independently would let the rounding
error random-walk along the chunk, so encoding uses error feedback (sigma-delta): each token quantises
the remaining error `target_offset[h] - decoded_offset[h-1]`. Decoding is then a plain cumulative sum of
bin centres, and the decoded chunk stays within half a bin of the target at every step (inside the range).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class ActionTokenizer:
    """Per-joint bin edges fitted on training data.

    lo_rad, hi_rad: (D,) float64, the increment range per joint (rad per chunk step).
    n_bins: bins per joint; token ids are 0..n_bins-1 for every joint.
    """

    lo_rad: np.ndarray
    hi_rad: np.ndarray
    n_bins: int = 64

    def __post_init__(self):
        self.lo_rad = np.asarray(self.lo_rad, dtype=np.float64)
        self.hi_rad = np.asarray(self.hi_rad, dtype=np.float64)
        if self.lo_rad.shape != self.hi_rad.shape or self.lo_rad.ndim != 1:
            raise ValueError(f"lo_rad/hi_rad must be (D,) of equal shape, got {self.lo_rad.shape}, {self.hi_rad.shape}")
        if not np.all(self.hi_rad > self.lo_rad):
            raise ValueError("hi_rad must exceed lo_rad for every joint")
        if self.n_bins < 2:
            raise ValueError(f"n_bins must be >= 2, got {self.n_bins}")

    @classmethod
    def fit(cls, increments_rad: np.ndarray, n_bins: int = 64, coverage: float = 0.998) -> "ActionTokenizer":
        """Fit bin ranges from training increments (N, D) rad: the central `coverage` quantile range, widened 10%."""
        lo, hi = np.quantile(increments_rad, [(1 - coverage) / 2, (1 + coverage) / 2], axis=0)
        pad = 0.1 * (hi - lo) + 1e-6
        return cls(lo - pad, hi + pad, n_bins)

    @property
    def n_joints(self) -> int:
        return len(self.lo_rad)

    @property
    def width_rad(self) -> np.ndarray:
        """(D,) bin width in rad."""
        return (self.hi_rad - self.lo_rad) / self.n_bins

    def centers_rad(self, tokens: np.ndarray, joint: np.ndarray) -> np.ndarray:
        """Bin centre (rad) of `tokens` for joint indices `joint` (broadcast together)."""
        return self.lo_rad[joint] + (np.asarray(tokens) + 0.5) * self.width_rad[joint]

    def bin_of(self, increment_rad: np.ndarray, joint: np.ndarray) -> np.ndarray:
        """Token (int64) of an increment for joint indices `joint`, clipped into range."""
        idx = np.floor((increment_rad - self.lo_rad[joint]) / self.width_rad[joint])
        return np.clip(idx, 0, self.n_bins - 1).astype(np.int64)

    def encode(self, offsets_rad: np.ndarray) -> np.ndarray:
        """Chunk offsets q[t+(h+1)s] - q[t], shape (..., H, D) rad -> tokens (..., H*D) int64."""
        offsets_rad = np.asarray(offsets_rad, dtype=np.float64)
        *batch, horizon, d = offsets_rad.shape
        joints = np.arange(d)
        decoded = np.zeros((*batch, d))
        tokens = np.empty((*batch, horizon, d), dtype=np.int64)
        for h in range(horizon):
            tok = self.bin_of(offsets_rad[..., h, :] - decoded, joints)
            tokens[..., h, :] = tok
            decoded = decoded + self.centers_rad(tok, joints)
        return tokens.reshape(*batch, horizon * d)

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        """Tokens (..., n) int with n a multiple of D -> offsets (..., n // D, D) rad from the observed q."""
        tokens = np.asarray(tokens)
        d = self.n_joints
        if tokens.shape[-1] % d:
            raise ValueError(f"token count {tokens.shape[-1]} is not a multiple of n_joints={d}")
        steps = tokens.reshape(*tokens.shape[:-1], -1, d)
        return np.cumsum(self.centers_rad(steps, np.arange(d)), axis=-2)

    def state_dict(self) -> dict:
        return {"lo_rad": self.lo_rad.tolist(), "hi_rad": self.hi_rad.tolist(), "n_bins": self.n_bins}

    @classmethod
    def from_state_dict(cls, state: dict) -> "ActionTokenizer":
        return cls(np.array(state["lo_rad"]), np.array(state["hi_rad"]), int(state["n_bins"]))
