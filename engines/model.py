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


@dataclass
class PolicyConfig:
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

    @property
    def n_tokens(self) -> int:
        return self.horizon * self.n_joints

    @property
    def seq_len(self) -> int:
        return 1 + self.n_tokens

    def to_dict(self) -> dict:
        return asdict(self)


class KVCache(nn.Module):
    """Static cache (B, heads, seq_len, head_dim) for one layer, overwritten by position."""

    def __init__(self, batch: int, n_heads: int, seq_len: int, head_dim: int):
        super().__init__()
        self.register_buffer("k", torch.zeros(batch, n_heads, seq_len, head_dim), persistent=False)
        self.register_buffer("v", torch.zeros(batch, n_heads, seq_len, head_dim), persistent=False)

    def update(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        self.k[:, :, input_pos] = k
        self.v[:, :, input_pos] = v
        return self.k, self.v


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
        self.cache: KVCache | None = None

    def forward(self, x: torch.Tensor, input_pos: torch.Tensor | None) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        if self.cache is None:  # training: full causal sequence
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # decoding: attend to every cached position <= the query's own position
            k, v = self.cache.update(input_pos, k, v)
            positions = torch.arange(k.shape[2])
            mask = positions[None, :] <= input_pos[:, None]  # (t, seq_len)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class ActionTransformer(nn.Module):
    """Decoder-only transformer over [obs, action tokens].

    forward(obs, tokens, input_pos) -> logits (B, T, n_bins) float32.
      obs: (B, obs_dim) float32 normalised features, or None when position 0 is not in `input_pos`.
      tokens: (B, T') int64 action tokens for the non-zero positions in `input_pos` (may be empty).
      input_pos: (T,) int64 sequence positions, ascending, contiguous. None means 0..T-1 (training).
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

    def setup_cache(self, batch: int = 1) -> None:
        """Allocate a static KV cache for `batch` sequences of seq_len (enables cached decoding)."""
        hd = self.cfg.d_model // self.cfg.n_heads
        for blk in self.blocks:
            blk.cache = KVCache(batch, self.cfg.n_heads, self.cfg.seq_len, hd)

    def drop_cache(self) -> None:
        for blk in self.blocks:
            blk.cache = None

    def forward(self, obs: torch.Tensor | None, tokens: torch.Tensor,
                input_pos: torch.Tensor | None = None) -> torch.Tensor:
        parts = []
        if obs is not None:
            parts.append(self.obs_proj(obs)[:, None, :])
        if tokens.shape[1]:
            parts.append(self.tok_emb(tokens))
        x = torch.cat(parts, dim=1)
        pos = input_pos if input_pos is not None else torch.arange(x.shape[1])
        x = x + self.pos_emb(pos)
        for blk in self.blocks:
            x = blk(x, input_pos)
        return self.head(self.ln_f(x))
