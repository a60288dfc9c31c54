"""A llama-style action policy served by edgeinfer through a factory (engines/models/factory.py, docs/byo-policy.md).

The decoder blocks are engines/models/llama.py's (RMSNorm, RoPE, grouped-query attention, SwiGLU); what makes it an
action policy is the prefix: position 0 embeds the normalised observation (a linear map), action token i sits
at position 1 + i, and logits at position p predict action token p (model protocol prefix kind "obs"). The KV
cache is static, written by position, so a rejected draft needs no rollback work.

`build` is the factory the manifest names ("factory": "policy.py:build"): edgeinfer calls it with the
manifest's config and factory_args, then loads the weights into the model it returns.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from edgeinfer.engines.models.factory import FactoryPolicyConfig, PolicyParts
from edgeinfer.engines.models.llama import Layer, LlamaConfig, RMSNorm, rope_table
from edgeinfer.engines.models.policy import Normaliser
from edgeinfer.engines.models.tokenizer import ActionTokenizer


class LlamaActionPolicy(nn.Module):
    """Decoder over [observation, action tokens].

    forward(obs (B, obs_dim) float32, tokens (B, T) int64) -> logits (B, 1 + T, n_bins): cache-free, training.
    step(obs (B, obs_dim), tokens (B, T), input_pos (T,), k_cache, v_cache) -> logits (B, T, n_bins): cached
      pass over ascending contiguous positions; the observation is embedded wherever input_pos == 0.
      k_cache, v_cache (n_layers, B, n_kv_heads, seq_len, head_dim) from empty_cache, written by position.
    """

    prefix_kind = "obs"
    cache_kind = "static"

    def __init__(self, obs_dim: int, n_bins: int, seq_len: int, d_model: int = 64, n_layers: int = 2,
                 n_heads: int = 4, n_kv_heads: int = 2, d_ff: int = 172):
        super().__init__()
        self.cfg = LlamaConfig(vocab_size=n_bins, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                               n_kv_heads=n_kv_heads, d_ff=d_ff, max_seq_len=seq_len)
        self.obs_proj = nn.Linear(obs_dim, d_model)
        self.tok_emb = nn.Embedding(n_bins, d_model)
        self.layers = nn.ModuleList(Layer(self.cfg) for _ in range(n_layers))
        self.norm = RMSNorm(d_model, self.cfg.norm_eps)
        self.head = nn.Linear(d_model, n_bins, bias=False)
        self.register_buffer("rope", rope_table(self.cfg), persistent=False)
        # row p: 0 at positions <= p, -inf after (cache entries past a query are stale or empty)
        self.register_buffer("causal_bias", torch.full((seq_len, seq_len), float("-inf")).triu(1), persistent=False)

    def _embed(self, obs: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return torch.where((pos == 0)[None, :, None], self.obs_proj(obs)[:, None, :], self.tok_emb(tokens))

    def forward(self, obs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1] + 1, device=tokens.device)
        x = self._embed(obs, nn.functional.pad(tokens, (1, 0)), pos)
        rot = torch.view_as_complex(self.rope[pos, None].float())
        for layer in self.layers:
            x = layer(x, rot)
        return self.head(self.norm(x))

    def empty_cache(self, batch: int = 1, dtype: torch.dtype = torch.float32, device=None):
        c = self.cfg
        shape = (c.n_layers, batch, c.n_kv_heads, c.max_seq_len, c.head_dim)
        return torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)

    def step(self, obs: torch.Tensor, tokens: torch.Tensor, input_pos: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor) -> torch.Tensor:
        x = self._embed(obs, tokens, input_pos)
        rot = torch.view_as_complex(self.rope[input_pos, None].float())  # (T, 1, head_dim / 2)
        mask = self.causal_bias[input_pos]  # (T, seq_len)
        for i, layer in enumerate(self.layers):
            x = layer(x, rot, input_pos, mask, k_cache[i], v_cache[i])
        return self.head(self.norm(x))


def build(config: FactoryPolicyConfig, *, tokenizer: dict, feat_mean: list[float], feat_std: list[float],
          **shape) -> PolicyParts:
    """The factory: the model (shape: LlamaActionPolicy's d_model, n_layers, n_heads, n_kv_heads, d_ff), the
    action tokenizer (an ActionTokenizer state dict) and the normalisation of the built-in policy's features
    (q, qd, q - q_prev; mean and std (3D,))."""
    model = LlamaActionPolicy(3 * config.n_joints, config.n_bins, config.seq_len, **shape)
    return PolicyParts(model, ActionTokenizer.from_state_dict(tokenizer),
                       Normaliser(np.array(feat_mean), np.array(feat_std)))
