"""ONNX Runtime batched target (core/protocols.BatchedEngine): the exported fixed-shape batched pass
(engines/backends/onnx_export_batched.py) run by an InferenceSession (engines/ort_engine.make_session).

As in engines/backends/ort_engine.py the KV cache lives in two sets of buffers, each a k and a v per layer,
(n_slots, n_heads, seq_len + max_pass, head_dim) float32: a step reads one set and writes the updated cache into the
other, then the roles swap. One IO binding per step width and parity, made once, serves every call: a step only
writes token ids, positions and observations into the bound host arrays (engines/backends/slot_rows.py) and runs. The
plan is cached like every plan (engines/backends/cache.py), keyed also by n_slots, max_pass and the graph's version.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from edgeinfer.core.protocols import Pass
from edgeinfer.engines.backends.cache import EngineCache, engine_key_fields, plan_summary
from edgeinfer.engines.backends.onnx_export_batched import GRAPH, export_batched_onnx, input_names, output_names
from edgeinfer.engines.backends.ort_engine import make_session
from edgeinfer.engines.backends.slot_rows import SlotRows
from edgeinfer.engines.backends.torch_batched import DEFAULT_MAX_PASS, DEFAULT_WIDTHS


class OrtBatchedEngine:
    """BatchedEngine running the exported batched pass with ONNX Runtime, fp32.

    session: an InferenceSession on a plan from export_batched_onnx for these n_slots and max_pass. device: "cpu"
    or "cuda[:i]" (the KV buffers live there). widths: as TorchBatchedEngine's. Raises ValueError for a precision
    other than fp32; forward_batch raises ValueError for an invalid pass (engines/backends/slot_rows.py)."""

    backend = "onnxruntime"

    def __init__(self, session, cfg, n_slots: int, precision: str = "fp32", device: str = "cpu", *,
                 max_pass: int = DEFAULT_MAX_PASS, widths: Sequence[int] = DEFAULT_WIDTHS):
        _check_precision(precision)
        import onnxruntime as ort

        self.session = session
        self.precision, self.device, self.cfg, self.n_slots = precision, device, cfg, n_slots
        self.rows = r = SlotRows(cfg, n_slots, max_pass, widths)
        ort_device, _, index = device.partition(":")
        shape = (n_slots, cfg.n_heads, r.cache_len, cfg.d_model // cfg.n_heads)
        # zeros, not uninitialised memory: a NaN in a masked column would still poison the attention
        kv = [[ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32), ort_device, int(index or 0))
               for _ in range(2 * cfg.n_layers)] for _ in range(2)]  # per set: k_0 .. k_{L-1}, v_0 .. v_{L-1}
        self._obs = ort.OrtValue.ortvalue_from_numpy(r.obs)  # OrtValues on host arrays share their memory
        self._logits = {w: np.zeros((n_slots, w, cfg.n_bins), np.float32) for w in r.widths}
        self._values = {(name, w): ort.OrtValue.ortvalue_from_numpy(a[w]) for w in r.widths for name, a in (
            ("tokens", r.tokens), ("pos", r.pos), ("write", r.write), ("logits", self._logits))}
        self._bindings = {w: [self._bind(w, kv[src], kv[1 - src]) for src in range(2)] for w in r.widths}
        self._src = 0  # which KV pair holds the cache
        self.plan: dict | None = None  # where the plan came from (set by from_policy)

    @classmethod
    def from_policy(cls, policy, n_slots: int, threads: int = 1, *, precision: str = "fp32", device: str = "cpu",
                    cache: EngineCache | None = None, log: Callable[[str], None] = print,
                    max_pass: int = DEFAULT_MAX_PASS, widths: Sequence[int] = DEFAULT_WIDTHS) -> "OrtBatchedEngine":
        """Export the batched pass of `policy` (or take its plan from `cache`, default EngineCache()), open a
        session on `threads` intra-op threads. Raises ValueError for a precision other than fp32 (before building)."""
        _check_precision(precision)
        cache = cache if cache is not None else EngineCache()
        fields = engine_key_fields(policy, cls.backend, precision, device) | {
            "graph": GRAPH, "n_slots": n_slots, "max_pass": max_pass}
        plan, meta, built = cache.get_or_build(
            fields, lambda path: export_batched_onnx(policy, path, n_slots, max_pass), log=log)
        engine = cls(make_session(plan, device, threads), policy.cfg, n_slots, precision, device, max_pass=max_pass,
                     widths=widths)
        engine.plan = plan_summary(plan, meta, built)
        return engine

    def forward_batch(self, passes: Sequence[Pass]) -> list[np.ndarray]:
        """Logits (T_i, n_bins) float32 per pass, in order (core/protocols.BatchedEngine)."""
        return self.rows.forward(passes, self._step)

    def _bind(self, width: int, kv_in: list, kv_out: list):
        """The IO binding of a step of `width` reading the cache from kv_in and writing it to kv_out."""
        io = self.session.io_binding()
        io.bind_ortvalue_input("obs", self._obs)
        for name in ("tokens", "pos", "write"):
            io.bind_ortvalue_input(name, self._values[name, width])
        n = self.cfg.n_layers
        for name, value in zip(input_names(n)[4:], kv_in):
            io.bind_ortvalue_input(name, value)
        io.bind_ortvalue_output("logits", self._values["logits", width])
        for name, value in zip(output_names(n)[1:], kv_out):
            io.bind_ortvalue_output(name, value)
        return io

    def _step(self, width: int) -> np.ndarray:
        self.session.run_with_iobinding(self._bindings[width][self._src])
        self._src ^= 1
        return self._logits[width]


def _check_precision(precision: str) -> None:
    if precision != "fp32":
        raise ValueError(f"onnxruntime batched: precision must be 'fp32', got {precision!r} (int8 and reduced "
                         "precision: single-sequence engines only)")
