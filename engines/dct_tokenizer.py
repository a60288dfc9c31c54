"""DCT action tokenizer: per-joint orthonormal DCT-II of the chunk along the horizon, one token per coefficient,
low frequency first, so that every prefix of whole coefficient rows decodes to the whole horizon.

An action chunk is H offsets q[t + (h+1) * stride] - q[t], h = 0..H-1, for D joints (rad). Per joint j the
chunk's DCT-II with orthonormal scaling (scipy.fft.dct(type=2, norm="ortho") along the horizon) gives H
coefficients c[k, j], k = 0..H-1, k = 0 the chunk's mean times sqrt(H), higher k higher frequencies. Each
coefficient is quantised into n_bins uniform bins over a range fitted per (k, j) on the training data, and the
tokens are ordered coefficient-major: c[0, 0..D-1], c[1, 0..D-1], ... (H*D tokens, fixed length, no BPE).
The idea, without the BPE stage, is Physical Intelligence's FAST tokenizer (Pertsch et al. 2025, arXiv
2501.09747).

Decoding a prefix of r whole rows (r*D tokens) sets coefficients r..H-1 to zero and inverts the DCT: the
whole horizon (H, D), coarse after one row and refined by each further row ("anytime" chunks, rung "coarse").

Reconstruction error bound, per joint j and prefix length r rows: the DCT is orthonormal (Parseval), so

    sum_h (decoded[h, j] - offsets[h, j])^2 = sum_{k<r} e[k, j]^2 + sum_{k>=r} c[k, j]^2

where e[k, j] is the quantisation error of a kept coefficient, |e[k, j]| <= width[k, j] / 2 for a coefficient
inside its fitted range (clipped ones err by more). The dropped coefficients are the price of the prefix; the
kept ones cost at most sum_{k<r} (width[k, j] / 2)^2 (see error_bound_sq). Measured on the held-out Schunk runs:
docs/policy.md "DCT action tokens".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from scipy.fft import dct, idct

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

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        """Tokens (..., n) int, n a multiple of D up to H*D -> offsets (..., H, D) rad from the observed q: the whole
        horizon, the coefficients past the prefix zero. Raises ValueError as coefficients."""
        return idct(self.coefficients(tokens), type=2, norm="ortho", axis=-2)

    def error_bound_sq(self, rows: int, offsets_rad: np.ndarray) -> np.ndarray:
        """The bound on the squared error summed over the horizon, per joint, of decoding the first `rows` rows of
        encode(offsets_rad): the dropped coefficients' energy plus (width/2)^2 per kept one (valid where every
        kept coefficient lies inside its range). offsets (..., H, D) -> (..., D) rad^2."""
        coefs = dct_rad(np.asarray(offsets_rad, dtype=np.float64))
        return (coefs[..., rows:, :] ** 2).sum(-2) + ((self.width_rad[:rows] / 2) ** 2).sum(0)

    def state_dict(self) -> dict:
        return {"kind": self.kind, "lo_rad": self.lo_rad.tolist(), "hi_rad": self.hi_rad.tolist(),
                "n_bins": self.n_bins}

    @classmethod
    def from_state_dict(cls, state: dict) -> "DctTokenizer":
        return cls(np.array(state["lo_rad"]), np.array(state["hi_rad"]), int(state["n_bins"]))


def dct_rad(offsets_rad: np.ndarray) -> np.ndarray:
    """Orthonormal DCT-II along the horizon: offsets (..., H, D) -> coefficients (..., H, D), same units."""
    return dct(offsets_rad, type=2, norm="ortho", axis=-2)
