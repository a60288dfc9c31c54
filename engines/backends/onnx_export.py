"""Export the target's cached step to ONNX with explicit KV-cache inputs and outputs.

Graph signature (batch 1; T is the dynamic axis "T", 1 <= T <= seq_len; L = n_layers, H = n_heads,
S = seq_len, Dh = d_model / n_heads):

    inputs   obs          float32 (1, obs_dim)        normalised observation, used where input_pos == 0
             tokens       int64   (1, T)              action token at each position (ignored at position 0)
             input_pos    int64   (T,)                ascending, contiguous sequence positions
             k_cache      float32 (L, 1, H, S, Dh)    keys written so far (by position)
             v_cache      float32 (L, 1, H, S, Dh)    values written so far
    outputs  logits       float32 (1, T, n_bins)      row i predicts action token input_pos[i]
             k_cache_out  float32 (L, 1, H, S, Dh)    k_cache with positions input_pos overwritten
             v_cache_out  float32 (L, 1, H, S, Dh)    v_cache likewise

The graph is ActionTransformer.step(..., inplace=False) traced by torch.export and translated by the
dynamo exporter (onnxscript); the weights are stored inside the one .onnx file.
"""
from __future__ import annotations

from pathlib import Path

import onnx
import torch
from torch import nn

from edgeinfer.engines.models.model import ActionTransformer

INPUT_NAMES = ("obs", "tokens", "input_pos", "k_cache", "v_cache")
OUTPUT_NAMES = ("logits", "k_cache_out", "v_cache_out")


class CachedStep(nn.Module):
    """forward(obs, tokens, input_pos, k_cache, v_cache) -> (logits, k_cache_out, v_cache_out): the functional
    cached pass of `model` (see the module docstring for shapes), the form the exporter traces."""

    def __init__(self, model: ActionTransformer):
        super().__init__()
        self.model = model

    def forward(self, obs, tokens, input_pos, k_cache, v_cache):
        return self.model.step(obs, tokens, input_pos, k_cache, v_cache, inplace=False)


def export_onnx(policy, path: Path | str, opset: int = 18, model: ActionTransformer | None = None) -> Path:
    """Write the cached step of `policy.model` (fp32, CPU; or of `model`, e.g. a fake-quantised copy of it)
    to `path` as one self-contained ONNX file.

    The exported model is checked with onnx.checker (full check, with shape inference). Returns `path`.
    Raises torch.onnx.errors.OnnxExporterError if export fails and onnx.checker.ValidationError if the
    exported model is invalid. Takes about 4 s on a 2-core CPU (cache the result: engines/backends/cache.py).
    """
    path = Path(path)
    cfg = policy.cfg
    if model is None:
        model = ActionTransformer(cfg).eval()
        model.load_state_dict(policy.model.state_dict())
    t = 3  # example length; the exported graph takes any T in 1..seq_len
    k_cache, v_cache = model.empty_cache()
    example = (torch.zeros(1, cfg.obs_dim), torch.zeros(1, t, dtype=torch.long), torch.arange(t), k_cache, v_cache)
    seq = torch.export.Dim("T", min=1, max=cfg.seq_len)
    torch.onnx.export(
        CachedStep(model).eval(), example, path, dynamo=True, external_data=False, opset_version=opset,
        input_names=list(INPUT_NAMES), output_names=list(OUTPUT_NAMES), verbose=False,
        dynamic_shapes={"obs": None, "tokens": {1: seq}, "input_pos": {0: seq}, "k_cache": None, "v_cache": None},
    )
    onnx.checker.check_model(onnx.load(path), full_check=True)
    return path
