"""Train the target policy on any logs the replayer reads, reproducibly from a seed.

    edgeinfer train --data ../shared/data/schunk_lwa4p --seed 0           # the Schunk recordings
    edgeinfer train --data ../shared/data/reachy2_lerobot_v30 --held-out 2  # a LeRobot dataset, episode 2 held out

Data and split: engines/fit_data.py (episodes, files or runs are units; held-out units are never trained on
and give the metrics). Loss: next-token cross-entropy with teacher forcing over [observation, action tokens].
The manifest (out/policies/<data name>_target.json by default) records the data, its split, the joint limits
fitted on the training part, the control rate, the training run and the held-out metrics; "heldout" compares the
policy with holding still and constant velocity (95 % intervals) and gives the verdict, printed with a warning
when the policy is not better than both.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console

from edgeinfer.core.progress import Progress, say
from edgeinfer.engines.dataset import step_increments
from edgeinfer.engines.dct_tokenizer import DctTokenizer
from edgeinfer.engines.evaluate import evaluate_policy, heldout_lines
from edgeinfer.engines.fit_data import SCHUNK_DATA, FitDataConfig, default_horizon, default_stride_ticks, load_fit_data
from edgeinfer.engines.model import POLICY_SIZES, ActionTransformer, PolicyConfig
from edgeinfer.engines.paths import TRAINED_DIR, check_writable
from edgeinfer.engines.policy import Policy, feature_increment
from edgeinfer.engines.tokenizer import ActionTokenizer, encode_chunk


@dataclass(kw_only=True)
class FitConfig(FitDataConfig):
    """What every fit of a model to logs shares (training the target, distilling the drafter): the data, the
    seed, the optimizer's schedule and where the result may be written."""

    seed: int = 0  # seed of the initial weights and the batch order
    steps: int = 3000  # optimizer steps
    batch_size: int = 256  # windows per step
    lr: float = 2e-3  # peak learning rate (AdamW)
    # Allow --out inside the package's engines/weights/ (regenerating the shipped Schunk policies on purpose).
    overwrite_shipped: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.steps < 1 or self.batch_size < 1 or self.lr <= 0:
            raise ValueError(f"{type(self).__name__}.steps, batch_size and lr must be positive")


@dataclass(kw_only=True)
class TrainConfig(FitConfig):
    """Training of the target policy (training units fit, held-out units measure)."""

    # The logs: a LeRobot dataset (each episode a unit), a folder of logs (each a unit) or one log (split by
    # time); any format `edgeinfer replay --log` reads.
    data: Path = SCHUNK_DATA
    # Manifest JSON of the policy, weights next to it (`.pt`) (None: out/policies/<data name>_target.json
    # under the working directory). Never engines/weights/ without --overwrite-shipped.
    out: Path | None = None
    n_bins: int = 64  # action token bins per joint (per coefficient and joint for --tokenizer dct)
    # The action tokens: step (one per chunk step and joint, step-major; engines/tokenizer.py) or dct (one per DCT
    # coefficient and joint, low frequency first, so that any verified prefix spans the whole horizon;
    # engines/dct_tokenizer.py).
    tokenizer: Literal["step", "dct"] = "step"
    # The transformer's size: small (d_model 64, 2 layers, 4 heads: 0.11 M parameters on the Schunk chunk, the
    # shipped schunk_target) or large (d_model 256, 4 layers, 8 heads: 3.2 M parameters, schunk_large_target).
    size: Literal["small", "large"] = "small"
    # Action steps per chunk (None: as many, up to 8, as keep H x joints within 48 tokens per 20 ms of chunk
    # step, so that a chunk decodes within one step wherever the Schunk chunk does; see engines/fit_data.py).
    horizon: int | None = None
    stride_ticks: int | None = None  # control ticks per action step (None: a step of about 20 ms, at least 1 tick)

    def __post_init__(self):
        super().__post_init__()
        self.out = Path(self.out) if self.out is not None else TRAINED_DIR / f"{self.data.resolve().name}_target.json"
        check_writable(self.out, self.overwrite_shipped)
        for name in ("horizon", "stride_ticks"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.horizon is not None and self.horizon > MAX_HORIZON:
            raise ValueError(f"TrainConfig.horizon must be <= {MAX_HORIZON} chunk steps, got {self.horizon} (a chunk "
                             "of horizon x joints tokens is decoded one target pass at a time)")


MAX_HORIZON = 64  # chunk steps a trained policy may have (the wire carries up to 256)


def warmup_fraction(steps: int) -> float:
    """OneCycleLR's warm-up: 5% of the steps, at least 3 (so that short smoke runs keep a valid schedule)."""
    return min(0.3, max(0.05, 3 / steps))


def train(cfg: TrainConfig, console: Console | None = None) -> Policy:
    """Train, evaluate on the held-out units, and save weights + manifest to cfg.out (its folder is created).

    Prints (on `console`) what the data's metadata claims when the files hold less, and the held-out action
    RMSE against holding still and constant velocity with 95 % intervals (engines/evaluate.heldout_comparison),
    with a warning when the policy is not better than both; the manifest records them ("heldout", and "data"
    "warnings"). Raises as engines.fit_data.load_fit_data for data it cannot use."""
    console = console or Console()
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
