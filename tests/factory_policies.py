"""Factories of small policies that break the model protocol, for tests/test_factory_policy.py: the manifests it
writes name them by path ("<this file>:recurrent"), as a user's manifest names its own factory."""
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from edgeinfer.engines.models.factory import FactoryPolicyConfig, PolicyParts
from edgeinfer.engines.models.policy import Normaliser
from edgeinfer.engines.models.tokenizer import ActionTokenizer

D = 16  # model width
LATE = 7  # LateStaleCache adds instead of writing from this position on (past the old self-test's positions 0..6)
WINDOW = 8  # SlidingWindowCache's attention window and ring size, positions


def _parts(model: nn.Module, config: FactoryPolicyConfig) -> PolicyParts:
    """model with N(0, 0.5) weights (logits that a stale state moves visibly), an ActionTokenizer of +-10 mrad
    per step and the built-in features unnormalised."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    d = config.n_joints
    return PolicyParts(model.eval(), ActionTokenizer(np.full(d, -0.01), np.full(d, 0.01), config.n_bins),
                       Normaliser(np.zeros(3 * d), np.ones(3 * d)))


class RecurrentPolicy(nn.Module):
    """A GRU over [observation, action tokens]; its state (B, D) is the cache (kind "functional"), started from
    the observation at position 0: a state cannot rewind, so a rejected draft stays in it."""

    prefix_kind, cache_kind = "obs", "functional"

    def __init__(self, obs_dim: int, n_bins: int):
        super().__init__()
        self.obs_proj, self.emb = nn.Linear(obs_dim, D), nn.Embedding(n_bins, D)
        self.cell, self.head = nn.GRUCell(D, D), nn.Linear(D, n_bins)

    def empty_cache(self, batch, dtype, device):
        return (torch.zeros(batch, D, dtype=dtype, device=device),)

    def step(self, obs, tokens, input_pos, h):
        rows = []
        for t in range(tokens.shape[1]):
            first = int(input_pos[t]) == 0
            h = self.cell(self.obs_proj(obs) if first else self.emb(tokens[:, t]), torch.zeros_like(h) if first else h)
            rows.append(self.head(h))
        return torch.stack(rows, 1), h


class LateStaleCache(nn.Module):
    """One attention layer over [observation, action tokens], its static cache (k, v) (B, seq_len, D) written by
    position, except that from position LATE on a pass adds to the entry instead of overwriting it: a rejected
    draft there stays in the cache. The self-test decodes positions 0..6 only and passes it."""

    prefix_kind, cache_kind = "obs", "static"

    def __init__(self, obs_dim: int, n_bins: int, seq_len: int):
        super().__init__()
        self.obs_proj, self.emb, self.pos = nn.Linear(obs_dim, D), nn.Embedding(n_bins, D), nn.Embedding(seq_len, D)
        self.qkv, self.head = nn.Linear(D, 3 * D), nn.Linear(D, n_bins)
        self.seq_len = seq_len

    def empty_cache(self, batch, dtype, device):
        z = torch.zeros(batch, self.seq_len, D, dtype=dtype, device=device)
        return z, z.clone()

    def step(self, obs, tokens, input_pos, k_cache, v_cache):
        x = torch.where((input_pos == 0)[None, :, None], self.obs_proj(obs)[:, None], self.emb(tokens))
        x = x + self.pos(input_pos)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        late = input_pos >= LATE
        for cache, new in ((k_cache, k), (v_cache, v)):
            cache[:, input_pos[~late]] = new[:, ~late]
            cache[:, input_pos[late]] += new[:, late]
        mask = torch.arange(self.seq_len)[None, :] <= input_pos[:, None]
        return self.head(x + F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask))


class SlidingWindowCache(nn.Module):
    """One sliding-window attention layer (a query at p sees positions p - WINDOW + 1..p) over [observation, action
    tokens], with a rotating cache as mlx-lm's RotatingKVCache: a ring of WINDOW slots (position j in slot
    j % WINDOW) and the count of positions held, cache kind "append". A pass attends to the ring's positions and
    its own, then writes its entries into the ring, so target-only decoding and multi-token passes are exact;
    truncate_cache only moves the count back, as a ring cannot bring back the entries a rejected draft overwrote.
    It decodes exactly until a rejected draft overwrites an entry still inside the window: from position
    WINDOW - 1 on."""

    prefix_kind, cache_kind = "obs", "append"

    def __init__(self, obs_dim: int, n_bins: int, seq_len: int):
        super().__init__()
        self.obs_proj, self.emb, self.pos = nn.Linear(obs_dim, D), nn.Embedding(n_bins, D), nn.Embedding(seq_len, D)
        self.qkv, self.head = nn.Linear(D, 3 * D), nn.Linear(D, n_bins)

    def empty_cache(self, batch, dtype, device):
        ring = torch.zeros(batch, WINDOW, D, dtype=dtype, device=device)
        return ring, ring.clone(), 0  # k ring, v ring, positions held

    def step(self, obs, tokens, input_pos, k_ring, v_ring, held):
        x = torch.where((input_pos == 0)[None, :, None], self.obs_proj(obs)[:, None], self.emb(tokens))
        x = x + self.pos(input_pos)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        old = torch.arange(max(0, held - WINDOW), held)  # the positions the ring holds, as far as it knows
        keys, values = torch.cat([k_ring[:, old % WINDOW], k], 1), torch.cat([v_ring[:, old % WINDOW], v], 1)
        at = torch.cat([old, input_pos])
        mask = (at[None, :] <= input_pos[:, None]) & (at[None, :] > input_pos[:, None] - WINDOW)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        k_ring, v_ring = k_ring.clone(), v_ring.clone()
        last = slice(-WINDOW, None)  # a pass longer than the window keeps its last WINDOW entries
        k_ring[:, input_pos[last] % WINDOW], v_ring[:, input_pos[last] % WINDOW] = k[:, last], v[:, last]
        return self.head(x + y), k_ring, v_ring, int(input_pos[-1]) + 1

    def truncate_cache(self, cache, n):
        k_ring, v_ring, held = cache
        return k_ring, v_ring, min(held, n)


def recurrent(config: FactoryPolicyConfig) -> PolicyParts:
    return _parts(RecurrentPolicy(3 * config.n_joints, config.n_bins), config)


def late_stale_cache(config: FactoryPolicyConfig) -> PolicyParts:
    return _parts(LateStaleCache(3 * config.n_joints, config.n_bins, config.seq_len), config)


def sliding_window_cache(config: FactoryPolicyConfig) -> PolicyParts:
    return _parts(SlidingWindowCache(3 * config.n_joints, config.n_bins, config.seq_len), config)
