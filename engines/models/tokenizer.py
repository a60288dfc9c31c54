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
from typing import ClassVar

import numpy as np

from edgeinfer.engines.models.bins import bin_index, checked_range, fitted_range
from edgeinfer.engines.models.dct_tokenizer import DctTokenizer


@dataclass
class ActionTokenizer:
    """Per-joint bin edges fitted on training data.

    lo_rad, hi_rad: (D,) float64, the increment range per joint (rad per chunk step).
    n_bins: bins per joint; token ids are 0..n_bins-1 for every joint.
    """

    lo_rad: np.ndarray
    hi_rad: np.ndarray
    n_bins: int = 64
    kind: ClassVar[str] = "step"
    prefix_rung: ClassVar[str] = "partial"  # a chunk cut at a row boundary covers the verified steps only

    def __post_init__(self):
        self.lo_rad, self.hi_rad = checked_range("ActionTokenizer", self.lo_rad, self.hi_rad, self.n_bins, "(D,)", 1)

    @classmethod
    def fit(cls, increments_rad: np.ndarray, n_bins: int = 64, coverage: float = 0.998) -> "ActionTokenizer":
        """Fit bin ranges from training increments (N, D) rad: the central `coverage` quantile range, widened 10%
        (engines/bins.fitted_range)."""
        return cls(*fitted_range(increments_rad, coverage), n_bins)

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
        return bin_index(increment_rad, self.lo_rad[joint], self.width_rad[joint], self.n_bins)

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
        return cls(np.array(state["lo_rad"]), np.array(state["hi_rad"]), state["n_bins"])


def decode_chunk(tokenizer, tokens: np.ndarray, increment_rad: np.ndarray) -> np.ndarray:
    """Offsets (..., rows, D) rad of `tokens` (..., n) for observations whose last chunk-step increment q - q_prev
    is increment_rad (..., D): a DCT tokenizer decodes about the constant-velocity chunk; any other (step tokens,
    a factory's) decodes the tokens alone. Every decode of a policy's tokens goes through here."""
    if isinstance(tokenizer, DctTokenizer):
        return tokenizer.decode(tokens, increment_rad)
    return tokenizer.decode(tokens)


def encode_chunk(tokenizer, offsets_rad: np.ndarray, increment_rad: np.ndarray) -> np.ndarray:
    """Tokens (..., n) int64 of chunk offsets (..., H, D) rad for observations with increments (..., D) rad, as
    decode_chunk: a DCT tokenizer encodes the departure from constant velocity, any other the offsets alone."""
    if isinstance(tokenizer, DctTokenizer):
        return tokenizer.encode(offsets_rad, increment_rad)
    return tokenizer.encode(offsets_rad)


def action_rmse_rad(tokenizer, tokens: np.ndarray, increment_rad: np.ndarray, offsets_rad: np.ndarray) -> float:
    """RMSE (rad) of full chunks' tokens (N, H*D) against the recorded offsets (N, H, D) rad, for observations
    with increments q - q_prev (N, D) rad (engines/policy.feature_increment of raw features), via decode_chunk."""
    return float(np.sqrt(np.mean((decode_chunk(tokenizer, tokens, increment_rad) - offsets_rad) ** 2)))


def tokenizer_from_state(state: dict) -> "ActionTokenizer | DctTokenizer":
    """The tokenizer a manifest's "tokenizer" entry describes, by its "kind" (TOKENIZERS): "step" (ActionTokenizer;
    the default, as the shipped step manifests have no "kind") or "dct" (engines/dct_tokenizer.DctTokenizer).
    Raises ValueError naming an unknown kind."""
    if not isinstance(state, dict):
        raise ValueError(f"tokenizer must be an object with lo_rad, hi_rad and n_bins, got {type(state).__name__}")
    kind = state.get("kind", "step")
    if kind not in TOKENIZERS:
        raise ValueError(f"tokenizer kind {kind!r} is unknown; known: {sorted(TOKENIZERS)}")
    return TOKENIZERS[kind].from_state_dict(state)


TOKENIZERS = {"step": ActionTokenizer, "dct": DctTokenizer}
