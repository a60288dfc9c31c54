"""Export the target's batched cached pass (engines/backends/batched_step.py) to ONNX, for
engines/backends/ort_batched.py.

Graph signature: B = n_slots (fixed); T the dynamic axis "T", 1 <= T <= max_pass (engines/backends/slot_rows.py runs
each pass in the one width its length picks, so every step of a width has one shape); L = n_layers, H = n_heads,
S = seq_len + max_pass, Dh = d_model / n_heads.

    inputs   obs          float32 (B, obs_dim)     row b's observation, used where pos == 0
             tokens       int64   (B, T)
             pos          int64   (B, T)           sequence positions (embedding, causal mask)
             write        int64   (B, T)           cache column written (pos, or a scratch column for padding)
             k_cache_{l}  float32 (B, H, S, Dh)    layer l's keys, l = 0..L-1 (one input per layer: the graph
             v_cache_{l}  float32 (B, H, S, Dh)    copies each cache once, in its scatter, never a stack of them)
    outputs  logits       float32 (B, T, n_bins)
             k_cache_out_{l}  float32 (B, H, S, Dh)  k_cache_{l} with the `write` columns overwritten
             v_cache_out_{l}  float32 (B, H, S, Dh)

Traced by torch.export and translated by the dynamo exporter, weights inside the one .onnx file, as
engines/backends/onnx_export.py does for the batch-1 graph.
"""
from __future__ import annotations

from pathlib import Path

import onnx
import torch

from edgeinfer.engines.backends.batched_step import BatchedStep
from edgeinfer.engines.models.model import ActionTransformer

GRAPH = "batched_step/5"  # bump when the signature or layout above changes (it is part of the engine-cache key)


def input_names(n_layers: int) -> list[str]:
    return ["obs", "tokens", "pos", "write", *cache_names("k_cache", n_layers), *cache_names("v_cache", n_layers)]


def output_names(n_layers: int) -> list[str]:
    return ["logits", *cache_names("k_cache_out", n_layers), *cache_names("v_cache_out", n_layers)]


def cache_names(stem: str, n_layers: int) -> list[str]:
    return [f"{stem}_{layer}" for layer in range(n_layers)]


def export_batched_onnx(policy, path: Path | str, n_slots: int, max_pass: int, opset: int = 18) -> Path:
    """Write the batched cached pass of `policy.model` (fp32, CPU) for n_slots x (1..max_pass) to `path`.

    Checked with onnx.checker (full check). Returns `path`. Raises torch.onnx.errors.OnnxExporterError if export
    fails and onnx.checker.ValidationError if the exported model is invalid."""
    path = Path(path)
    cfg = policy.cfg
    model = ActionTransformer(cfg).eval()
    model.load_state_dict(policy.model.state_dict())
    shape = (n_slots, cfg.n_heads, cfg.seq_len + max_pass, cfg.d_model // cfg.n_heads)
    caches = [[torch.zeros(shape) for _ in range(cfg.n_layers)] for _ in "kv"]
    # distinct tensors: the exporter merges inputs that are one object (tokens and pos would become one input)
    rows = [torch.zeros(n_slots, max_pass, dtype=torch.long) for _ in range(2)]
    example = (torch.zeros(n_slots, cfg.obs_dim), *rows, rows[0] + cfg.seq_len, *caches)
    dynamic = None  # max_pass 1: the one width; else T in 1..max_pass (traced at max_pass: a 1 would be specialised)
    if max_pass > 1:
        seq = torch.export.Dim("T", min=1, max=max_pass)
        dynamic = (None, {1: seq}, {1: seq}, {1: seq}, [None] * cfg.n_layers, [None] * cfg.n_layers)
    torch.onnx.export(BatchedStep(model).eval(), example, path, dynamo=True, external_data=False,
                      opset_version=opset, input_names=input_names(cfg.n_layers),
                      output_names=output_names(cfg.n_layers),
                      verbose=False, dynamic_shapes=dynamic)
    onnx.checker.check_model(onnx.load(path), full_check=True)
    return path
