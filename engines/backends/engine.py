"""One engine interface for every backend, and the registry of backends (imported lazily).

The interface every backend implements is `Engine` in edgeinfer/core/protocols.py.

Backends (name -> module), availability checked here only:
    torch         CPU eager; CUDA with decode/verify captured in CUDA graphs; fp32, bf16, fp8
    onnxruntime   ONNX with explicit KV-cache inputs/outputs; CPU EP, CUDA/TensorRT EPs with onnxruntime-gpu; fp32,
                  int8 weights on cpu (engines/backends/int8.py)
    tensorrt      FP8 engines from ModelOpt Q/DQ ONNX, strongly typed (needs tensorrt and a GPU)
    fused         the whole pass as one numba-compiled CPU function, fp32 weights, float64 arithmetic
    packed        the same on weights packed into SIMD panels, fp32 fused multiply-adds: a verify pass reads every
                  weight once (engines/backends/packed_engine.py), for policies whose weights set the time of a pass
"""
from __future__ import annotations

import importlib
import importlib.util

PRECISIONS = ("fp32", "bf16", "fp8", "int8")
LOSSY_PRECISIONS = ("bf16", "fp8", "int8")  # never exact by construction: gated on quality (engines/backends/build.py)
# precisions per backend
BUILDS = {"torch": ("fp32", "bf16", "fp8"), "onnxruntime": ("fp32", "int8"), "tensorrt": ("fp32", "fp8"),
          "fused": ("fp32",), "packed": ("fp32",)}

# name -> (module, class) imported on first use, so that no backend's library is imported unless asked for
BACKENDS = {
    "torch": ("edgeinfer.engines.backends.torch_engine", "TorchEngine"),
    "onnxruntime": ("edgeinfer.engines.backends.ort_engine", "OrtEngine"),
    "tensorrt": ("edgeinfer.engines.backends.trt_engine", "TrtEngine"),
    "fused": ("edgeinfer.engines.backends.fused_engine", "FusedEngine"),
    "packed": ("edgeinfer.engines.backends.packed_engine", "PackedEngine"),
}


def cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def unavailable_reason(backend: str, device: str = "cpu") -> str | None:
    """Why `backend` cannot run on `device` here (None when it can). The one place that probes libraries.
    "auto" (engines/backends/auto.py) runs wherever one exact backend does: it asks this of each."""
    if backend == "auto":
        return None
    if backend not in BACKENDS:
        return f"unknown backend {backend!r}; known: {sorted(BACKENDS)}"
    if backend in ("fused", "packed") and device != "cpu":  # said first: a GPU would not help
        return f"{backend} runs on the CPU only (a numba-compiled pass)"
    if device.startswith("cuda") and not cuda_available():
        return "no CUDA device visible to torch"
    if backend == "onnxruntime":
        # onnx + onnxscript: the exporter (engines/backends/onnx_export.py)
        for lib in ("onnxruntime", "onnx", "onnxscript"):
            if importlib.util.find_spec(lib) is None:
                return f"{lib} is not installed (pip install {lib}; onnxruntime-gpu for CUDA)"
        if device.startswith("cuda"):
            import onnxruntime as ort

            if "CUDAExecutionProvider" not in ort.get_available_providers():
                return "onnxruntime has no CUDAExecutionProvider (pip install onnxruntime-gpu)"
    if backend in ("fused", "packed") and importlib.util.find_spec("numba") is None:
        return "numba is not installed (pip install numba)"
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
