"""The target's cached pass over a batch of KV-cache slots, each row at its own positions (a fleet's batched pass).

ActionTransformer.step takes one input_pos shared by the batch; a fleet needs each sequence at its own positions.
`batched_step` is the same arithmetic (the model's own modules: embeddings, blocks, head) with per-row positions:

    obs        float32 (B, obs_dim)     row b's observation, embedded where pos[b, i] == 0
    tokens     int64   (B, T)           action token at each (row, place)
    pos        int64   (B, T)           its sequence position: position embedding and causal mask
    write      int64   (B, T)           the cache column its key/value go to: pos for a real token; a scratch
                                        column >= seq_len for padding (engines/backends/slot_rows.py)
    k_cache, v_cache float32 (L, B, H, S, Dh), S = seq_len + scratch columns, or a sequence of L (B, H, S, Dh)
    -> logits (B, T, n_bins) [, k_cache_out, v_cache_out: lists of L (B, H, S, Dh) with inplace=False, the form
       exported to ONNX, one input and output per layer so the graph copies each cache once, in its write]

A query at (b, i) attends to columns <= pos[b, i] of row b's cache, and to its own write column (so a padding query,
at position 0, never sees an empty row and no NaN is made). Real queries never see a scratch column: those hold
whatever the padding wrote, multiplied by a softmax weight of exactly 0.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from edgeinfer.engines.models.model import ActionTransformer


def batched_step(model: ActionTransformer, obs: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor,
                 write: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, inplace: bool = True):
    """One cached pass with per-row positions (module docstring). inplace=True writes the caches and returns the
    logits; inplace=False returns (logits, k_cache_out, v_cache_out) and leaves the inputs untouched."""
    b, t = tokens.shape
    x = torch.where((pos == 0)[:, :, None], model.obs_proj(obs)[:, None, :], model.tok_emb(tokens))
    x = x + model.pos_emb(pos)
    cols = torch.arange(k_cache[0].shape[2], device=pos.device)
    mask = ((cols <= pos[:, :, None]) | (cols == write[:, :, None]))[:, None]  # (B, 1, T, S)
    c = x.shape[-1]
    n_heads = model.cfg.n_heads
    at = (torch.arange(b, device=pos.device)[:, None, None], torch.arange(n_heads, device=pos.device)[:, None],
          write[:, None, :])  # (B, H, T) index tuples into (B, H, S): where each row's key goes
    ks, vs = [], []
    for layer, blk in enumerate(model.blocks):
        q, k, v = blk.qkv(blk.ln1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, n_heads, c // n_heads).transpose(1, 2) for z in (q, k, v))
        # whole head_dim vectors at (b, h, write) (ONNX ScatterND; a per-element scatter cost more than the step)
        if inplace:
            kc, vc = k_cache[layer].index_put_(at, k), v_cache[layer].index_put_(at, v)
        else:
            kc, vc = k_cache[layer].index_put(at, k), v_cache[layer].index_put(at, v)
            ks.append(kc)
            vs.append(vc)
        y = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask)
        x = x + blk.proj(y.transpose(1, 2).reshape(b, t, c))
        x = x + blk.mlp(blk.ln2(x))
    logits = model.head(model.ln_f(x))
    return logits if inplace else (logits, ks, vs)


class BatchedStep(nn.Module):
    """forward(obs, tokens, pos, write, k_caches, v_caches) -> (logits, k_out_0, .., k_out_{L-1}, v_out_0, ..):
    the functional batched_step of `model` on lists of L per-layer caches, the form the ONNX exporter traces
    (engines/backends/onnx_export_batched.py)."""

    def __init__(self, model: ActionTransformer):
        super().__init__()
        self.model = model

    def forward(self, obs, tokens, pos, write, k_caches: list, v_caches: list):
        logits, ks, vs = batched_step(self.model, obs, tokens, pos, write, k_caches, v_caches, inplace=False)
        return logits, *ks, *vs
