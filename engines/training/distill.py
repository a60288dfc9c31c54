"""Distil a small draft model from the target, for the `learned` drafter (engines/models/drafters.py).

    edgeinfer distill --target out/policies/reachy2_lerobot_v30_target.json --seed 0

The student is an ActionTransformer of a smaller config with the target's observation layout, horizon,
tokenizer and normalisation, so that its tokens mean the target's. Data: the real observations of the
target's TRAINING units (by default the data, reader options and split its manifest records; the Schunk
recordings with their fixed split for the shipped target, whose manifest has no "data"; engines/training/fit_data.py),
each with the target's own greedy chunk
(teacher forcing on the tokens the drafter will have to predict). Loss: KL(target || draft) over the
n_bins logits at every position, the target's logits from one cache-free batched pass (`model(obs, tokens)`)
per step. Distillation for drafters: DistillSpec (Zhou et al. 2024, arXiv 2310.08461).

Metrics, on the held-out units: teacher-forced agreement with the target's greedy tokens, and the
acceptance rate of greedy drafts at k drafts per target pass, which follows exactly from those agreements
(a draft is kept iff the ones before it were and it equals the target's token; see acceptance_at_k).
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from edgeinfer.core.progress import Progress, say
from edgeinfer.engines.models.drafters import early_exit_policy
from edgeinfer.engines.models.model import ActionTransformer
from edgeinfer.engines.models.policy import Policy
from edgeinfer.engines.training.evaluate import greedy_decode_batch
from edgeinfer.engines.training.fit_config import DistillConfig  # noqa: F401  (its config: `edgeinfer distill`)
from edgeinfer.engines.training.fit_data import SCHUNK_DATA, FitData, load_fit_data
from edgeinfer.engines.training.train import warmup_fraction


def target_tokens(model: ActionTransformer, obs: torch.Tensor, batch: int = 4096) -> torch.Tensor:
    """The target's greedy chunks (N, n_tokens) int64 of obs (N, obs_dim) float32 (batched, cached)."""
    return torch.as_tensor(np.concatenate([greedy_decode_batch(model, obs[i:i + batch])
                                           for i in range(0, len(obs), batch)]))


@torch.no_grad()
def teacher_log_probs(model: ActionTransformer, obs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The target's log-probabilities (N, n_tokens, n_bins), stored float16 (230 MB for the 37k Schunk
    training windows), fed tokens (N, n_tokens) before each position: one cache-free pass per 1024."""
    return torch.cat([F.log_softmax(model(obs[i:i + 1024], tokens[i:i + 1024, :-1]), -1).half()
                      for i in range(0, len(obs), 1024)])


@torch.inference_mode()
def agreement(draft: ActionTransformer, obs: torch.Tensor, tokens: torch.Tensor, batch: int = 4096) -> np.ndarray:
    """(N, n_tokens) bool: the draft's argmax at position p, fed the target's tokens before p, equals the
    target's token p."""
    return np.concatenate([(draft(obs[i:i + batch], tokens[i:i + batch, :-1]).argmax(-1)
                            == tokens[i:i + batch]).numpy() for i in range(0, len(obs), batch)])


def acceptance_at_k(agree: np.ndarray, k: int) -> dict:
    """Greedy speculative decoding with k drafts per target pass, replayed from teacher-forced agreement
    agree (N, n_tokens) bool: the prefill commits token 0; each pass drafts min(k, n - c - 1) tokens after
    c committed ones, keeps the leading agreeing drafts (while they agree, the drafter was fed exactly the
    target's tokens, so its draft is the teacher-forced one) and adds the target's token.
    Returns {"acceptance_rate", "tokens_per_pass"} (tokens per target pass, prefill included)."""
    n = agree.shape[1]
    drafted = accepted = passes = 0
    for row in agree:
        c, passes = 1, passes + 1
        while c < n:
            kk = min(k, n - c - 1)
            a = 0
            while a < kk and row[c + a]:
                a += 1
            drafted, accepted, passes, c = drafted + kk, accepted + a, passes + 1, c + a + 1
    return {"acceptance_rate": accepted / drafted, "tokens_per_pass": n * len(agree) / passes}


def student(target: Policy, cfg: DistillConfig) -> ActionTransformer:
    """The untrained draft: with cfg.init_from, a copy of that policy's model (trained on the same task: a good
    start); else the target's shape with cfg's d_model/n_layers/n_heads, and with init_from_target the target's
    first n_layers blocks with its embeddings, ln_f and head (the `early-exit` drafter). Raises ValueError when
    init_from does not share the target's chunk shape, tokenizer and normalisation, or init_from_target does
    not fit the target's shape."""
    if cfg.init_from is not None:
        from edgeinfer.engines.models.policy import load_policy

        start = load_policy(cfg.init_from)
        same = ("obs_dim", "n_joints", "horizon", "n_bins")
        if any(getattr(start.cfg, f) != getattr(target.cfg, f) for f in same) or \
                start.tokenizer.state_dict() != target.tokenizer.state_dict() or \
                not (np.allclose(start.feat_mean, target.feat_mean) and np.allclose(start.feat_std, target.feat_std)):
            raise ValueError(f"--init-from {cfg.init_from} does not share the target's {same}, tokenizer and "
                             "normalisation")
        return start.model.train()
    if not cfg.init_from_target:
        return ActionTransformer(dataclasses.replace(target.cfg, d_model=cfg.d_model, n_layers=cfg.n_layers,
                                                     n_heads=cfg.n_heads))
    if (cfg.d_model, cfg.n_heads) != (target.cfg.d_model, target.cfg.n_heads):
        raise ValueError(f"init_from_target needs the target's d_model={target.cfg.d_model} and "
                         f"n_heads={target.cfg.n_heads}, got {cfg.d_model} and {cfg.n_heads}")
    return early_exit_policy(target, cfg.n_layers).model.train()


def target_data(target: Policy, cfg: DistillConfig) -> FitData:
    """The data a draft of `target` is distilled on: cfg.data read with cfg's reader options and --held-out
    when given; else the data the target's manifest records (source, format, reader options, --held-out),
    which must still give the target's split; else (the shipped target has no "data") the Schunk recordings.
    Raises ValueError when the recorded data now splits differently, and as load_fit_data."""
    if cfg.data is not None:
        return load_fit_data(cfg)
    recorded = target.manifest.get("data")
    if recorded is None:
        return load_fit_data(dataclasses.replace(cfg, data=SCHUNK_DATA))
    split = recorded["split"]
    fmt = recorded["format"] if "+" not in recorded["format"] else None  # a folder of several formats: detect
    source = Path(recorded.get("source_resolved") or recorded["source"])  # "source" is as given, maybe relative
    data = load_fit_data(dataclasses.replace(cfg, data=source, log_format=fmt,
                                             held_out=split["held_out_option"], **recorded["reader_options"]))
    now = data.manifest(0, 0)["split"]
    if (now["train"], now["held_out"]) != (split["train"], split["held_out"]):
        raise ValueError(f"{recorded['source']} no longer splits as the target {cfg.target} was trained "
                         f"(held out now {now['held_out']}, then {split['held_out']}); pass --data")
    return data


def distill(target: Policy, cfg: DistillConfig) -> Policy:
    """Train the draft model, measure it on the held-out units, save it to cfg.out (Policy.save format with
    "distilled_from": the target's weights sha256, and "metrics_held_out"); returns it. About 3 minutes on
    a 2-core CPU with the defaults on the Schunk recordings. Raises as target_data for data it cannot use."""
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    t0 = time.monotonic()
    data = target_data(target, cfg)
    feats, _ = data.windows("train", target.cfg.horizon, target.cfg.stride_ticks)
    x = torch.as_tensor(target.normalise(feats))
    say(None, f"distill: labelling {len(x)} training windows with the target's greedy chunks and log-probabilities "
              "(minutes for a large target)")
    y = target_tokens(target.model, x)
    log_p_all = teacher_log_probs(target.model, x, y)
    label_s = time.monotonic() - t0
    model = student(target, cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=cfg.steps,
                                                pct_start=warmup_fraction(cfg.steps))
    with Progress("distilling draft", total=cfg.steps) as progress:
        for _ in range(cfg.steps):
            idx = torch.as_tensor(rng.integers(0, len(x), cfg.batch_size))
            log_p = log_p_all[idx].float()
            log_q = F.log_softmax(model(x[idx], y[idx, :-1]), -1)
            loss = (log_p.exp() * (log_p - log_q)).sum(-1).mean()  # KL(p || q) per position, nats
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            progress.advance(detail=f"KL {loss.item():.3f}")
    model.eval()
    ho_feats, _ = data.windows("held_out", target.cfg.horizon, target.cfg.stride_ticks)
    ho_x = torch.as_tensor(target.normalise(ho_feats))
    say(None, f"distill: measuring the draft on {len(ho_x)} held-out windows")
    agree = agreement(model, ho_x, target_tokens(target.model, ho_x))
    metrics = {"windows": int(len(ho_x)), "teacher_forced_agreement": float(agree.mean()), "k": cfg.eval_k,
               **acceptance_at_k(agree, cfg.eval_k)}
    draft = Policy(model, target.tokenizer, target.feat_mean, target.feat_std, manifest={})
    draft.save(cfg.out, {
        "distilled_from": target.manifest["sha256"],
        "data": data.manifest(len(x), len(ho_x)),
        "distill": {"seed": cfg.seed, "steps": cfg.steps, "batch_size": cfg.batch_size, "lr": cfg.lr,
                    "init_from_target": cfg.init_from_target and cfg.init_from is None,
                    "init_from": str(cfg.init_from) if cfg.init_from is not None else None,
                    "loss": "KL(target || draft), teacher forcing on the target's greedy tokens",
                    "final_kl": float(loss.item()), "label_seconds": round(label_s, 1),
                    "seconds": round(time.monotonic() - t0, 1), "torch": torch.__version__},
        "metrics_held_out": metrics,
    })
    return draft
