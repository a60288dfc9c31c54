"""The registry of batched target engines (core/protocols.BatchedEngine), imported lazily by backend name.

    fused         engines/backends/fused_batched.py: one numba call per batched pass, float64 arithmetic, CPU
    torch         engines/backends/torch_batched.py: eager torch, fixed-shape steps (engines/backends/slot_rows.py), cpu
    or cuda onnxruntime   engines/backends/ort_batched.py: the exported fixed-shape step, IO-bound session, plan in the
    engine cache

Each class has `from_policy(policy, n_slots, threads)`; selecting a backend imports its module only.
"""
from __future__ import annotations

import importlib

from edgeinfer.core.protocols import BatchedEngine

# name -> (module, class), imported on first use
BATCHED_BACKENDS = {
    "fused": ("edgeinfer.engines.backends.fused_batched", "BatchedFusedEngine"),
    "torch": ("edgeinfer.engines.backends.torch_batched", "TorchBatchedEngine"),
    "onnxruntime": ("edgeinfer.engines.backends.ort_batched", "OrtBatchedEngine"),
}


def open_batched(policy, backend: str = "fused", n_slots: int = 8, threads: int = 1) -> BatchedEngine:
    """The batched target engine of `backend` for policy.model, with n_slots KV-cache slots; threads: intra-op
    threads where the backend uses them. Raises ValueError for an unknown backend (naming the known ones) or
    what the backend's constructor raises (n_slots < 1, a model it cannot run)."""
    if backend not in BATCHED_BACKENDS:
        raise ValueError(f"unknown batched backend {backend!r}; known: {sorted(BATCHED_BACKENDS)}")
    module, cls = BATCHED_BACKENDS[backend]
    return getattr(importlib.import_module(module), cls).from_policy(policy, n_slots, threads)
