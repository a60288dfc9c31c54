"""The built-in policy's raw observation features, without torch (the data loaders and training's config use them)."""
from __future__ import annotations

import numpy as np


def observation_features(q_rad: np.ndarray, qd_rad_s: np.ndarray, q_prev_rad: np.ndarray) -> np.ndarray:
    """Raw features (..., 3D) float64: q (rad), qd (rad/s), and the last chunk-step increment q - q_prev (rad)."""
    return np.concatenate([q_rad, qd_rad_s, q_rad - q_prev_rad], axis=-1)


def feature_increment(features: np.ndarray) -> np.ndarray:
    """The last chunk-step increment q - q_prev (..., D) rad of raw features (..., 3D) (observation_features): what
    a DCT tokenizer takes its coefficients about (engines/models/dct_tokenizer.py)."""
    d = features.shape[-1] // 3
    return features[..., 2 * d:3 * d]
