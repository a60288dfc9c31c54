"""Train the target policy on the real Schunk LWA 4P recordings, reproducibly from a seed.

    edgeinfer train --data ../shared/data/schunk_lwa4p --seed 0

Split (fixed, by measurement number, see edgeinfer.logs.arm_log.HELD_OUT): runs with n % 5 == 1 are held
out (never trained on, used for metrics and replay); the other 60 train. Loss: next-token cross-entropy
with teacher forcing over [observation, action tokens].
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from rich.progress import Progress

from edgeinfer.engines.dataset import chunk_windows, step_increments
from edgeinfer.engines.evaluate import evaluate_policy
from edgeinfer.engines.model import ActionTransformer, PolicyConfig
from edgeinfer.engines.paths import DEFAULT_POLICY
from edgeinfer.engines.policy import Policy
from edgeinfer.engines.tokenizer import ActionTokenizer
from edgeinfer.logs.arm_log import list_schunk_runs, read_schunk, split_of


@dataclass(kw_only=True)
class FitConfig:
    """What every fit of a model to the recordings shares (training the target, distilling the drafter): the
    data, the seed and the optimizer's schedule."""

    data_dir: Path = Path("../shared/data/schunk_lwa4p")  # the Schunk recordings
    seed: int = 0  # seed of the initial weights and the batch order
    steps: int = 3000  # optimizer steps
    batch_size: int = 256  # windows per step
    lr: float = 2e-3  # peak learning rate (AdamW)

    def __post_init__(self):
        self.data_dir = Path(self.data_dir)
        if self.steps < 1 or self.batch_size < 1 or self.lr <= 0:
            raise ValueError(f"{type(self).__name__}.steps, batch_size and lr must be positive")


@dataclass(kw_only=True)
class TrainConfig(FitConfig):
    """Training of the target policy on the Schunk recordings (training runs fit, held-out runs measure)."""

    out: Path = DEFAULT_POLICY  # manifest JSON of the policy (weights next to it, `.pt`)
    n_bins: int = 64  # action token bins per joint
    horizon: int = 8  # action steps per chunk
    stride_ticks: int = 5  # control ticks per action step (5 x 4 ms = 20 ms at 250 Hz)

    def __post_init__(self):
        super().__post_init__()
        self.out = Path(self.out)


def load_split(data_dir: Path, horizon: int, stride: int) -> dict[str, tuple[np.ndarray, np.ndarray, list[int]]]:
    """{"train"|"held_out": (features (N, 3D), offsets (N, H, D), measurement numbers)}."""
    parts: dict[str, list] = {"train": [[], [], []], "held_out": [[], [], []]}
    runs = list_schunk_runs(data_dir)
    if not runs:
        raise FileNotFoundError(f"no measurement_N directories under {data_dir}")
    for n, path in runs.items():
        log = read_schunk(path)
        f, o, _ = chunk_windows(log.q_rad, log.qd_rad_s, horizon, stride)
        p = parts[split_of(n)]
        p[0].append(f), p[1].append(o), p[2].append(n)
    return {k: (np.concatenate(v[0]), np.concatenate(v[1]), v[2]) for k, v in parts.items()}


def train(cfg: TrainConfig) -> Policy:
    """Train, evaluate on the held-out runs, and save weights + manifest to cfg.out (its folder is created)."""
    cfg.out.parent.mkdir(parents=True, exist_ok=True)  # fail before training, not after, if it cannot be made
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    data = load_split(cfg.data_dir, cfg.horizon, cfg.stride_ticks)
    feats, offsets, train_runs = data["train"]
    tokenizer = ActionTokenizer.fit(step_increments(offsets), cfg.n_bins)
    mean, std = feats.mean(0), feats.std(0) + 1e-6
    x = torch.as_tensor((feats - mean) / std, dtype=torch.float32)
    y = torch.as_tensor(tokenizer.encode(offsets))
    pcfg = PolicyConfig(obs_dim=feats.shape[1], n_joints=offsets.shape[2], horizon=cfg.horizon,
                        stride_ticks=cfg.stride_ticks, n_bins=cfg.n_bins)
    model = ActionTransformer(pcfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    # warm up over 5% of the steps (at least 3, so that short smoke runs keep a valid schedule)
    warmup = min(0.3, max(0.05, 3 / cfg.steps))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=cfg.steps, pct_start=warmup)
    t0 = time.monotonic()
    with Progress() as progress:
        task = progress.add_task("training target", total=cfg.steps)
        for _ in range(cfg.steps):
            idx = torch.as_tensor(rng.integers(0, len(x), cfg.batch_size))
            logits = model(x[idx], y[idx, :-1])  # position p predicts action token p
            loss = F.cross_entropy(logits.reshape(-1, pcfg.n_bins), y[idx].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            progress.update(task, advance=1, description=f"training target  loss {loss.item():.3f}")
    model.eval()
    policy = Policy(model, tokenizer, mean, std, manifest={})
    ho_feats, ho_offsets, ho_runs = data["held_out"]
    metrics = evaluate_policy(policy, ho_feats, ho_offsets)
    rate_hz = read_schunk(next(iter(list_schunk_runs(cfg.data_dir).values()))).rate_hz
    policy.save(cfg.out, {
        "control_rate_hz": round(rate_hz, 3),
        "trained_on": "Schunk LWA 4P recordings (Liu & Althoff, IROS 2018), CC0",
        "split": {"rule": "held_out = measurement numbers n with n % 5 == 1", "train": train_runs, "held_out": ho_runs,
                  "train_windows": int(len(x)), "held_out_windows": int(len(ho_feats))},
        "train": {"seed": cfg.seed, "steps": cfg.steps, "batch_size": cfg.batch_size, "lr": cfg.lr,
                  "final_loss": float(loss.item()), "seconds": round(time.monotonic() - t0, 1),
                  "torch": torch.__version__},
        "metrics_held_out": metrics,
    })
    return policy
