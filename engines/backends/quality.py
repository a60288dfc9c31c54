"""Quality of an engine against the fp32 target, on held-out real observations: the gate for every
reduced precision (edgeinfer build) and the parity columns of the engine bench.

    token_agreement      fraction of action tokens identical to fp32 target-only greedy decoding, each
                         engine decoding greedily on its own (a flipped token changes what follows)
    max_abs_logit_diff   largest |logit - fp32 logit| over every position, both fed the fp32 tokens
    action_rmse_rad      RMSE of the engine's decoded chunks against the recorded future joint positions
    ref_action_rmse_rad  the same for the fp32 target, so that the two read side by side
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from edgeinfer.core.protocols import Engine
from edgeinfer.engines.models.policy import Policy, feature_increment
from edgeinfer.engines.models.tokenizer import action_rmse_rad
from edgeinfer.engines.training.evaluate import greedy_decode_batch


def greedy_chunk(engine: Engine, obs: np.ndarray, n_tokens: int) -> list[int]:
    """Target-only greedy decoding of one chunk with `engine`: obs (obs_dim,) float32 -> n_tokens ints."""
    tokens = [int(engine.forward(obs, (), 0)[-1].argmax())]
    while len(tokens) < n_tokens:
        tokens.append(int(engine.forward(None, tokens[-1:], len(tokens))[-1].argmax()))
    return tokens


def engine_quality(engine: Engine, policy: Policy, feats: np.ndarray, offsets: np.ndarray,
                   advance: Callable[[], None] = lambda: None) -> dict:
    """Quality figures (see the module docstring) over feats (N, obs_dim) raw features and offsets (N, H, D)
    rad, the recorded future of each window relative to its observed q. advance() is called per observation
    decoded (a progress bar)."""
    x = policy.normalise(feats)
    n = policy.cfg.n_tokens
    ref = greedy_decode_batch(policy.model, torch.as_tensor(x))
    with torch.inference_mode():
        ref_logits = policy.model(torch.as_tensor(x), torch.as_tensor(ref[:, :-1])).numpy()
    tokens = np.zeros_like(ref)
    for i, row in enumerate(x):
        tokens[i] = greedy_chunk(engine, row, n)
        advance()
    max_diff = max(float(np.abs(engine.forward(x[i], ref[i, :-1].tolist(), 0) - ref_logits[i]).max())
                   for i in range(len(x)))
    rmse = lambda t: action_rmse_rad(policy.tokenizer, t, feature_increment(feats), offsets)  # noqa: E731
    return {
        "observations": int(len(x)),
        "token_agreement": float(np.mean(tokens == ref)),
        "max_abs_logit_diff": max_diff,
        "action_rmse_rad": rmse(tokens),
        "ref_action_rmse_rad": rmse(ref),
    }
