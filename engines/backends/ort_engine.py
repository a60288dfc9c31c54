"""ONNX Runtime backend: the exported cached step (engines/backends/onnx_export.py) run by an InferenceSession.

The KV cache lives in two pairs of buffers (k, v), each (n_layers, 1, n_heads, seq_len, head_dim) float32:
a pass reads one pair and writes the updated cache into the other (the graph's explicit KV outputs),
then the roles swap. Every buffer is bound once with IO binding, one binding per pass length T and
parity, so a pass only writes its token ids and positions into bound arrays and runs: no per-pass
allocation or rebinding. On a 2-core x86_64 CPU (AMD EPYC), one thread, a single-token pass measured
77 us p50 this way against 92 us with session.run and numpy feeds, and 0.23x torch eager fp32. Fusing
attention into ORT's MultiHeadAttention (onnxscript's ort_fusions) measured slower (84 us): not used.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from edgeinfer.engines.backends.cache import EngineCache, engine_key_fields, plan_summary
from edgeinfer.engines.backends.int8 import INT8_METHOD, export_int8
from edgeinfer.engines.backends.onnx_export import export_onnx
from edgeinfer.engines.models.model import PolicyConfig


def make_session(plan: Path, device: str = "cpu", threads: int = 1):
    """An InferenceSession on `plan` tuned for batch-1 latency: `threads` intra-op threads, sequential
    execution, all graph optimisations. On cuda[:i]: the TensorRT EP (engine cache in `<plan dir>/trt`)
    when onnxruntime has it, then the CUDA EP, then CPU for any node they do not take."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # measured per pass on 2 cores: no effect with 1 thread; with 2, spinning 85 us vs 113 us without
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    providers: list = ["CPUExecutionProvider"]
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        providers.insert(0, ("CUDAExecutionProvider", {"device_id": index}))
        if "TensorrtExecutionProvider" in ort.get_available_providers():
            providers.insert(0, ("TensorrtExecutionProvider", {
                "device_id": index, "trt_engine_cache_enable": True,
                "trt_engine_cache_path": str(plan.parent / "trt"),
            }))
    return ort.InferenceSession(str(plan), so, providers=providers)


def _check_precision(precision: str, device: str = "cpu") -> None:
    if precision not in ("fp32", "int8") or (precision == "int8" and device.startswith("cuda")):
        raise ValueError(f"precision={precision!r} on {device}: onnxruntime backend builds fp32, and int8 on cpu "
                         "(engines/backends/int8.py); bf16/fp8: use torch or tensorrt")


class _Pass:
    """The bound arrays and the two IO bindings (read pair 0 or pair 1) of passes over T positions."""

    def __init__(self, session, t: int, n_bins: int, obs, kv: list):
        import onnxruntime as ort

        self.tokens = np.zeros((1, t), np.int64)
        self.pos = np.zeros(t, np.int64)
        self.logits = np.zeros((1, t, n_bins), np.float32)
        self._values = [ort.OrtValue.ortvalue_from_numpy(a) for a in (self.tokens, self.pos, self.logits)]
        self.bindings = []
        for src in range(2):
            io = session.io_binding()
            io.bind_ortvalue_input("obs", obs)
            io.bind_ortvalue_input("tokens", self._values[0])
            io.bind_ortvalue_input("input_pos", self._values[1])
            io.bind_ortvalue_input("k_cache", kv[src][0])
            io.bind_ortvalue_input("v_cache", kv[src][1])
            io.bind_ortvalue_output("logits", self._values[2])
            io.bind_ortvalue_output("k_cache_out", kv[1 - src][0])
            io.bind_ortvalue_output("v_cache_out", kv[1 - src][1])
            self.bindings.append(io)


class OrtEngine:
    """Engine (see engines/backends/engine.py) running the exported target with ONNX Runtime, fp32 (or int8 weights on
    cpu: engines/backends/int8.py; LOSSY unless its build gate measures otherwise).

    session: an InferenceSession on a plan from export_onnx or export_int8 (see make_session). device: "cpu" or
    "cuda[:i]" (the KV buffers live there). Raises ValueError for a precision other than fp32 or int8 (cpu).
    """

    backend = "onnxruntime"

    def __init__(self, session, cfg: PolicyConfig, precision: str = "fp32", device: str = "cpu"):
        _check_precision(precision, device)
        import onnxruntime as ort

        self.session = session
        self.precision, self.device, self.cfg = precision, device, cfg
        ort_device, _, index = device.partition(":")
        shape = (cfg.n_layers, 1, cfg.n_heads, cfg.seq_len, cfg.d_model // cfg.n_heads)
        # zeros, not uninitialised memory: a NaN in a masked slot would still poison the attention
        self._kv = [[ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32), ort_device, int(index or 0))
                     for _ in "kv"] for _ in range(2)]
        self._obs = np.zeros((1, cfg.obs_dim), np.float32)
        self._obs_value = ort.OrtValue.ortvalue_from_numpy(self._obs)
        self._passes: dict[int, _Pass] = {}
        self._src = 0  # which KV pair holds the cache
        self.plan: dict | None = None  # where the plan came from (set by from_policy)

    @classmethod
    def from_policy(cls, policy, precision: str = "fp32", device: str = "cpu", threads: int = 1,
                    cache: EngineCache | None = None, log: Callable[[str], None] = print) -> "OrtEngine":
        """Export the target of `policy` (or take its plan from `cache`, default EngineCache()), open a session.

        Raises ValueError for a precision other than fp32 or int8 on cpu (before building anything)."""
        _check_precision(precision, device)
        cache = cache if cache is not None else EngineCache()
        fields = engine_key_fields(policy, cls.backend, precision, device)  # the key holds the precision
        export = export_onnx
        if precision == "int8":  # and how it was quantised
            fields, export = fields | {"int8_method": INT8_METHOD}, export_int8
        plan, meta, built = cache.get_or_build(fields, lambda path: export(policy, path), log=log)
        engine = cls(make_session(plan, device, threads), policy.cfg, precision, device)
        engine.plan = plan_summary(plan, meta, built)
        return engine

    def forward(self, obs: np.ndarray | None, tokens: Sequence[int], start: int) -> np.ndarray:
        """logits (T, n_bins) float32 for positions start.. (see engines/backends/engine.py)."""
        if start == 0:
            self._obs[0] = obs
            tokens = (0, *tokens)  # position 0 embeds obs; its token id is ignored
        t = len(tokens)
        p = self._passes.get(t)
        if p is None:
            p = self._passes[t] = _Pass(self.session, t, self.cfg.n_bins, self._obs_value, self._kv)
        p.tokens[0] = tokens
        p.pos[:] = range(start, start + t)
        self.session.run_with_iobinding(p.bindings[self._src])
        self._src ^= 1
        return p.logits[0].copy()

    def rollback(self, n: int) -> None:
        """Nothing to do: the cache is written by position (see engines/backends/engine.py)."""
