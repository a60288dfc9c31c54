"""TensorRT backend: FP8 engines from ModelOpt Q/DQ ONNX, strongly typed, serialized plans. UNVERIFIED.

Written against the TensorRT 10/11 Python API (`build_serialized_network`, `set_input_shape`,
`set_tensor_address`, `execute_async_v3`). No machine this project has run on had TensorRT and ModelOpt
installed together with a GPU, so this path has never executed: the README lists it as unverified, and
the tests that need it skip by capability.

Build: the fp32 target is fake-quantised with ModelOpt (`mtq.quantize`, FP8_DEFAULT_CFG: per-tensor
float8_e4m3fn scales for Linear weights and inputs), calibrated by decoding real observations; exported
with explicit KV-cache I/O (engines/backends/onnx_export.py) so the Q/DQ pairs land in the ONNX; then parsed into
a strongly typed network (TensorRT 11 has no precision flags: the Q/DQ types decide) with one
optimization profile over the pass length T = 1 .. max_pass.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from edgeinfer.engines.backends.cache import EngineCache, engine_key_fields, plan_summary
from edgeinfer.engines.backends.calibration import calibration_features
from edgeinfer.engines.backends.onnx_export import export_onnx
from edgeinfer.engines.models.model import ActionTransformer


def quantize_fp8(model: ActionTransformer, calib_obs: np.ndarray) -> ActionTransformer:
    """ModelOpt FP8 post-training quantisation, calibrated by greedy decoding of calib_obs (N, obs_dim) float32."""
    import modelopt.torch.quantization as mtq

    def forward_loop(m):
        k, v = m.empty_cache(len(calib_obs))
        obs = torch.as_tensor(calib_obs)
        tok = torch.zeros(len(calib_obs), dtype=torch.long)
        for p in range(m.cfg.seq_len - 1):
            tok = m.step(obs, tok[:, None], torch.tensor([p]), k, v)[:, -1].argmax(-1)

    return mtq.quantize(model, mtq.FP8_DEFAULT_CFG, forward_loop)


def build_plan(onnx_path: Path, plan_path: Path, cfg, max_pass: int = 17) -> None:
    """Parse `onnx_path` into a strongly typed network and write the serialized plan to `plan_path`.

    Raises RuntimeError with the parser's errors, or when the builder returns no plan.
    """
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flag = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)  # always on in TensorRT 11
    network = builder.create_network(0 if flag is None else 1 << int(flag))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(Path(onnx_path).read_bytes()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"tensorrt: cannot parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    profile.set_shape("tokens", (1, 1), (1, 5), (1, max_pass))
    profile.set_shape("input_pos", (1,), (5,), (max_pass,))
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise RuntimeError(f"tensorrt: the builder returned no plan for {onnx_path}")
    Path(plan_path).write_bytes(bytes(plan))


class TrtEngine:
    """Engine (engines/backends/engine.py) executing a serialized TensorRT plan on one CUDA stream. UNVERIFIED.

    The KV cache lives in two device tensors that are both input and output of every pass: TensorRT
    writes `k_cache_out` into a second buffer, and the two are swapped after each pass.
    """

    backend = "tensorrt"

    def __init__(self, plan: bytes, cfg, precision: str, device: str = "cuda"):
        import tensorrt as trt

        self.cfg, self.precision, self.device = cfg, precision, device
        self._runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self._engine = self._runtime.deserialize_cuda_engine(plan)
        if self._engine is None:
            raise RuntimeError("tensorrt: the plan could not be deserialized")
        self._ctx = self._engine.create_execution_context()
        self._stream = torch.cuda.Stream(device)
        shape = (cfg.n_layers, 1, cfg.n_heads, cfg.seq_len, cfg.d_model // cfg.n_heads)
        self._kv = [torch.zeros(shape, device=device) for _ in range(4)]  # k, v, k_out, v_out
        self._obs = torch.zeros(1, cfg.obs_dim, device=device)
        self.plan: dict | None = None  # where the plan came from (set by from_policy)

    @classmethod
    def from_policy(cls, policy, precision: str = "fp8", device: str = "cuda", threads: int = 1,
                    cache: EngineCache | None = None, log: Callable[[str], None] = print) -> "TrtEngine":
        """Build the plan (or take it from the engine cache, checksum verified first) and deserialize it.
        Raises ValueError for a precision other than fp32/fp8, RuntimeError when TensorRT cannot build."""
        if precision not in ("fp32", "fp8"):
            raise ValueError(f"precision={precision!r}: the tensorrt backend builds fp32 or fp8")

        def build(plan_path: Path) -> None:
            onnx_path = plan_path.with_suffix(".onnx")
            model = copy.deepcopy(policy.model).eval()
            if precision == "fp8":
                model = quantize_fp8(model, calibration_features(policy, n=256))
            export_onnx(policy, onnx_path, model=model)
            build_plan(onnx_path, plan_path, policy.cfg)

        cache = cache if cache is not None else EngineCache()
        fields = engine_key_fields(policy, cls.backend, precision, device)
        plan, meta, built = cache.get_or_build(fields, build, plan_name="plan.trt", log=log)
        engine = cls(plan.read_bytes(), policy.cfg, precision, device)
        engine.plan = plan_summary(plan, meta, built)
        return engine

    def forward(self, obs: np.ndarray | None, tokens: Sequence[int], start: int) -> np.ndarray:
        ids = [0, *tokens] if start == 0 else list(tokens)
        if start == 0:
            self._obs.copy_(torch.as_tensor(obs, dtype=torch.float32).view(1, -1))
        tok = torch.tensor([ids], dtype=torch.long, device=self.device)
        pos = torch.arange(start, start + len(ids), device=self.device)
        logits = torch.empty(1, len(ids), self.cfg.n_bins, device=self.device)
        k, v, k_out, v_out = self._kv
        bindings = {"obs": self._obs, "tokens": tok, "input_pos": pos, "k_cache": k, "v_cache": v,
                    "logits": logits, "k_cache_out": k_out, "v_cache_out": v_out}
        self._ctx.set_input_shape("tokens", tuple(tok.shape))
        self._ctx.set_input_shape("input_pos", tuple(pos.shape))
        for name, t in bindings.items():
            self._ctx.set_tensor_address(name, t.data_ptr())
        torch.cuda.current_stream(self.device).synchronize()
        if not self._ctx.execute_async_v3(self._stream.cuda_stream):
            raise RuntimeError("tensorrt: execute_async_v3 failed")
        self._stream.synchronize()
        self._kv = [k_out, v_out, k, v]
        return logits[0].cpu().numpy()

    def rollback(self, n: int) -> None:
        """Nothing to do: the cache is written by position (see engines/backends/engine.py)."""
