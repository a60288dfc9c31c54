"""The policy bundle: target model + tokenizer + observation normalisation, saved without pickle.

Weights are a torch state dict loaded with `torch.load(weights_only=True)`; everything else (config,
tokenizer bins, normalisation, data split, metrics) lives in a JSON manifest next to them, with the
sha256 of the weights file checked on load.

A manifest with a "factory" key describes a bring-your-own autoregressive policy instead (engines/models/factory.py);
engines/models/served.py loads either kind for the runtime.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from edgeinfer.core.config import load
from edgeinfer.engines.models.dct_tokenizer import DctTokenizer
from edgeinfer.engines.models.features import feature_increment, observation_features  # noqa: F401  (re-exported)
from edgeinfer.engines.models.model import ActionTransformer, PolicyConfig
from edgeinfer.engines.models.paths import DEFAULT_POLICY, read_manifest
from edgeinfer.engines.models.tokenizer import ActionTokenizer, tokenizer_from_state
from edgeinfer.engines.models.weights_io import MAX_WEIGHTS_MB, inside, load_state_dict


@dataclass(frozen=True)
class Normaliser:
    """The built-in policy's featurizer: observation_features, minus mean, over std ((3D,) float64 each, fitted on
    the training windows). Call it with (q_rad, qd_rad_s, q_prev_rad) (..., D) -> (..., 3D) float32; a factory
    policy may return one as its features (engines/models/factory.py)."""

    mean: np.ndarray
    std: np.ndarray

    def normalise(self, feats: np.ndarray) -> np.ndarray:
        """Model input (..., 3D) float32 from raw features (..., 3D) (see observation_features)."""
        return ((feats - self.mean) / self.std).astype(np.float32)

    def __call__(self, q_rad, qd_rad_s, q_prev_rad) -> np.ndarray:
        return self.normalise(observation_features(q_rad, qd_rad_s, q_prev_rad))


@dataclass
class Policy:
    """A trained action-token policy. `model` is the target; decode with edgeinfer.core.speculative."""

    model: ActionTransformer
    tokenizer: ActionTokenizer | DctTokenizer  # by the manifest's tokenizer "kind" (tokenizer_from_state)
    feat_mean: np.ndarray  # (obs_dim,)
    feat_std: np.ndarray  # (obs_dim,)
    manifest: dict
    path: Path | None = None  # the manifest's file (load_policy): where its learned drafter is looked for
    drafters: ClassVar[tuple[str, ...]] = ("kinematic", "early-exit", "learned")  # those that apply (drafters.py)

    @property
    def cfg(self) -> PolicyConfig:
        return self.model.cfg

    def normalise(self, feats: np.ndarray) -> np.ndarray:
        """Model input (..., obs_dim) float32 from raw features (..., obs_dim) (see observation_features)."""
        return Normaliser(self.feat_mean, self.feat_std).normalise(feats)

    def features(self, q_rad, qd_rad_s, q_prev_rad) -> np.ndarray:
        """Normalised observation (obs_dim,) float32 from (D,) arrays (rad, rad/s, rad)."""
        return Normaliser(self.feat_mean, self.feat_std)(q_rad, qd_rad_s, q_prev_rad)

    def warmup_state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(q_rad, qd_rad_s, q_prev_rad) (D,) float64 at the training data's mean, for the warm-up decodes."""
        d, mean = self.cfg.n_joints, self.feat_mean
        return mean[:d], mean[d:2 * d], mean[:d] - mean[2 * d:3 * d]

    def save(self, manifest_path: Path, extra: dict) -> None:
        """Write `<stem>.pt` (state dict) and the manifest JSON with its sha256."""
        manifest_path = Path(manifest_path)
        weights_path = manifest_path.with_suffix(".pt")
        torch.save(self.model.state_dict(), weights_path)
        manifest = {
            "schema": "edgeinfer.policy/1",
            "weights": weights_path.name,
            "sha256": hashlib.sha256(weights_path.read_bytes()).hexdigest(),
            "config": self.cfg.to_dict(),
            "tokenizer": self.tokenizer.state_dict(),
            "feat_mean": self.feat_mean.tolist(),
            "feat_std": self.feat_std.tolist(),
            **extra,
        }
        manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
        self.manifest = manifest


def load_policy(manifest_path: Path | str = DEFAULT_POLICY, manifest: dict | None = None,
                max_weights_mb: float = MAX_WEIGHTS_MB) -> Policy:
    """Load the built-in action-token policy from its manifest JSON (manifest: its content, if already read).
    The weights file (inside the manifest's folder, at most max_weights_mb MB) is read once, hashed and loaded
    from those bytes (engines/models/weights_io.py).

    The tokenizer is the manifest's "tokenizer" by its "kind" (engines/tokenizer.tokenizer_from_state: step when
    absent, or dct). Raises FileNotFoundError if a file is missing, ValueError if the weights' sha256 does not
    match (or they lie outside the folder, are over the cap or not a regular file), the manifest's config is
    not a PolicyConfig (naming the key), the tokenizer's kind is unknown or its shape does not fit the config,
    or it names a factory (engines/models/served.py).
    """
    manifest_path = Path(manifest_path)
    manifest = read_manifest(manifest_path) if manifest is None else manifest
    if "factory" in manifest:
        raise ValueError(f"{manifest_path} is a factory policy (engines/models/factory.py): serve, replay, hil, "
                         "launch and the embedded Controller run it; this command takes the built-in policy only")
    try:
        return _build(manifest_path, manifest, max_weights_mb)
    except KeyError as e:
        raise ValueError(f"{manifest_path}: missing key {e.args[0]!r}") from None
    except (ValueError, RuntimeError) as e:  # a tokenizer, config or state dict that does not fit: name the file
        text = str(e)
        raise ValueError(text if text.startswith(str(manifest_path)) or str(manifest_path.parent) in text
                         else f"{manifest_path}: {text.splitlines()[0]}") from e


def _build(manifest_path: Path, manifest: dict, max_weights_mb: float) -> Policy:
    weights_path = inside(manifest_path.parent, manifest["weights"], "weights")
    state = load_state_dict(weights_path, manifest["sha256"], max_weights_mb)  # read once: the bytes hashed
    model = ActionTransformer(load(PolicyConfig, manifest["config"], where="config", file=manifest_path))
    try:
        model.load_state_dict(state)
    except RuntimeError as e:  # torch lists every mismatched tensor: the first line says what
        raise ValueError(f"weights {weights_path.name} do not fit config {manifest['config']}: "
                         f"{str(e).splitlines()[0]}") from e
    model.eval()
    kind = manifest["tokenizer"].get("kind", "step")
    try:
        tokenizer = tokenizer_from_state(manifest["tokenizer"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"tokenizer (kind {kind!r}): {e}") from e
    cfg = model.cfg
    if (tokenizer.n_joints, tokenizer.n_bins, getattr(tokenizer, "horizon", cfg.horizon)) != \
            (cfg.n_joints, cfg.n_bins, cfg.horizon):
        raise ValueError(f"{manifest_path}: tokenizer ({tokenizer.kind}) does not fit config n_joints={cfg.n_joints}, "
                         f"n_bins={cfg.n_bins}, horizon={cfg.horizon}")
    return Policy(
        model=model,
        tokenizer=tokenizer,
        feat_mean=np.array(manifest["feat_mean"]),
        feat_std=np.array(manifest["feat_std"]),
        manifest=manifest,
        path=manifest_path,
    )
