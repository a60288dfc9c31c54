"""The backend registry: lazy imports, availability checked in one place, and the TensorRT path
(which runs only where TensorRT, ModelOpt and a GPU are present: skipped by capability elsewhere)."""
import subprocess
import sys

import pytest

from edgeinfer.engines.backends.build import load_engine
from edgeinfer.engines.backends.calibration import sample_windows
from edgeinfer.engines.backends.engine import BACKENDS, engine_class, unavailable_reason

pytestmark = pytest.mark.background  # CPU-bound, no real-time bound (tests/conftest.py)


def test_importing_the_runtime_imports_no_backend_library_and_no_scipy():
    # scipy.fft (0.2 s of every runtime's start) is imported by a DCT policy's tokenizer when it first transforms
    code = ("import sys, edgeinfer.node.runtime, edgeinfer.engines.backends.engine, edgeinfer.engines.backends.build; "
            "print(sorted(m for m in ('onnxruntime', 'onnx', 'tensorrt', 'modelopt', 'numba', 'scipy') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_unavailable_backends_say_why(policy):
    assert unavailable_reason("torch") is None and unavailable_reason("onnxruntime") is None
    assert "CUDA devices only" in unavailable_reason("tensorrt", "cpu")
    with pytest.raises(RuntimeError, match="backend 'tensorrt' on cpu: tensorrt runs on CUDA devices only"):
        load_engine(policy, "tensorrt", "fp8", "cpu")
    with pytest.raises(KeyError, match="unknown backend 'tflite'"):
        engine_class("tflite")
    assert set(BACKENDS) == {"torch", "onnxruntime", "tensorrt", "fused", "packed"}


@pytest.mark.skipif(unavailable_reason("tensorrt", "cuda") is not None,
                    reason=f"tensorrt: {unavailable_reason('tensorrt', 'cuda')}")
def test_tensorrt_fp8_engine_passes_the_quality_gate(policy, schunk_dir, tmp_path):
    from edgeinfer.engines.backends.cache import EngineCache
    from edgeinfer.engines.backends.quality import engine_quality
    from edgeinfer.engines.backends.trt_engine import TrtEngine

    engine = TrtEngine.from_policy(policy, "fp8", "cuda", cache=EngineCache(tmp_path))
    feats, offsets, _ = sample_windows(policy, 64, 0, schunk_dir, require_real=True)
    q = engine_quality(engine, policy, feats, offsets)
    assert q["token_agreement"] >= 0.8 and q["action_rmse_rad"] <= 1.1 * q["ref_action_rmse_rad"]
