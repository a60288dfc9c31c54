"""Open an engine for a policy: pick the backend, build (or load from the engine cache) its plan."""
from __future__ import annotations

from edgeinfer.engines.engine import Engine, engine_class, unavailable_reason
from edgeinfer.engines.policy import Policy


def load_engine(policy: Policy, backend: str = "torch", precision: str = "fp32", device: str = "cpu",
                threads: int = 1) -> Engine:
    """The target of `policy` as an Engine on `backend`/`precision`/`device`.

    Raises RuntimeError naming the backend when it cannot run here (library missing, no GPU), and
    ValueError for a precision the backend does not build.
    """
    reason = unavailable_reason(backend, device)
    if reason:
        raise RuntimeError(f"backend {backend!r} on {device}: {reason}")
    return engine_class(backend).from_policy(policy, precision=precision, device=device, threads=threads)
