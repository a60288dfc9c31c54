r"""Train the example llama-style action policy (policy.py) and its draft, and write their manifest.

    python examples/llama_policy/train.py                     # the Schunk recordings' training runs
    python examples/llama_policy/train.py --synthetic --steps 100   # the embedded synthetic log (no ../shared)
    edgeinfer replay --policy examples/llama_policy/manifest.json --trust-policy-code \
        --log ../shared/data/schunk_lwa4p/measurement_1

The manifest's factory runs policy.py: serving it needs --trust-policy-code (engines/models/factory.py). With --out
elsewhere, policy.py is copied there, so that the folder holds its own code (a factory's module must be inside
the manifest's folder).

Data: the Schunk LWA 4P runs of the training split (edgeinfer.logs.arm_log.split_of, as `edgeinfer train`: runs
n % 5 == 1 are held out and give the metrics), windows and tokenizer as engines/training/dataset.py and
engines/models/tokenizer.py. The model trained is what the factory builds (policy.build, imported the way edgeinfer
imports it), so the weights fit the manifest by construction. Loss: next-token cross-entropy with teacher
forcing, target and draft on the same batches. Writes target.pt, draft.pt (state dicts) and manifest.json.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from edgeinfer.engines.models.factory import FactoryPolicyConfig, import_factory
from edgeinfer.engines.models.tokenizer import ActionTokenizer
from edgeinfer.engines.training.dataset import chunk_windows, step_increments
from edgeinfer.logs.arm_log import list_schunk_runs, read_schunk, split_of, synthetic_log

HERE = Path(__file__).resolve().parent
SCHUNK = Path("../shared/data/schunk_lwa4p")
TARGET = {"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_ff": 172}
DRAFT = {"d_model": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "d_ff": 86}
HORIZON, STRIDE_TICKS, N_BINS = 8, 5, 64  # as the built-in Schunk policy: 48 tokens a chunk, a step every 20 ms


def windows(data: Path | None) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], float, dict]:
    """({"train"|"held_out": (features (N, 3D), offsets (N, H, D))}, rate_hz, the split's description) of the
    Schunk runs under `data`, or (data None) of 120 s of the synthetic log, all for training."""
    if data is None:
        log = synthetic_log(seconds=120.0)
        f, o, _ = chunk_windows(log.q_rad, log.qd_rad_s, HORIZON, STRIDE_TICKS, log.t_s)
        return {"train": (f, o), "held_out": (f[:0], o[:0])}, log.rate_hz, {"source": log.name}
    parts: dict[str, list] = {"train": [], "held_out": []}
    runs = list_schunk_runs(data)
    if not runs:
        raise FileNotFoundError(f"no measurement_N folders under {data}")
    for n, path in runs.items():
        log = read_schunk(path)
        parts[split_of(n)].append((n, *chunk_windows(log.q_rad, log.qd_rad_s, HORIZON, STRIDE_TICKS, log.t_s)[:2]))
    split = {"source": str(data), "rule": "held_out = measurement numbers n with n % 5 == 1",
             "train": [p[0] for p in parts["train"]], "held_out": [p[0] for p in parts["held_out"]]}
    out = {k: (np.concatenate([p[1] for p in v]), np.concatenate([p[2] for p in v])) for k, v in parts.items()}
    return out, log.rate_hz, split


def train(out: Path = HERE, data: Path | None = SCHUNK, steps: int = 1000, seed: int = 0, batch_size: int = 128,
          lr: float = 3e-3, threads: int = 2) -> Path:
    """Train target and draft, write them and manifest.json into `out`; returns the manifest's path."""
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    rng = np.random.default_rng(seed)
    parts, rate_hz, split = windows(data)
    feats, offsets = parts["train"]
    tokenizer = ActionTokenizer.fit(step_increments(offsets), N_BINS)
    stats = {"tokenizer": tokenizer.state_dict(), "feat_mean": feats.mean(0).tolist(),
             "feat_std": (feats.std(0) + 1e-6).tolist()}
    config = {"obs_dim": feats.shape[1], "n_joints": offsets.shape[2], "horizon": HORIZON,
              "stride_ticks": STRIDE_TICKS, "n_bins": N_BINS}
    out.mkdir(parents=True, exist_ok=True)
    if out.resolve() != HERE:  # a policy folder holds its own code: the factory's module must be inside it
        shutil.copyfile(HERE / "policy.py", out / "policy.py")
    factory = "policy.py:build"
    build = import_factory(factory, out)
    cfg = FactoryPolicyConfig(**config)
    target, draft = (build(cfg, **stats, **shape) for shape in (TARGET, DRAFT))
    x = torch.as_tensor(target.features(*_split_features(feats)))
    y = torch.as_tensor(tokenizer.encode(offsets))
    models = [target.model.train(), draft.model.train()]
    opts = [torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=0.01) for m in models]
    scheds = [torch.optim.lr_scheduler.OneCycleLR(o, max_lr=lr, total_steps=steps, pct_start=max(0.05, 3 / steps))
              for o in opts]
    t0, losses = time.monotonic(), [0.0, 0.0]
    for step in range(steps):
        idx = torch.as_tensor(rng.integers(0, len(x), batch_size))
        for i, (model, opt, sched) in enumerate(zip(models, opts, scheds)):
            logits = model(x[idx], y[idx, :-1])  # position p predicts action token p
            loss = F.cross_entropy(logits.reshape(-1, N_BINS), y[idx].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses[i] = loss.item()
        if step % 100 == 0 or step == steps - 1:
            print(f"step {step + 1}/{steps}  loss target {losses[0]:.3f}  draft {losses[1]:.3f}", flush=True)
    seconds = time.monotonic() - t0
    manifest = {"schema": "edgeinfer.policy/1", "factory": factory, "factory_args": {**TARGET, **stats},
                **_save(target.model, out / "target.pt"), "config": config, "control_rate_hz": round(rate_hz, 3),
                "draft": {"factory": factory, "factory_args": {**DRAFT, **stats},
                          **_save(draft.model, out / "draft.pt")},
                "split": split,
                "train": {"seed": seed, "steps": steps, "batch_size": batch_size, "lr": lr,
                          "seconds": round(seconds, 1), "final_loss": {"target": losses[0], "draft": losses[1]},
                          "torch": torch.__version__},
                "metrics_held_out": _metrics(models, parts["held_out"], target.features, tokenizer)}
    path = out / "manifest.json"
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return path


def _split_features(feats: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q, qd, q_prev) from raw features (N, 3D) (engines.policy.observation_features' inverse)."""
    q, qd, increment = np.split(feats, 3, axis=1)
    return q, qd, q - increment


def _save(model: torch.nn.Module, path: Path) -> dict:
    torch.save(model.eval().state_dict(), path)
    return {"weights": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


@torch.no_grad()
def _metrics(models, held_out: tuple[np.ndarray, np.ndarray], features, tokenizer, n: int = 4096) -> dict | None:
    """Teacher-forced token accuracy of target and draft on (up to n of) the held-out windows, and how often the
    draft's token is the target's (None without held-out windows)."""
    feats, offsets = held_out[0][:n], held_out[1][:n]
    if not len(feats):
        return None
    x, y = torch.as_tensor(features(*_split_features(feats))), torch.as_tensor(tokenizer.encode(offsets))
    target, draft = (m.eval()(x, y[:, :-1]).argmax(-1) for m in models)
    return {"windows": len(feats), "target_token_accuracy": float((target == y).float().mean()),
            "draft_token_accuracy": float((draft == y).float().mean()),
            "draft_agrees_with_target": float((draft == target).float().mean())}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=SCHUNK, help="the Schunk recordings (measurement_N folders)")
    p.add_argument("--synthetic", action="store_true", help="train on the embedded synthetic log instead")
    p.add_argument("--out", type=Path, default=HERE, help="folder of manifest.json, target.pt and draft.pt")
    p.add_argument("--steps", type=int, default=1000, help="optimizer steps")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the batch order")
    p.add_argument("--batch-size", type=int, default=128, help="windows per step")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    a = p.parse_args(argv)
    path = train(a.out, None if a.synthetic else a.data, a.steps, a.seed, a.batch_size, threads=a.threads)
    print(f"wrote {path}; held-out: {json.loads(path.read_text())['metrics_held_out']}")


if __name__ == "__main__":
    main()
