"""One engine interface for every backend, and the registry of backends (imported lazily).

An engine is the target policy compiled for one backend, precision and device, decoding one sequence
(batch 1) with a static KV cache. The speculative decoder (edgeinfer.speculative) calls only this:

    engine.forward(obs, tokens, start) -> logits (T, n_bins) float32
        One target pass over sequence positions start .. start+T-1.
        start == 0 (prefill): obs (obs_dim,) float32 fills position 0 and tokens fill positions 1..;
        for a token-prefix model (engines/model_protocol.py, prefix kind "tokens") obs is the prompt (P,)
        int, which plays position 0's role: the prefill's row 0 predicts the first generated token;
        start >= 1: obs is None and tokens (T of them) fill positions start.. .
        Logits row i predicts action token start + i (position p predicts token p).
    engine.rollback(n)
        Forget positions >= n (rejected drafts). Every backend here writes its cache by position, so a
        later pass overwrites those entries before any query can see them (a query at position p attends
        to positions <= p only) and rollback costs nothing; an engine whose cache grows by appending must
        truncate it here.

Backends (name -> module), availability checked here only:
    torch         CPU eager; CUDA with decode/verify captured in CUDA graphs; fp32, bf16, fp8
    onnxruntime   ONNX with explicit KV-cache inputs/outputs; CPU EP, CUDA/TensorRT EPs with onnxruntime-gpu
    tensorrt      FP8 engines from ModelOpt Q/DQ ONNX, strongly typed (needs tensorrt and a GPU)
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Protocol, Sequence

import numpy as np

PRECISIONS = ("fp32", "bf16", "fp8")
BUILDS = {"torch": PRECISIONS, "onnxruntime": ("fp32",), "tensorrt": ("fp32", "fp8")}  # precisions per backend

# name -> (module, class) imported on first use, so that no backend's library is imported unless asked for
BACKENDS = {
    "torch": ("edgeinfer.engines.torch_engine", "TorchEngine"),
    "onnxruntime": ("edgeinfer.engines.ort_engine", "OrtEngine"),
    "tensorrt": ("edgeinfer.engines.trt_engine", "TrtEngine"),
}


class Engine(Protocol):
    backend: str
    precision: str
    device: str
    cfg: Any  # the model's config (PolicyConfig for the action policy): the decoder never reads it

    def forward(self, obs: np.ndarray | None, tokens: Sequence[int], start: int) -> np.ndarray: ...

    def rollback(self, n: int) -> None: ...


def cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def unavailable_reason(backend: str, device: str = "cpu") -> str | None:
    """Why `backend` cannot run on `device` here (None when it can). The one place that probes libraries."""
    if backend not in BACKENDS:
        return f"unknown backend {backend!r}; known: {sorted(BACKENDS)}"
    if device.startswith("cuda") and not cuda_available():
        return "no CUDA device visible to torch"
    if backend == "onnxruntime":
        for lib in ("onnxruntime", "onnx", "onnxscript"):  # onnx + onnxscript: the exporter (engines/onnx_export.py)
            if importlib.util.find_spec(lib) is None:
                return f"{lib} is not installed (pip install {lib}; onnxruntime-gpu for CUDA)"
        if device.startswith("cuda"):
            import onnxruntime as ort

            if "CUDAExecutionProvider" not in ort.get_available_providers():
                return "onnxruntime has no CUDAExecutionProvider (pip install onnxruntime-gpu)"
    if backend == "tensorrt":
        if not device.startswith("cuda"):
            return "tensorrt runs on CUDA devices only"
        for lib in ("tensorrt", "modelopt"):
            if importlib.util.find_spec(lib) is None:
                return f"{lib} is not installed (pip install tensorrt nvidia-modelopt)"
    return None


def engine_class(backend: str):
    """The engine class of a backend, imported on first use. Raises KeyError for an unknown backend."""
    if backend not in BACKENDS:
        raise KeyError(f"unknown backend {backend!r}; known: {sorted(BACKENDS)}")
    module, cls = BACKENDS[backend]
    return getattr(importlib.import_module(module), cls)
