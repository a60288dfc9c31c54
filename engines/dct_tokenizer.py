"""DCT action tokenizer: per-joint orthonormal DCT-II of the chunk along the horizon, one token per coefficient,
low frequency first, so that every prefix of whole coefficient rows decodes to the whole horizon.

An action chunk is H offsets q[t + (h+1) * stride] - q[t], h = 0..H-1, for D joints (rad). Per joint j the
chunk's DCT-II with orthonormal scaling (scipy.fft.dct(type=2, norm="ortho") along the horizon) gives H
coefficients c[k, j], k = 0..H-1, k = 0 the chunk's mean times sqrt(H), higher k higher frequencies. Each
coefficient is quantised into n_bins uniform bins over a range fitted per (k, j) on the training data, and the
tokens are ordered coefficient-major: c[0, 0..D-1], c[1, 0..D-1], ... (H*D tokens, fixed length, no BPE).
The idea, without the BPE stage, is Physical Intelligence's FAST tokenizer (Pertsch et al. 2025, arXiv
2501.09747).

Decoding a prefix of r whole rows (r*D tokens) returns the whole horizon (H, D): coarse after one row, refined by
each further row ("anytime" chunks, rung "coarse"). The coefficients past the prefix are completed around a prior
chunk p, in the runtime the constant-velocity chunk p[h] = (h+1) * (q - q_prev) (constant_velocity_rad, as the
kinematic drafter's): among the chunks x whose first r coefficients are the verified ones, the one that departs
least from p in acceleration, i.e. x - p = L a with L the double integration from rest at the observation
(d[h] = sum_{i<=h} (h-i+1) a[i]) and |a|^2 the least. That is the Gaussian conditional mean of x given its first
r coefficients under a prior of white acceleration around p (the discrete cubic-spline fill; Rasmussen &
Williams 2006, ch. 2 and 6), in closed form with S = L L^T and C_r the first r rows of the DCT matrix:

    x = p + M_r (c_verified - C_r p),    M_r = S C_r^T (C_r S C_r^T)^-1    (H, r), completion_gain

So the verified coefficients are kept exactly (C_r M_r = I), all H rows decode exactly as the inverse DCT (M_H =
C^T), and the fill starts from the observation with p's velocity: right where the arm acts. With p = 0 (no prior
given) it starts at rest. On the held-out Schunk runs one row of the shipped DCT policy's greedy tokens decodes to
0.26 mrad RMSE at the first step (zero fill: 27.9) and 1.39 mrad over the horizon (zero fill: 18.2; the full
chunk: 1.31); docs/anytime.md.

Reconstruction error bound, per joint j and prefix length r rows: with e the quantisation error of the kept
coefficients (|e[k, j]| <= width[k, j] / 2 for a coefficient inside its fitted range; clipped ones err by more),

    x - offsets = M_r e + (I - M_r C_r) (p - offsets)
    |x - offsets|_2 <= ||M_r||_2 sqrt(sum_{k<r} (width[k, j] / 2)^2) + |(I - M_r C_r) (offsets - p)|_2

summed over the horizon (error_bound_sq). The second term is what the prefix does not say, measured against p:
a chunk that is p plus verified low frequencies costs only the quantisation.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from scipy.fft import dct

from edgeinfer.engines.bins import bin_index, checked_range, fitted_range


@dataclass
class DctTokenizer:
    """Per (coefficient, joint) bin ranges fitted on training data.

    lo_rad, hi_rad: (H, D) float64, the range of DCT coefficient k of joint j (rad; orthonormal DCT-II of the
    chunk offsets along the horizon). n_bins: bins per coefficient; token ids are 0..n_bins-1 everywhere.
    Raises ValueError for ranges of different or non-2-D shape, hi <= lo, or n_bins < 2.
    """

    lo_rad: np.ndarray
    hi_rad: np.ndarray
    n_bins: int = 64
    kind: ClassVar[str] = "dct"
    prefix_rung: ClassVar[str] = "coarse"  # a chunk cut at a row boundary still spans the whole horizon

    def __post_init__(self):
        self.lo_rad, self.hi_rad = checked_range("DctTokenizer", self.lo_rad, self.hi_rad, self.n_bins, "(H, D)", 2)

    @classmethod
    def fit(cls, offsets_rad: np.ndarray, n_bins: int = 64, coverage: float = 0.998) -> "DctTokenizer":
        """Fit from training chunk offsets (N, H, D) rad: per (k, j) the central `coverage` quantile range of the
        coefficients, widened 10% (engines/bins.fitted_range, as ActionTokenizer.fit)."""
        return cls(*fitted_range(dct_rad(np.asarray(offsets_rad, dtype=np.float64)), coverage), n_bins)

    @property
    def horizon(self) -> int:
        return self.lo_rad.shape[0]

    @property
    def n_joints(self) -> int:
        return self.lo_rad.shape[1]

    @property
    def width_rad(self) -> np.ndarray:
        """(H, D) bin width in rad."""
        return (self.hi_rad - self.lo_rad) / self.n_bins

    def centers_rad(self, tokens: np.ndarray, coef: np.ndarray, joint: np.ndarray) -> np.ndarray:
        """Bin centre (rad) of `tokens` for coefficient indices `coef` and joints `joint` (broadcast together)."""
        return self.lo_rad[coef, joint] + (np.asarray(tokens) + 0.5) * self.width_rad[coef, joint]

    def bin_of(self, value_rad: np.ndarray, coef: np.ndarray, joint: np.ndarray) -> np.ndarray:
        """Token (int64) of coefficient values for coefficient indices `coef` and joints `joint`, clipped."""
        return bin_index(value_rad, self.lo_rad[coef, joint], self.width_rad[coef, joint], self.n_bins)

    def encode(self, offsets_rad: np.ndarray) -> np.ndarray:
        """Chunk offsets q[t+(h+1)s] - q[t], shape (..., H, D) rad -> tokens (..., H*D) int64, coefficient-major.
        Raises ValueError for another (H, D)."""
        offsets_rad = np.asarray(offsets_rad, dtype=np.float64)
        if offsets_rad.shape[-2:] != self.lo_rad.shape:
            raise ValueError(f"offsets of shape {offsets_rad.shape} do not end in (horizon, n_joints) = "
                             f"{self.lo_rad.shape}")
        k, j = np.indices(self.lo_rad.shape)
        tokens = self.bin_of(dct_rad(offsets_rad), k, j)  # (..., H, D): row k holds coefficient k of every joint
        return tokens.reshape(*tokens.shape[:-2], -1)

    def coefficients(self, tokens: np.ndarray) -> np.ndarray:
        """Tokens (..., n), n = r*D <= H*D -> coefficients (..., H, D) rad, rows r..H-1 zero.
        Raises ValueError for n not a multiple of D or above H*D."""
        tokens = np.asarray(tokens)
        n, d = tokens.shape[-1], self.n_joints
        if n % d or n > self.horizon * d:
            raise ValueError(f"token count {n} is not a multiple of n_joints={d} up to {self.horizon * d}")
        rows = n // d
        coefs = np.zeros((*tokens.shape[:-1], self.horizon, d))
        k, j = np.indices((rows, d))
        coefs[..., :rows, :] = self.centers_rad(tokens.reshape(*tokens.shape[:-1], rows, d), k, j)
        return coefs

    def decode(self, tokens: np.ndarray, prior_rad: np.ndarray | None = None) -> np.ndarray:
        """Tokens (..., n) int, n = r*D up to H*D -> offsets (..., H, D) rad from the observed q: the whole horizon,
        the coefficients past the prefix completed around prior_rad (..., H, D) rad (None: zeros) by the least
        acceleration (module docstring). Raises ValueError as coefficients, or for a prior of another (H, D)."""
        coefs = self.coefficients(tokens)
        rows = np.asarray(tokens).shape[-1] // self.n_joints
        prior = np.zeros(self.lo_rad.shape) if prior_rad is None else np.asarray(prior_rad, dtype=np.float64)
        if prior.shape[-2:] != self.lo_rad.shape:
            raise ValueError(f"prior of shape {prior.shape} does not end in (horizon, n_joints) = {self.lo_rad.shape}")
        told = coefs[..., :rows, :] - dct_rad(prior)[..., :rows, :]  # (..., r, D): what the prefix adds to the prior
        return prior + np.einsum("hr,...rd->...hd", completion_gain(self.horizon, rows), told)

    def error_bound_sq(self, rows: int, offsets_rad: np.ndarray, prior_rad: np.ndarray | None = None) -> np.ndarray:
        """The bound on the squared error summed over the horizon, per joint, of decoding the first `rows` rows of
        encode(offsets_rad) around prior_rad (module docstring; valid where every kept coefficient lies inside
        its range). offsets, prior (..., H, D) rad (prior None: zeros) -> (..., D) rad^2."""
        offsets = np.asarray(offsets_rad, dtype=np.float64)
        gain = completion_gain(self.horizon, rows)  # (H, r)
        c_r = dct_rad(np.eye(self.horizon))[:rows]  # (r, H): the first r DCT coefficients of a chunk
        miss = offsets - (0.0 if prior_rad is None else np.asarray(prior_rad, dtype=np.float64))
        untold = np.einsum("hk,...kd->...hd", np.eye(self.horizon) - gain @ c_r, miss)  # (I - M_r C_r)(x - p)
        quant = np.linalg.norm(gain, 2) * np.sqrt(((self.width_rad[:rows] / 2) ** 2).sum(0)) if rows else 0.0
        return (quant + np.sqrt((untold ** 2).sum(-2))) ** 2

    def state_dict(self) -> dict:
        return {"kind": self.kind, "lo_rad": self.lo_rad.tolist(), "hi_rad": self.hi_rad.tolist(),
                "n_bins": self.n_bins}

    @classmethod
    def from_state_dict(cls, state: dict) -> "DctTokenizer":
        return cls(np.array(state["lo_rad"]), np.array(state["hi_rad"]), int(state["n_bins"]))


def dct_rad(offsets_rad: np.ndarray) -> np.ndarray:
    """Orthonormal DCT-II along the horizon: offsets (..., H, D) -> coefficients (..., H, D), same units."""
    return dct(offsets_rad, type=2, norm="ortho", axis=-2)


def constant_velocity_rad(increment_rad: np.ndarray, horizon: int) -> np.ndarray:
    """The constant-velocity chunk of the last chunk-step increment q - q_prev (..., D) rad: offsets (..., H, D),
    offset[h] = (h+1) * increment, the prior a coarse chunk is completed around."""
    increment = np.asarray(increment_rad, dtype=np.float64)
    return np.arange(1, horizon + 1)[:, None] * increment[..., None, :]


def decode_chunk(tokenizer, tokens: np.ndarray, increment_rad: np.ndarray) -> np.ndarray:
    """Offsets (..., rows, D) rad of `tokens` for observations whose last chunk-step increment q - q_prev is
    increment_rad (..., D): a DCT tokenizer completes a prefix around the constant-velocity chunk; any other
    (step tokens, a factory's) decodes the tokens alone."""
    if isinstance(tokenizer, DctTokenizer):
        return tokenizer.decode(tokens, constant_velocity_rad(increment_rad, tokenizer.horizon))
    return tokenizer.decode(tokens)


@functools.lru_cache(maxsize=64)
def completion_gain(horizon: int, rows: int) -> np.ndarray:
    """M_r (H, r) float64, read-only: the least-acceleration completion of a chunk from its first r DCT coefficients
    (module docstring): x - p = M_r (c[:r] - dct(p)[:r]). S = L L^T, L the double integration from rest."""
    h = np.arange(horizon)
    lift = np.where(h[:, None] >= h[None, :], h[:, None] - h[None, :] + 1, 0).astype(np.float64)  # L (H, H)
    s = lift @ lift.T
    c_r = dct_rad(np.eye(horizon))[:rows]  # (r, H)
    gain = s @ c_r.T @ np.linalg.inv(c_r @ s @ c_r.T) if rows else np.zeros((horizon, 0))
    gain.flags.writeable = False
    return gain
