"""Train the target policy on any logs the replayer reads, reproducibly from a seed.

    edgeinfer train --data ../shared/data/schunk_lwa4p --seed 0           # the Schunk recordings
    edgeinfer train --data ../shared/data/reachy2_lerobot_v30 --held-out 2  # a LeRobot dataset, episode 2 held out

Data and split: engines/training/fit_data.py (episodes, files or runs are units; held-out units are never trained on
and give the metrics). Loss: next-token cross-entropy with teacher forcing over [observation, action tokens].
The manifest (out/policies/<data name>_target.json by default) records the data, its split, the joint limits
fitted on the training part, the control rate, the training run and the held-out metrics; "heldout" compares the
policy with holding still and constant velocity (95 % intervals) and gives the verdict, printed with a warning
when the policy is not better than both.
"""
from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console

from edgeinfer.core.progress import Progress, say
from edgeinfer.engines.models.dct_tokenizer import DctTokenizer
from edgeinfer.engines.models.model import POLICY_SIZES, ActionTransformer, PolicyConfig
from edgeinfer.engines.models.policy import Policy, feature_increment
from edgeinfer.engines.models.tokenizer import ActionTokenizer, encode_chunk
from edgeinfer.engines.training.dataset import step_increments
from edgeinfer.engines.training.evaluate import evaluate_policy, heldout_lines
from edgeinfer.engines.training.fit_config import MAX_HORIZON, FitConfig, TrainConfig, warmup_fraction  # noqa: F401
from edgeinfer.engines.training.fit_data import default_horizon, default_stride_ticks, load_fit_data


def train(cfg: TrainConfig, console: Console | None = None) -> Policy:
    """Train, evaluate on the held-out units, and save weights + manifest to cfg.out (its folder is created).

    Prints (on `console`) what the data's metadata claims when the files hold less, and the held-out action
    RMSE against holding still and constant velocity with 95 % intervals (engines/evaluate.heldout_comparison),
    with a warning when the policy is not better than both; the manifest records them ("heldout", and "data"
    "warnings"). Raises as engines.fit_data.load_fit_data for data it cannot use."""
    console = console or Console()
    say(console, f"train: reading {cfg.data}")
    data = load_fit_data(cfg)
    for warning in data.warnings:
        say(console, f"data: {warning}", "yellow")
    cfg.out.parent.mkdir(parents=True, exist_ok=True)  # fail before training, not after, if it cannot be made
    stride = cfg.stride_ticks or default_stride_ticks(data.rate_hz)
    horizon = cfg.horizon or default_horizon(stride / data.rate_hz, data.n_joints)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    feats, offsets = data.windows("train", horizon, stride)
    increment = feature_increment(feats)
    tokenizer = (DctTokenizer.fit(offsets, increment, cfg.n_bins) if cfg.tokenizer == "dct"
                 else ActionTokenizer.fit(step_increments(offsets), cfg.n_bins))
    mean, std = feats.mean(0), feats.std(0) + 1e-6
    x = torch.as_tensor((feats - mean) / std, dtype=torch.float32)
    y = torch.as_tensor(encode_chunk(tokenizer, offsets, increment))
    pcfg = PolicyConfig(obs_dim=feats.shape[1], n_joints=offsets.shape[2], horizon=horizon, stride_ticks=stride,
                        n_bins=cfg.n_bins, **POLICY_SIZES[cfg.size])
    model = ActionTransformer(pcfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=cfg.steps,
                                                pct_start=warmup_fraction(cfg.steps))
    t0 = time.monotonic()
    with Progress("training target", total=cfg.steps, console=console) as progress:
        for _ in range(cfg.steps):
            idx = torch.as_tensor(rng.integers(0, len(x), cfg.batch_size))
            logits = model(x[idx], y[idx, :-1])  # position p predicts action token p
            loss = F.cross_entropy(logits.reshape(-1, pcfg.n_bins), y[idx].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            progress.advance(detail=f"loss {loss.item():.3f}")
    model.eval()
    policy = Policy(model, tokenizer, mean, std, manifest={})
    ho_feats, ho_offsets, ho_units = data.windows("held_out", horizon, stride, with_units=True)
    say(console, f"train: decoding {len(ho_feats)} held-out windows for the verdict")
    # consecutive windows share the future over horizon x stride ticks: the bootstrap's block (evaluate.py)
    metrics = evaluate_policy(policy, ho_feats, ho_offsets, units=ho_units, block_windows=horizon * stride,
                              seed=cfg.seed)
    heldout = metrics.pop("heldout") | {"held_out_units": [u.name for u in data.held_out]}
    for line in heldout_lines(heldout):
        console.print(line, highlight=False)
    if heldout["better_than"] != ["hold", "const_velocity"]:
        console.print(f"[bold red]WARNING: the policy is {heldout['verdict']} on the held-out data (95 % "
                      "intervals): it has not learned to predict this robot's actions[/bold red]")
    policy.save(cfg.out, {
        "control_rate_hz": round(data.rate_hz, 3),
        "data": data.manifest(len(x), len(ho_feats)),
        "limits": data.limits(),
        "train": {"size": cfg.size, "seed": cfg.seed, "steps": cfg.steps, "batch_size": cfg.batch_size, "lr": cfg.lr,
                  "final_loss": float(loss.item()), "seconds": round(time.monotonic() - t0, 1),
                  "torch": torch.__version__},
        "metrics_held_out": metrics,
        "heldout": heldout,
    })
    return policy
