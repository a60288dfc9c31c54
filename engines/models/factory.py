"""Bring your own autoregressive policy: a policy manifest that names a Python factory building it.

    {"schema": "edgeinfer.policy/1",
     "factory": "policy.py:build",                  # "file.py:function" or "package.module:function"
     "factory_args": {"d_model": 64},               # the factory's keyword arguments (JSON)
     "weights": "target.pt", "sha256": "<hex>",     # optional: a state dict loaded into the model (strict)
     "config": {"obs_dim": 18, "n_joints": 6, "horizon": 8, "stride_ticks": 5, "n_bins": 64},
     "control_rate_hz": 250.0,
     "draft": {"factory": "policy.py:build", "factory_args": {"n_layers": 1}, "weights": "draft.pt",
               "sha256": "<hex>"}}                  # optional: a smaller model, the `model` drafter

A factory is function(config: FactoryPolicyConfig, **factory_args) -> PolicyParts(model, tokenizer, features):
    model      a torch module of the model protocol (engines/models/model_protocol.py), prefix kind "obs" or "tokens",
               logits over config.n_bins token ids, room for the prefix and horizon * n_joints tokens
    tokenizer  decode(tokens (..., n) int) -> offsets (..., n // D, D) rad from the observed q; n_joints; n_bins;
               optional bin_of(increment_rad (D,), joint (D,)) -> (D,) int64, which the kinematic drafter needs
               (engines.tokenizer.ActionTokenizer has all of them)
    features   (q_rad, qd_rad_s, q_prev_rad), (D,) float64 each -> the model's prefix: (obs_dim,) float32 for
               prefix kind "obs", the prompt (P,) int64 for "tokens" (engines.policy.Normaliser(mean, std) is
               the built-in policy's: q, qd, q - q_prev, normalised)
The draft's factory has the same form; its model and features serve the `model` drafter, its tokenizer must
have the target's n_bins (its tokens are the target's).

A policy folder with a factory is code: loading its manifest runs the factory's module. So it loads only when
the user says so (trust_code: RuntimeConfig.trust_policy_code, `--trust-policy-code` on serve, replay, hil and
launch; like transformers' trust_remote_code); otherwise PolicyCodeRefused names the manifest and the flag. The
module must be a file inside the manifest's folder ("file.py:fn", or "package.module:fn" for package/module.py;
no absolute path, no `..`, symlinks resolved and kept inside), imported by its path under a private module name:
sys.path is not touched, so a json.py beside it shadows nothing (the module imports its own siblings itself).
Weights (also inside the folder) are read once, at most max_weights_mb, hashed and loaded from those same bytes
(engines/models/weights_io.py); nothing is unpickled: torch.load(weights_only=True) (.pt, .pth) or safetensors.

Load checks (FactoryPolicy.open_engine; engines/models/served.py opens either kind): the protocol self-test of each
module (engines/models/protocol_check.py), the logits width, then speculative == target-only greedy tokens on
PROBE_STATES observations with every drafter that applies (protocol_check.check_speculative). A policy that
fails is refused with a ProtocolViolation naming the clause. Backend torch, fp32, on any device (onnxruntime
and reduced precision: not yet).
"""
from __future__ import annotations

import copy
import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from edgeinfer.core.config import load
from edgeinfer.engines.models.drafters import make_drafter
from edgeinfer.engines.models.model import ChunkShape
from edgeinfer.engines.models.model_protocol import TorchModuleEngine
from edgeinfer.engines.models.protocol_check import check_speculative
from edgeinfer.engines.models.weights_io import MAX_WEIGHTS_MB, inside, load_state_dict

PROBE_STATES = 3  # observations the load check decodes speculatively and target-only
DEFAULT_RATE_HZ = 250.0  # the probe observations' rate when the manifest has no control_rate_hz


@dataclass
class FactoryPolicyConfig(ChunkShape):
    """The manifest's "config": the action chunk (horizon steps x n_joints joints, n_bins tokens per joint, a
    step every stride_ticks control ticks) and the prefix width obs_dim (None: not checked)."""

    n_joints: int
    horizon: int
    stride_ticks: int
    n_bins: int
    obs_dim: int | None = None  # features per observation ("obs"), prompt tokens ("tokens"); checked at load

    def __post_init__(self):
        for name in ("n_joints", "horizon", "stride_ticks", "n_bins", "obs_dim"):
            least = 2 if name == "n_bins" else 1
            if (value := getattr(self, name)) is not None and value < least:
                raise ValueError(f"config.{name} must be >= {least}, got {value}")


@dataclass
class PolicyParts:
    """What a factory returns (see the module docstring)."""

    model: torch.nn.Module
    tokenizer: Any
    features: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


@dataclass
class FactoryPolicy:
    """A policy built by a factory: the runtime's view of it, as engines.policy.Policy is of the built-in one.
    features(q_rad, qd_rad_s, q_prev_rad) -> the target's prefix; draft: the `model` drafter's parts."""

    model: torch.nn.Module
    tokenizer: Any
    features: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
    cfg: FactoryPolicyConfig
    manifest: dict
    path: Path
    draft: PolicyParts | None = None

    @property
    def drafters(self) -> tuple[str, ...]:
        """The drafters that apply: kinematic when the tokenizer has bin_of, model when there is a draft."""
        return (("kinematic",) if hasattr(self.tokenizer, "bin_of") else ()) + (("model",) if self.draft else ())

    def warmup_state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(q_rad, qd_rad_s, q_prev_rad) (D,) float64 of the warm-up decodes: the first probe observation."""
        return probe_states(self, 1)[0]

    def open_engine(self, backend: str = "torch", precision: str = "fp32", device: str = "cpu",
                    threads: int = 1) -> TorchModuleEngine:
        """The target as an engine (a copy of the model on `device`), after the load checks (module docstring).
        Raises ValueError for another backend or precision, logits of another width than config.n_bins or a
        prefix of another width than config.obs_dim; ProtocolViolation naming the clause a module breaks."""
        if backend != "torch" or precision != "fp32":
            raise ValueError(f"{self.path}: a factory policy runs on backend torch in fp32 (got {backend} "
                             f"{precision}; onnxruntime and reduced precision are not supported yet)")
        torch.set_num_threads(threads)
        engine = self._engine(self.model, self.features, device, "factory")
        states = probe_states(self, PROBE_STATES)
        # the runtime's drafters (make_drafter's defaults: the draft model on the CPU) and an oracle
        check_speculative(engine, [(self.features(*s), s) for s in states], self.cfg.n_tokens,
                          {name: make_drafter(name, self) for name in self.drafters})
        return engine

    def open_draft_engine(self, device: str = "cpu") -> TorchModuleEngine:
        """The draft model as an engine (self-tested), for the `model` drafter. Raises ValueError without one."""
        if self.draft is None:
            raise ValueError(f"{self.path}: no draft in the manifest (the `model` drafter needs one)")
        return self._engine(self.draft.model, self.draft.features, device, "draft.factory")

    def _engine(self, module: torch.nn.Module, features, device: str, where: str) -> TorchModuleEngine:
        prefix = np.asarray(features(*probe_states(self, 1)[0]))
        if prefix.ndim != 1 or (self.cfg.obs_dim is not None and len(prefix) != self.cfg.obs_dim):
            raise ValueError(f"{self.path}: {where}'s features give a prefix of shape {prefix.shape}, config.obs_dim "
                             f"is {self.cfg.obs_dim}")
        engine = TorchModuleEngine(copy.deepcopy(module).to(device, torch.float32), probe=prefix,
                                   n_tokens=self.cfg.n_tokens)  # the whole chunk: every position decoded
        width = engine.forward(prefix, (), 0).shape[-1]
        if width != self.cfg.n_bins:
            raise ValueError(f"{self.path}: {where}'s model gives logits over {width} tokens, config.n_bins is "
                             f"{self.cfg.n_bins}")
        return engine


def probe_states(policy: FactoryPolicy, n: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """n seeded random observations (q_rad, qd_rad_s, q_prev_rad), (D,) float64 each: q uniform in +-1 rad, q_prev
    one chunk step behind it by the increment of random tokens (tokenizer.decode), qd that increment over the
    chunk step (stride_ticks at control_rate_hz, DEFAULT_RATE_HZ without one)."""
    cfg, rng = policy.cfg, np.random.default_rng(seed)
    step_s = cfg.stride_ticks / float(policy.manifest.get("control_rate_hz") or DEFAULT_RATE_HZ)
    states = []
    for _ in range(n):
        q = rng.uniform(-1.0, 1.0, cfg.n_joints)
        increment = np.asarray(policy.tokenizer.decode(rng.integers(0, cfg.n_bins, cfg.n_joints)),
                               dtype=np.float64).reshape(cfg.n_joints)
        states.append((q, increment / step_s, q - increment))
    return states


class PolicyCodeRefused(ValueError):
    """A factory manifest loaded without the opt-in to run its code (trust_code False)."""


def load_factory_policy(manifest_path: Path, manifest: dict, trust_code: bool = False,
                        max_weights_mb: float = MAX_WEIGHTS_MB) -> FactoryPolicy:
    """The policy `manifest` (read from manifest_path) describes: its factory imported and called, weights
    loaded. trust_code: the user's opt-in to run the factory's code (see the module docstring); max_weights_mb:
    the cap of each weights file, MB. Raises PolicyCodeRefused (a ValueError) without trust_code; ValueError
    naming the file and key (a bad config, factory name, path outside the folder, function or return value,
    weights over the cap, not a regular file, or whose sha256 does not match), FileNotFoundError for a factory
    module or weights file not found."""
    manifest_path = Path(manifest_path)
    if not trust_code:
        raise PolicyCodeRefused(f"{manifest_path}: a factory manifest is code: loading it runs its factory "
                                f"{manifest.get('factory')!r} from {manifest_path.parent.resolve()}; refused "
                                "without the opt-in: pass --trust-policy-code (trust_policy_code = true in the "
                                "config) if you trust this policy folder")
    cfg = load(FactoryPolicyConfig, manifest.get("config"), where="config", file=manifest_path)
    parts = _build(manifest, "", manifest_path, cfg, max_weights_mb)
    draft = _build(manifest["draft"], "draft.", manifest_path, cfg, max_weights_mb) if "draft" in manifest else None
    return FactoryPolicy(parts.model, parts.tokenizer, parts.features, cfg, manifest, manifest_path, draft)


def _build(entry: dict, where: str, manifest_path: Path, cfg: FactoryPolicyConfig,
           max_weights_mb: float) -> PolicyParts:
    """Call the factory of `entry` (the manifest, or its "draft") and load its weights into the model."""
    name, args = entry.get("factory"), entry.get("factory_args", {})
    if not isinstance(name, str) or ":" not in name:
        raise ValueError(f"{manifest_path}: {where}factory must be 'file.py:function' or 'module:function', "
                         f"got {name!r}")
    if not isinstance(args, dict):
        raise ValueError(f"{manifest_path}: {where}factory_args must be an object, got {type(args).__name__}")
    try:
        factory = import_factory(name, manifest_path.parent)
    except ValueError as e:
        raise ValueError(f"{manifest_path}: {where}{e}") from None
    try:
        parts = factory(cfg, **args)
    except Exception as e:  # the user's code: any error, named with the manifest and the factory
        raise ValueError(f"{manifest_path}: {where}factory {name} raised {type(e).__name__}: {e}") from e
    head = f"{manifest_path}: {where}factory {name} returned"
    if not (isinstance(parts, PolicyParts) and isinstance(parts.model, torch.nn.Module) and callable(parts.features)):
        raise ValueError(f"{head} {type(parts).__name__}, expected PolicyParts(model: torch.nn.Module, tokenizer, "
                         f"features: callable)")
    # the draft's tokens are the target's: only its n_bins is used
    shape = {"n_bins": cfg.n_bins} if where else {"n_bins": cfg.n_bins, "n_joints": cfg.n_joints}
    got = {key: getattr(parts.tokenizer, key, None) for key in shape}
    if got != shape or not (where or hasattr(parts.tokenizer, "decode")):
        raise ValueError(f"{head} a tokenizer with {got} and decode: {hasattr(parts.tokenizer, 'decode')}; "
                         f"config has {shape}")
    if "weights" in entry:
        try:
            path = inside(manifest_path.parent, entry["weights"], f"{where}weights")
        except ValueError as e:
            raise ValueError(f"{manifest_path}: {e}") from None
        parts.model.load_state_dict(load_state_dict(path, entry.get("sha256"), max_weights_mb))
    parts.model.eval()
    return parts


def import_factory(name: str, folder: Path) -> Callable:
    """The function `name` ("file.py:function", or "package.module:function" for package/module.py, inside
    folder) from its module, imported by file path under a private module name (sys.path untouched; imported
    once per file). Raises ValueError for a module path outside folder (absolute, `..`, a symlink out of it) or
    without the function, FileNotFoundError for a missing file, and whatever running the module raises."""
    module_name, fn_name = name.rsplit(":", 1)
    rel = module_name if module_name.endswith(".py") else module_name.replace(".", "/") + ".py"
    file = inside(folder, rel, f"factory {name!r}")
    if not file.is_file():
        raise FileNotFoundError(f"factory {name!r}: module {file} not found")
    key = f"_edgeinfer_factory_{hashlib.sha256(str(file).encode()).hexdigest()[:16]}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module  # before running it: dataclasses look their module up
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[key]
            raise
    fn = getattr(sys.modules[key], fn_name, None)
    if not callable(fn):
        raise ValueError(f"factory {name}: {module_name} has no function {fn_name!r}")
    return fn
