"""Offline evaluation of a policy on recorded windows: batched target-only greedy decoding and action error."""
from __future__ import annotations

import numpy as np
import torch

from edgeinfer.engines.models.dct_tokenizer import constant_velocity_rad
from edgeinfer.engines.models.model import ActionTransformer
from edgeinfer.engines.models.policy import feature_increment
from edgeinfer.engines.models.tokenizer import decode_chunk, encode_chunk


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


def evaluate_policy(policy, feats: np.ndarray, offsets: np.ndarray, batch: int = 4096, units: np.ndarray | None = None,
                    block_windows: int = 1, seed: int = 0) -> dict:
    """Held-out metrics: greedy action RMSE (rad) against the recorded future, token accuracy, and the
    RMSE of two model-free baselines (hold position; constant velocity from the last chunk step). With units
    (N,) (the held-out unit of each window), also "heldout": heldout_comparison's intervals and verdict.
    The *_per_prefix lists give, for r = 1..H verified rows (r*D tokens), the RMSE of what those rows decode
    against the recorded future over the steps they decode: the first r steps for step tokens, the whole
    horizon for DCT tokens (engines/models/dct_tokenizer.py), of the greedy tokens and of the tokenized future."""
    tokens = greedy_tokens(policy, feats, batch)
    inc = feature_increment(feats)  # q - q_prev: the increment over the last chunk step
    pred = decode_chunk(policy.tokenizer, tokens, inc)
    d = offsets.shape[2]
    ref_tokens = encode_chunk(policy.tokenizer, offsets, inc)
    rmse = lambda e: float(np.sqrt(np.mean(e ** 2)))  # noqa: E731

    def per_prefix(tok: np.ndarray) -> list[float]:
        decoded = [decode_chunk(policy.tokenizer, tok[:, :r * d], inc) for r in range(1, offsets.shape[1] + 1)]
        return [rmse(x - offsets[:, :x.shape[1]]) for x in decoded]

    metrics = {
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
    if units is not None:
        metrics["heldout"] = heldout_comparison(pred, offsets, inc, units, block_windows, seed)
    return metrics


# The held-out verdict: the policy against the two model-free baselines, with 95 % intervals.
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_MIN_UNITS = 10  # from this many held-out units on, resample whole units (episodes, files)


def heldout_comparison(pred: np.ndarray, offsets: np.ndarray, inc: np.ndarray, units: np.ndarray,
                       block_windows: int, seed: int = 0) -> dict:
    """The policy's held-out action RMSE against holding still (offsets 0) and constant velocity
    (dct_tokenizer.constant_velocity_rad), each with a 95 % percentile bootstrap interval, and the verdict.

    pred, offsets (N, H, D) rad; inc (N, D) rad, the last chunk-step increment of each window; units (N,) int,
    the held-out unit of each window. Windows next to each other share most of their future, so they are not
    independent: the bootstrap resamples whole units when there are at least BOOTSTRAP_MIN_UNITS, else
    non-overlapping blocks of `block_windows` consecutive windows inside one unit (a moving-block bootstrap,
    Kunsch 1989; block_windows = horizon x stride, the span over which two windows' futures overlap). Every
    resample is paired: the differences policy - baseline are resampled together, and the policy counts as
    better than a baseline only when the whole 95 % interval of its difference lies below 0.

    Returns {"windows", "resampled": "units" | "blocks of K windows", "n_resampled", "policy_rmse_rad",
    "hold_rmse_rad", "const_velocity_rmse_rad" (each {"value", "ci95": [lo, hi]}), "policy_minus_<baseline>_rad"
    ({"value", "ci95"}), "better_than": [baselines], "verdict": "better than both baselines" | "NOT better than
    <baselines>"}. Raises ValueError for no window."""
    if not len(pred):
        raise ValueError("heldout_comparison: no held-out window")
    errors = {"policy": pred - offsets, "hold": -offsets,
              "const_velocity": constant_velocity_rad(inc, offsets.shape[1]) - offsets}
    sse = {k: (e ** 2).reshape(len(e), -1).sum(1) for k, e in errors.items()}  # (N,) squared error per window
    n_values = offsets[0].size
    groups = _bootstrap_groups(units, block_windows)
    n_groups = int(groups.max()) + 1
    group_sse = {k: np.bincount(groups, v, n_groups) for k, v in sse.items()}
    group_n = np.bincount(groups, minlength=n_groups) * n_values
    idx = np.random.default_rng(seed).integers(0, n_groups, (BOOTSTRAP_RESAMPLES, n_groups))
    boot = {k: np.sqrt(v[idx].sum(1) / group_n[idx].sum(1)) for k, v in group_sse.items()}  # (R,)
    point = {k: float(np.sqrt(v.sum() / group_n.sum())) for k, v in group_sse.items()}

    def ci(x: np.ndarray) -> list[float]:
        return [float(v) for v in np.percentile(x, [2.5, 97.5])]

    by_units = len(np.unique(units)) >= BOOTSTRAP_MIN_UNITS
    out = {"windows": int(len(pred)), "resampled": "units" if by_units else f"blocks of {block_windows} windows",
           "n_resampled": n_groups}
    out |= {f"{k}_rmse_rad": {"value": point[k], "ci95": ci(boot[k])} for k in boot}
    better = []
    for base in ("hold", "const_velocity"):
        diff = {"value": point["policy"] - point[base], "ci95": ci(boot["policy"] - boot[base])}
        out[f"policy_minus_{base}_rad"] = diff
        if diff["ci95"][1] < 0:
            better.append(base)
    worse = [b for b in ("hold", "const_velocity") if b not in better]
    out["better_than"] = better
    out["verdict"] = ("better than both baselines" if not worse else
                      "NOT better than " + " or ".join(b.replace("_", " ") for b in worse))
    return out


def _bootstrap_groups(units: np.ndarray, block_windows: int) -> np.ndarray:
    """(N,) int group of each window: its unit's index when there are at least BOOTSTRAP_MIN_UNITS units, else
    its block of block_windows consecutive windows inside its unit."""
    _, unit_index = np.unique(units, return_inverse=True)
    if unit_index.max() + 1 >= BOOTSTRAP_MIN_UNITS:
        return unit_index
    starts = np.r_[0, np.flatnonzero(np.diff(unit_index)) + 1]  # windows come in unit order
    position = np.arange(len(units)) - np.repeat(starts, np.diff(np.r_[starts, len(units)]))
    block = position // max(1, block_windows)
    key = unit_index * (int(block.max()) + 1) + block
    return np.unique(key, return_inverse=True)[1]


def heldout_lines(cmp: dict) -> list[str]:
    """The comparison as printed by `edgeinfer train`: one line per error (mrad, 95 % interval), the verdict."""
    def fmt(x: dict) -> str:
        return f"{1e3 * x['value']:.3f} mrad [95% CI {1e3 * x['ci95'][0]:.3f}, {1e3 * x['ci95'][1]:.3f}]"
    return [f"held-out action RMSE over {cmp['windows']} windows (bootstrap over {cmp['resampled']}, "
            f"{cmp['n_resampled']} of them):",
            f"  policy          {fmt(cmp['policy_rmse_rad'])}",
            f"  hold still      {fmt(cmp['hold_rmse_rad'])}  (policy - hold: {fmt(cmp['policy_minus_hold_rad'])})",
            f"  const velocity  {fmt(cmp['const_velocity_rmse_rad'])}  (policy - const velocity: "
            f"{fmt(cmp['policy_minus_const_velocity_rad'])})",
            f"  verdict: {cmp['verdict']}"]
