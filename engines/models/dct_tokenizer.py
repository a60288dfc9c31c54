"""DCT action tokenizer: per-joint orthonormal DCT-II of the chunk's departure from constant velocity along the
horizon, one token per coefficient, low frequency first, so that every prefix of whole coefficient rows decodes to
the whole horizon.

An action chunk is H offsets q[t + (h+1) * stride] - q[t], h = 0..H-1, for D joints (rad). Its prior is the
constant-velocity chunk p[h] = (h+1) * (q - q_prev) (constant_velocity_rad, the kinematic drafter's extrapolation
of the observation's last chunk-step increment). Per joint j the DCT-II with orthonormal scaling
(scipy.fft.dct(type=2, norm="ortho") along the horizon) of the departure offsets - p gives H coefficients c[k, j],
k = 0 the mean departure times sqrt(H), higher k higher frequencies. Each coefficient is quantised into n_bins
uniform bins over a range fitted per (k, j) on the training data, and the tokens are ordered coefficient-major:
c[0, 0..D-1], c[1, 0..D-1], ... (H*D tokens, fixed length, no BPE). The idea, without the BPE stage, is Physical
Intelligence's FAST tokenizer (Pertsch et al. 2025, arXiv 2501.09747); tokenizing the departure from p rather than
the offsets themselves is ours: a ramp has slowly decaying DCT coefficients, its departure from p does not, so
the fitted ranges are 3-10x narrower and the bins as much finer (held-out Schunk chunks, 128 bins: 0.048 mrad
round-trip error at the first step, against 0.27 for the offsets' own DCT and 0.10 for 64 step tokens).

Decoding a prefix of r whole rows (r*D tokens) returns the whole horizon (H, D): coarse after one row, refined by
each further row ("anytime" chunks, rung "coarse"). The coefficients past the prefix are filled by the least
acceleration: among the chunks x whose first r coefficients of x - p are the verified ones, the one whose x - p =
L a, with L the double integration from rest at the observation (d[h] = sum_{i<=h} (h-i+1) a[i]), has the least
|a|^2. That is the Gaussian conditional mean of x given its first r coefficients under a prior of white
acceleration around p (the discrete cubic-spline fill; Rasmussen & Williams 2006, ch. 2 and 6), in closed form
with S = L L^T and C_r the first r rows of the DCT matrix:

    x = p + M_r c_verified,    M_r = S C_r^T (C_r S C_r^T)^-1    (H, r), completion_gain

So the verified coefficients are kept exactly (C_r M_r = I), all H rows decode exactly as the inverse DCT (M_H =
C^T), and the fill starts from the observation with p's velocity: right where the arm acts. No row at all is p
itself, the kinematic drafter's chunk.

A manifest's tokenizer states what its coefficients are taken about ("about": "constant_velocity", the only kind
this module decodes); one that does not is refused at load (from_state_dict), naming the field.

Reconstruction error bound, per joint j and prefix length r rows: with e the quantisation error of the kept
coefficients (|e[k, j]| <= width[k, j] / 2 for a coefficient inside its fitted range; clipped ones err by more),

    x - offsets = M_r e - (I - M_r C_r) (offsets - p)
    |x - offsets|_2 <= ||M_r||_2 sqrt(sum_{k<r} (width[k, j] / 2)^2) + |(I - M_r C_r) (offsets - p)|_2

summed over the horizon (error_bound_sq). The second term is what the prefix does not say: a chunk that is p
plus verified low frequencies costs only the quantisation. docs/anytime.md has the figures per prefix length.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from edgeinfer.engines.models.bins import bin_index, checked_range, fitted_range

ABOUT = "constant_velocity"  # what the coefficients are taken about: the departure from the constant-velocity chunk


@dataclass
class DctTokenizer:
    """Per (coefficient, joint) bin ranges fitted on training data.

    lo_rad, hi_rad: (H, D) float64, the range of DCT coefficient k of joint j (rad; orthonormal DCT-II along the
    horizon of the chunk's departure from the constant-velocity chunk).
    n_bins: bins per coefficient; token ids are 0..n_bins-1 everywhere.
    Raises ValueError for ranges of different or non-2-D shape, hi <= lo, or n_bins < 2.
    """

    lo_rad: np.ndarray
    hi_rad: np.ndarray
    n_bins: int = 64
    about: ClassVar[str] = ABOUT
    kind: ClassVar[str] = "dct"
    prefix_rung: ClassVar[str] = "coarse"  # a chunk cut at a row boundary still spans the whole horizon

    def __post_init__(self):
        self.lo_rad, self.hi_rad = checked_range("DctTokenizer", self.lo_rad, self.hi_rad, self.n_bins, "(H, D)", 2)

    @classmethod
    def fit(cls, offsets_rad: np.ndarray, increment_rad: np.ndarray, n_bins: int = 64,
            coverage: float = 0.998) -> "DctTokenizer":
        """Fit from training chunk offsets (N, H, D) rad and their observations' last chunk-step increments
        q - q_prev (N, D) rad: per (k, j) the central `coverage` quantile range of the departure's coefficients,
        widened 10% (engines/bins.fitted_range, as ActionTokenizer.fit)."""
        offsets, increment = np.asarray(offsets_rad, dtype=np.float64), np.asarray(increment_rad, dtype=np.float64)
        if offsets.ndim != 3 or increment.shape != (offsets.shape[0], offsets.shape[2]):
            raise ValueError(f"DctTokenizer.fit needs offsets (N, H, D) and increments (N, D), got {offsets.shape} and "
                             f"{increment.shape}")
        departure = offsets - constant_velocity_rad(increment, offsets.shape[-2])
        return cls(*fitted_range(dct_rad(departure), coverage), n_bins)

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

    def prior_rad(self, increment_rad: np.ndarray | None, batch: tuple[int, ...] | None = None) -> np.ndarray:
        """The constant-velocity chunk (..., H, D) rad of increments q - q_prev (..., D) rad. batch: the leading
        shape the increments must have (that of the tokens or offsets they go with; None: any). Raises ValueError
        for None, increments of another D or batch, or non-finite ones."""
        if increment_rad is None:
            raise ValueError("a DCT tokenizer about constant velocity needs the observation's last chunk-step "
                             "increment q - q_prev (increment_rad) to encode or decode")
        increment = np.asarray(increment_rad, dtype=np.float64)
        if increment.shape[-1:] != (self.n_joints,) or batch is not None and increment.shape[:-1] != batch:
            want = str((*batch, self.n_joints)) if batch is not None else f"(..., {self.n_joints})"
            raise ValueError(f"increment_rad of shape {increment.shape} does not fit {want}: one (n_joints,) "
                             "increment per chunk")
        if not np.all(np.isfinite(increment)):
            raise ValueError("increment_rad must be finite")
        return constant_velocity_rad(increment, self.horizon)

    def encode(self, offsets_rad: np.ndarray, increment_rad: np.ndarray | None = None) -> np.ndarray:
        """Chunk offsets q[t+(h+1)s] - q[t], shape (..., H, D) rad, and the observations' increments q - q_prev
        (..., D) rad -> tokens (..., H*D) int64, coefficient-major. Raises ValueError for another (H, D), or as
        prior_rad."""
        offsets_rad = np.asarray(offsets_rad, dtype=np.float64)
        if offsets_rad.shape[-2:] != self.lo_rad.shape:
            raise ValueError(f"offsets of shape {offsets_rad.shape} do not end in (horizon, n_joints) = "
                             f"{self.lo_rad.shape}")
        if not np.all(np.isfinite(offsets_rad)):
            raise ValueError("offsets_rad must be finite to be encoded")
        batch = offsets_rad.shape[:-2]
        departure = offsets_rad - self.prior_rad(increment_rad, batch)
        k, j = np.indices(self.lo_rad.shape)
        tokens = self.bin_of(dct_rad(departure), k, j)  # (..., H, D): row k holds coefficient k of every joint
        return tokens.reshape(*tokens.shape[:-2], -1)

    def coefficients(self, tokens: np.ndarray) -> np.ndarray:
        """Tokens (..., n), n = r*D <= H*D -> coefficients (..., H, D) rad, rows r..H-1 zero.
        Raises ValueError for n not a multiple of D or above H*D, or tokens that are not integers in 0..n_bins-1."""
        tokens = np.asarray(tokens)
        if tokens.ndim == 0 or tokens.size and (tokens.dtype.kind not in "iu" or tokens.min() < 0
                                                 or tokens.max() >= self.n_bins):
            raise ValueError(f"tokens must be an array of integers in 0..{self.n_bins - 1}, got {tokens.dtype} "
                             f"{tokens.reshape(-1)[:8].tolist()}{'...' if tokens.size > 8 else ''}")
        n, d = tokens.shape[-1], self.n_joints
        if n % d or n > self.horizon * d:
            raise ValueError(f"token count {n} is not a multiple of n_joints={d} up to {self.horizon * d}")
        rows = n // d
        coefs = np.zeros((*tokens.shape[:-1], self.horizon, d))
        k, j = np.indices((rows, d))
        coefs[..., :rows, :] = self.centers_rad(tokens.reshape(*tokens.shape[:-1], rows, d), k, j)
        return coefs

    def decode(self, tokens: np.ndarray, increment_rad: np.ndarray | None = None) -> np.ndarray:
        """Tokens (..., n) int, n = r*D up to H*D, and the observations' increments q - q_prev (..., D) rad ->
        offsets (..., H, D) rad from the observed q: the whole horizon, the coefficients past the prefix filled by
        the least acceleration about the constant-velocity chunk (module docstring). Raises ValueError as
        coefficients and prior_rad."""
        coefs = self.coefficients(tokens)
        rows = np.asarray(tokens).shape[-1] // self.n_joints
        prior = self.prior_rad(increment_rad, np.shape(tokens)[:-1])
        told = coefs[..., :rows, :]  # (..., r, D): what the prefix says about the departure from the prior
        return prior + np.einsum("hr,...rd->...hd", completion_gain(self.horizon, rows), told)

    def error_bound_sq(self, rows: int, offsets_rad: np.ndarray, increment_rad: np.ndarray | None = None) -> np.ndarray:
        """The bound on the squared error summed over the horizon, per joint, of decoding the first `rows` rows of
        encode(offsets_rad, increment_rad) (module docstring; valid where every kept coefficient lies inside its
        range). offsets (..., H, D), increments (..., D) rad -> (..., D) rad^2."""
        offsets = np.asarray(offsets_rad, dtype=np.float64)
        if not 0 <= rows <= self.horizon:
            raise ValueError(f"rows must be in 0..{self.horizon}, got {rows}")
        gain = completion_gain(self.horizon, rows)  # (H, r)
        c_r = dct_rad(np.eye(self.horizon))[:rows]  # (r, H): the first r DCT coefficients of a chunk
        miss = offsets - self.prior_rad(increment_rad, offsets.shape[:-2])
        untold = np.einsum("hk,...kd->...hd", np.eye(self.horizon) - gain @ c_r, miss)  # (I - M_r C_r)(x - p)
        quant = np.linalg.norm(gain, 2) * np.sqrt(((self.width_rad[:rows] / 2) ** 2).sum(0)) if rows else 0.0
        return (quant + np.sqrt((untold ** 2).sum(-2))) ** 2

    def state_dict(self) -> dict:
        return {"kind": self.kind, "about": self.about, "lo_rad": self.lo_rad.tolist(), "hi_rad": self.hi_rad.tolist(),
                "n_bins": self.n_bins}

    @classmethod
    def from_state_dict(cls, state: dict) -> "DctTokenizer":
        """A manifest's "tokenizer" entry. Raises ValueError when its "about" is missing or other than
        "constant_velocity": such tokens are not the departure from constant velocity and do not decode here."""
        about = state.get("about")
        if about != ABOUT:
            found = "is missing" if about is None else f"is {about!r}"
            raise ValueError(f'DCT tokenizer field "about" {found}; only {ABOUT!r} (tokens of the departure from '
                             "constant velocity) decodes: retrain the policy with edgeinfer train --tokenizer dct "
                             "(docs/policy.md#dct-action-tokens)")
        return cls(np.array(state["lo_rad"]), np.array(state["hi_rad"]), state["n_bins"])


def dct_rad(offsets_rad: np.ndarray) -> np.ndarray:
    """Orthonormal DCT-II along the horizon: offsets (..., H, D) -> coefficients (..., H, D), same units."""
    from scipy.fft import dct  # here, not at import: every runtime imports this module, few use a DCT policy (0.2 s)

    return dct(offsets_rad, type=2, norm="ortho", axis=-2)


def constant_velocity_rad(increment_rad: np.ndarray, horizon: int) -> np.ndarray:
    """The constant-velocity chunk of the last chunk-step increment q - q_prev (..., D) rad: offsets (..., H, D),
    offset[h] = (h+1) * increment, the prior a coarse chunk is completed around."""
    increment = np.asarray(increment_rad, dtype=np.float64)
    return np.arange(1, horizon + 1)[:, None] * increment[..., None, :]


@functools.lru_cache(maxsize=64)
def completion_gain(horizon: int, rows: int) -> np.ndarray:
    """M_r (H, r) float64, read-only: the least-acceleration completion of a chunk from its first r DCT coefficients
    (module docstring): x - p = M_r c[:r], c the DCT of x - p. S = L L^T, L the double integration from rest."""
    h = np.arange(horizon)
    lift = np.where(h[:, None] >= h[None, :], h[:, None] - h[None, :] + 1, 0).astype(np.float64)  # L (H, H)
    s = lift @ lift.T
    c_r = dct_rad(np.eye(horizon))[:rows]  # (r, H)
    gain = s @ c_r.T @ np.linalg.inv(c_r @ s @ c_r.T) if rows else np.zeros((horizon, 0))
    gain.flags.writeable = False
    return gain
