"""The policy the runtime serves (serve, replay, hil, launch, the embedded Controller): the built-in action-token
policy (engines/models/policy.py) or a bring-your-own autoregressive one built by a factory (engines/models/factory.py).

Both kinds give the runtime cfg (n_joints, horizon, stride_ticks, n_bins, n_tokens), tokenizer,
features(q, qd, q_prev), drafters (the names that apply) and warmup_state(); open_engine gives their target as an
Engine. This module sits above policy, factory and build, so none of them imports another in a cycle.
"""
from __future__ import annotations

from pathlib import Path

from edgeinfer.engines.models.paths import DEFAULT_POLICY, read_manifest
from edgeinfer.engines.models.policy import Policy, load_policy
from edgeinfer.engines.models.weights_io import MAX_WEIGHTS_MB


def load_served_policy(manifest_path: Path | str = DEFAULT_POLICY, trust_code: bool = False,
                       max_weights_mb: float = MAX_WEIGHTS_MB):
    """A factory policy (engines/models/factory.py FactoryPolicy) when the manifest names a "factory", else the built-in
    Policy. trust_code: the opt-in to run a factory's code (RuntimeConfig.trust_policy_code); max_weights_mb:
    the cap of each weights file. Raises as load_policy and load_factory_policy do (PolicyCodeRefused: a factory
    manifest without trust_code)."""
    manifest_path = Path(manifest_path)
    manifest = read_manifest(manifest_path)
    if "factory" in manifest:
        from edgeinfer.engines.models.factory import load_factory_policy  # torch modules of the user's: only when asked

        return load_factory_policy(manifest_path, manifest, trust_code, max_weights_mb)
    return load_policy(manifest_path, manifest, max_weights_mb)


def open_engine(policy, backend: str = "torch", precision: str = "fp32", device: str = "cpu", threads: int = 1):
    """The policy's target as an Engine: engines/backends/build.py load_engine for the built-in Policy (its errors), the
    factory policy's own open_engine, with its load checks, otherwise."""
    if isinstance(policy, Policy):
        from edgeinfer.engines.backends.build import load_engine

        return load_engine(policy, backend, precision, device, threads=threads)
    return policy.open_engine(backend, precision, device, threads)
