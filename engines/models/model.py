"""Target (and learned drafter) model: a small decoder-only action-token transformer with a static KV cache.

Sequence layout, batch B:
    position 0        : observation embedding (a linear map of the normalised observation features)
    position 1 + i    : action token i (i = 0 .. H*D-1), step-major
Logits at position p predict action token p, so prefill (position 0) yields action token 0.

The KV cache is preallocated at `seq_len` and written by position, as in gpt-fast: rolling back after a
rejected draft needs no copy, because a later pass overwrites those positions before any query can see
them (a query at position p attends to cache positions <= p only).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


class ChunkShape:
    """The token layout of a config with `horizon` (chunk steps) and `n_joints`: n_tokens = horizon * n_joints
    action tokens, step-major, after one observation position (seq_len = 1 + n_tokens)."""

    @property
    def n_tokens(self) -> int:
        return self.horizon * self.n_joints

    @property
    def seq_len(self) -> int:
        return 1 + self.n_tokens


@dataclass
class PolicyConfig(ChunkShape):
    """Shape of the policy. obs_dim features; horizon H steps of n_joints D joints; n_bins per joint."""

    obs_dim: int = 18
    n_joints: int = 6
    horizon: int = 8
    stride_ticks: int = 5  # control ticks between chunk steps (5 x 4 ms = 20 ms at 250 Hz)
    n_bins: int = 64
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be a multiple of n_heads={self.n_heads}")
        for name in ("obs_dim", "n_joints", "horizon", "stride_ticks", "n_bins", "n_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"PolicyConfig.{name} must be >= 1, got {getattr(self, name)}")

    def to_dict(self) -> dict:
        return asdict(self)


# `edgeinfer train --size`: the transformer's shape per size. small is PolicyConfig's default (the shipped
# schunk_target, 0.11 M parameters on the Schunk chunk); large has 3.2 M, where arithmetic, not framework
# dispatch, starts to set an engine's time.
POLICY_SIZES = {
    "small": {"d_model": 64, "n_layers": 2, "n_heads": 4},
    "large": {"d_model": 256, "n_layers": 4, "n_heads": 8},
}


class Block(nn.Module):
    def __init__(self, cfg: PolicyConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        d = cfg.d_model
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, input_pos: torch.Tensor | None = None, k_cache: torch.Tensor | None = None,
                v_cache: torch.Tensor | None = None, inplace: bool = True):
        """Without a cache: full causal attention (training), returns x. With one: the new keys and values are
        written at `input_pos` (in place, or into copies when inplace=False, as an exported graph needs) and each
        query attends to cache positions <= its own; returns (x, k_cache, v_cache)."""
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        if k_cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            if inplace:
                k_cache.index_copy_(2, input_pos, k)
                v_cache.index_copy_(2, input_pos, v)
            else:
                k_cache, v_cache = k_cache.index_copy(2, input_pos, k), v_cache.index_copy(2, input_pos, v)
            mask = torch.arange(k_cache.shape[2], device=x.device)[None, :] <= input_pos[:, None]  # (t, seq_len)
            y = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        x = x + self.mlp(self.ln2(x))
        return x if k_cache is None else (x, k_cache, v_cache)


class ActionTransformer(nn.Module):
    """Decoder-only transformer over [obs, action tokens].

    forward(obs, tokens) -> logits (B, 1 + T, n_bins): cache-free causal pass over the whole sequence (training).
    step(obs, tokens, input_pos, k_cache, v_cache) -> logits (B, T, n_bins): cached pass over positions
      `input_pos` (T,) int64, ascending and contiguous. tokens (B, T) int64 holds the action token at each
      position; at position 0 the observation obs (B, obs_dim) is embedded instead (its token is ignored).
      k_cache, v_cache: (n_layers, B, n_heads, seq_len, head_dim) from `empty_cache`, written by position.
    """

    def __init__(self, cfg: PolicyConfig):
        super().__init__()
        self.cfg = cfg
        self.obs_proj = nn.Linear(cfg.obs_dim, cfg.d_model)
        self.tok_emb = nn.Embedding(cfg.n_bins, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.n_bins)

    def empty_cache(self, batch: int = 1, dtype=torch.float32, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """A static KV cache (k, v), each (n_layers, batch, n_heads, seq_len, head_dim), zeros."""
        c = self.cfg
        shape = (c.n_layers, batch, c.n_heads, c.seq_len, c.d_model // c.n_heads)
        return torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)

    def forward(self, obs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.obs_proj(obs)[:, None, :], self.tok_emb(tokens)], dim=1)
        x = x + self.pos_emb(torch.arange(x.shape[1], device=x.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))

    def step(self, obs: torch.Tensor, tokens: torch.Tensor, input_pos: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor, inplace: bool = True):
        """Cached pass (see the class docstring). inplace=False returns (logits, k_cache, v_cache) with updated
        copies instead of writing the caches: the form exported to ONNX with explicit KV-cache inputs/outputs."""
        x = torch.where((input_pos == 0)[None, :, None], self.obs_proj(obs)[:, None, :], self.tok_emb(tokens))
        x = x + self.pos_emb(input_pos)
        ks, vs = [], []
        for i, blk in enumerate(self.blocks):
            x, k, v = blk(x, input_pos, k_cache[i], v_cache[i], inplace)
            ks.append(k)
            vs.append(v)
        logits = self.head(self.ln_f(x))
        return logits if inplace else (logits, torch.stack(ks), torch.stack(vs))
