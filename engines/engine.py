"""One engine interface for every backend, and the registry of backends (imported lazily).

The interface every backend implements is `Engine` in edgeinfer/core/protocols.py.

Backends (name -> module), availability checked here only:
    torch         CPU eager; CUDA with decode/verify captured in CUDA graphs; fp32, bf16, fp8
    onnxruntime   ONNX with explicit KV-cache inputs/outputs; CPU EP, CUDA/TensorRT EPs with onnxruntime-gpu
    tensorrt      FP8 engines from ModelOpt Q/DQ ONNX, strongly typed (needs tensorrt and a GPU)
"""
from __future__ import annotations

import importlib
import importlib.util

PRECISIONS = ("fp32", "bf16", "fp8")
BUILDS = {"torch": PRECISIONS, "onnxruntime": ("fp32",), "tensorrt": ("fp32", "fp8")}  # precisions per backend

# name -> (module, class) imported on first use, so that no backend's library is imported unless asked for
BACKENDS = {
    "torch": ("edgeinfer.engines.torch_engine", "TorchEngine"),
    "onnxruntime": ("edgeinfer.engines.ort_engine", "OrtEngine"),
    "tensorrt": ("edgeinfer.engines.trt_engine", "TrtEngine"),
}


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
