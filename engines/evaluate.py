"""Offline evaluation of a policy on recorded windows: batched target-only greedy decoding and action error."""
from __future__ import annotations

import numpy as np
import torch

from edgeinfer.engines.dct_tokenizer import constant_velocity_rad
from edgeinfer.engines.model import ActionTransformer
from edgeinfer.engines.policy import feature_increment
from edgeinfer.engines.tokenizer import decode_chunk, encode_chunk


@torch.inference_mode()
def greedy_decode_batch(model: ActionTransformer, obs: torch.Tensor) -> np.ndarray:
    """Target-only greedy decoding of full chunks for a batch: obs (B, obs_dim) -> tokens (B, H*D) int64.

    One pass per token over the whole batch; used as the reference for speculative decoding's exactness.
    """
    b, n = obs.shape[0], model.cfg.n_tokens
    k_cache, v_cache = model.empty_cache(b)
    tok = torch.zeros(b, dtype=torch.long)
    out = []
    for p in range(n):
        tok = model.step(obs, tok[:, None], torch.tensor([p]), k_cache, v_cache)[:, -1].argmax(-1)
        out.append(tok)
    return torch.stack(out, 1).numpy()


def greedy_tokens(policy, feats: np.ndarray, batch: int = 4096) -> np.ndarray:
    """Target-only greedy tokens (N, H*D) int64 of raw features feats (N, obs_dim), `batch` windows at a time."""
    x = torch.as_tensor(policy.normalise(feats))
    return np.concatenate([greedy_decode_batch(policy.model, x[i:i + batch]) for i in range(0, len(x), batch)])


def evaluate_policy(policy, feats: np.ndarray, offsets: np.ndarray, batch: int = 4096) -> dict:
    """Held-out metrics: greedy action RMSE (rad) against the recorded future, token accuracy, and the
    RMSE of two model-free baselines (hold position; constant velocity from the last chunk step).
    The *_per_prefix lists give, for r = 1..H verified rows (r*D tokens), the RMSE of what those rows decode
    against the recorded future over the steps they decode: the first r steps for step tokens, the whole
    horizon for DCT tokens (engines/dct_tokenizer.py), of the greedy tokens and of the tokenized future."""
    tokens = greedy_tokens(policy, feats, batch)
    inc = feature_increment(feats)  # q - q_prev: the increment over the last chunk step
    pred = decode_chunk(policy.tokenizer, tokens, inc)
    d = offsets.shape[2]
    ref_tokens = encode_chunk(policy.tokenizer, offsets, inc)
    rmse = lambda e: float(np.sqrt(np.mean(e ** 2)))  # noqa: E731

    def per_prefix(tok: np.ndarray) -> list[float]:
        decoded = [decode_chunk(policy.tokenizer, tok[:, :r * d], inc) for r in range(1, offsets.shape[1] + 1)]
        return [rmse(x - offsets[:, :x.shape[1]]) for x in decoded]

    return {
        "windows": int(len(feats)),
        "action_rmse_rad": rmse(pred - offsets),
        "action_rmse_rad_per_step": [rmse(pred[:, h] - offsets[:, h]) for h in range(offsets.shape[1])],
        "token_accuracy_greedy": float(np.mean(tokens == ref_tokens)),
        "action_rmse_rad_per_prefix": per_prefix(tokens),
        "tokenizer_rmse_rad": rmse(decode_chunk(policy.tokenizer, ref_tokens, inc) - offsets),
        "tokenizer_rmse_rad_per_prefix": per_prefix(ref_tokens),
        "baseline_hold_rmse_rad": rmse(offsets),
        "baseline_const_velocity_rmse_rad": rmse(constant_velocity_rad(inc, offsets.shape[1]) - offsets),
    }
