"""INT8 weights for the onnxruntime backend: the exported fp32 plan (engines/backends/onnx_export.py) quantised by
onnxruntime.quantization.

Only MatMul/Gemm nodes are quantised (MATMULS). Measured on the default policy, 256 held-out observations, 2-core
EPYC under load: dynamic 0.879 token agreement, action RMSE 1.224 vs 1.191 mrad fp32, a pass 89 vs 84 us fp32;
static 0.805, 1.228 mrad, 137 us (its QDQ pairs cost more than the int8 products save at d_model 64).

    dynamic   (INT8_METHOD) weights int8 per output channel, stored in the plan; activations quantised per pass
              from their own range (MatMulInteger/DynamicQuantizeLinear): no calibration data
    static    weights and activations int8 in QDQ form, the activations' scales fixed from the fp32 plan run
              over calibration passes on the *training* runs (engines/backends/calibration.py calibration_features);
              kept for the comparison in docs/engines.md

Quantisation is lossy by construction: an int8 engine is gated on held-out token agreement with fp32 target-only
greedy decoding and action RMSE (engines/backends/build.py), labelled LOSSY unless its agreement is 1.0, and never a
candidate of `backend="auto"` (engines/backends/auto.py). Source: ONNX Runtime, "Quantize ONNX models"
(onnxruntime.ai/docs/performance/model-optimizations/quantization.html).
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np

from edgeinfer.engines.backends.onnx_export import export_onnx

INT8_METHOD: Literal["dynamic", "static"] = "dynamic"  # the faster and more accurate of the two (measured above)
MATMULS = ["MatMul", "Gemm"]
_CALIBRATION_OBS = 64  # calibration passes (each a full chunk's n_tokens positions)
# Only the matrix products: quantising LayerNorm and the embeddings too measured 0.14 token agreement (static)


def _calibration_reader(policy, n_obs: int):
    """A CalibrationDataReader over n_obs full-chunk passes: observations of the training runs, each with the
    tokens fp32 greedy decoding gives it, all positions in one pass from empty caches."""
    import torch
    from onnxruntime.quantization import CalibrationDataReader

    from edgeinfer.engines.backends.calibration import calibration_features
    from edgeinfer.engines.training.evaluate import greedy_decode_batch

    cfg = policy.cfg
    x = calibration_features(policy, n=n_obs)  # (n_obs, obs_dim) float32
    tokens = greedy_decode_batch(policy.model, torch.as_tensor(x))  # (n_obs, n_tokens)
    shape = (cfg.n_layers, 1, cfg.n_heads, cfg.seq_len, cfg.d_model // cfg.n_heads)
    feeds = [{"obs": x[i:i + 1], "tokens": np.concatenate([[0], tokens[i, :-1]])[None].astype(np.int64),
              "input_pos": np.arange(cfg.n_tokens, dtype=np.int64), "k_cache": np.zeros(shape, np.float32),
              "v_cache": np.zeros(shape, np.float32)} for i in range(n_obs)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self._it = iter(feeds)

        def get_next(self):
            return next(self._it, None)

    return Reader()


def export_int8(policy, path: Path | str, method: Literal["dynamic", "static"] = INT8_METHOD) -> Path:
    """Write the int8 plan of `policy`'s target to `path` (one self-contained ONNX file): export fp32 next to it,
    then quantise it (see the module docstring). Returns `path`. Raises ValueError for an unknown method, and what
    export_onnx and onnxruntime.quantization raise."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    if method not in ("dynamic", "static"):
        raise ValueError(f"int8 method must be 'dynamic' or 'static', got {method!r}")
    path = Path(path)
    fp32 = export_onnx(policy, path.with_name(path.stem + ".fp32.onnx"))
    if method == "dynamic":
        quantize_dynamic(fp32, path, weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=MATMULS)
    else:
        quantize_static(fp32, path, _calibration_reader(policy, _CALIBRATION_OBS), quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=MATMULS, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        per_channel=True)
    fp32.unlink()
    return path
