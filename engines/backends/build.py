"""Open an engine for a policy, and `edgeinfer build`: build (or load from the engine cache) the plan for a
backend and precision, then gate it on quality against the fp32 target over held-out real runs."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rich.console import Console
from rich.progress import Progress, SpinnerColumn
from rich.table import Table

from edgeinfer.core.protocols import Engine
from edgeinfer.engines.backends.engine import engine_class, unavailable_reason
from edgeinfer.engines.models.paths import DEFAULT_POLICY
from edgeinfer.engines.models.policy import Policy, load_policy


def load_engine(policy: Policy, backend: str = "torch", precision: str = "fp32", device: str = "cpu",
                threads: int = 1, **options) -> Engine:
    """The target of `policy` as an Engine on `backend`/`precision`/`device`, its plan built or taken from
    the engine cache (engines/backends/cache.py).

    Raises RuntimeError naming the backend when it cannot run here (library missing, no GPU), and
    ValueError for a precision the backend does not build. options go to the backend's from_policy
    (torch: cuda_graphs, max_pass, data_dir).
    """
    reason = unavailable_reason(backend, device)
    if reason:
        raise RuntimeError(f"backend {backend!r} on {device}: {reason}")
    return engine_class(backend).from_policy(policy, precision=precision, device=device, threads=threads, **options)


@dataclass
class BuildConfig:
    """An engine build, gated on held-out quality: the build fails when token agreement with the fp32 target
    falls below min_token_agreement, or the action RMSE exceeds the fp32 target's by more than max_rmse_increase.
    An engine whose token agreement is below 1.0 is labelled LOSSY (summary["lossy"]), passed or not; a lossy
    precision is never a candidate of backend auto (engines/backends/auto.py)."""

    policy: Path = DEFAULT_POLICY  # the policy's manifest JSON
    backend: Literal["torch", "onnxruntime", "tensorrt", "fused"] = "onnxruntime"  # the engine built
    precision: Literal["fp32", "bf16", "fp8", "int8"] = "fp32"  # the engine's precision (int8: onnxruntime on cpu)
    device: str = "cpu"  # the engine's device (cpu, cuda, cuda:1, ...)
    # Real recordings whose held-out runs the quality gate decodes (None: $EDGEINFER_DATA_DIR, else
    # ../shared/data/schunk_lwa4p).
    data_dir: Path | None = None
    n_obs: int = 256  # held-out observations the gate decodes
    min_token_agreement: float = 0.80  # the gate's floor on token agreement with the fp32 target (0..1)
    max_rmse_increase: float = 0.10  # the gate's ceiling on the action RMSE's increase over fp32 (0.1 = 10 %)
    seed: int = 0  # seed of the held-out observation sample
    json: Path | None = None  # also write the summary there

    def __post_init__(self):
        self.policy = Path(self.policy)
        if self.n_obs < 1:
            raise ValueError(f"BuildConfig.n_obs must be >= 1, got {self.n_obs}")
        if not 0 <= self.min_token_agreement <= 1:
            raise ValueError(f"BuildConfig.min_token_agreement must be in [0, 1], got {self.min_token_agreement}")
        if self.max_rmse_increase < 0:
            raise ValueError(f"BuildConfig.max_rmse_increase must be >= 0, got {self.max_rmse_increase}")


def build(cfg: BuildConfig, console: Console | None = None) -> dict:
    """Build or load the engine, measure its quality, print the summary; returns it (passed: the gate)."""
    from edgeinfer.engines.backends.calibration import sample_windows
    from edgeinfer.engines.backends.quality import engine_quality

    console = console or Console()
    policy = load_policy(cfg.policy)
    feats, offsets, _ = sample_windows(policy, cfg.n_obs, cfg.seed, cfg.data_dir, require_real=True)
    with Progress(SpinnerColumn(), *Progress.get_default_columns(), console=console, transient=True) as bar:
        task = bar.add_task(f"build {cfg.backend} {cfg.precision} engine on {cfg.device}", total=None)
        t0 = time.perf_counter()
        engine = load_engine(policy, cfg.backend, cfg.precision, cfg.device)
        open_s = time.perf_counter() - t0
        bar.update(task, total=1, completed=1)
        task = bar.add_task(f"quality gate: {len(feats)} held-out observations", total=len(feats))
        quality = engine_quality(engine, policy, feats, offsets, lambda: bar.advance(task))
    plan = getattr(engine, "plan", None) or {}
    rmse_limit = quality["ref_action_rmse_rad"] * (1 + cfg.max_rmse_increase)
    summary = {
        "schema": "edgeinfer.build/1",
        "policy": str(cfg.policy), "model_sha256": policy.manifest["sha256"],
        "backend": cfg.backend, "precision": cfg.precision, "device": cfg.device,
        "plan": plan, "open_s": round(open_s, 3),
        "quality": quality,
        "gate": {"min_token_agreement": cfg.min_token_agreement, "max_action_rmse_rad": rmse_limit},
        "passed": quality["token_agreement"] >= cfg.min_token_agreement and quality["action_rmse_rad"] <= rmse_limit,
        "lossy": quality["token_agreement"] < 1.0,  # not token-identical to fp32 target-only greedy decoding
    }
    _print_summary(summary, console)
    if cfg.json:
        cfg.json.parent.mkdir(parents=True, exist_ok=True)
        cfg.json.write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _print_summary(s: dict, console: Console) -> None:
    q, plan, gate = s["quality"], s["plan"], s["gate"]
    table = Table(title=f"edgeinfer build: {s['backend']} {s['precision']} on {s['device']}", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right", overflow="fold")
    if plan:
        table.add_row("plan", str(plan.get("path", "-")))
        table.add_row("plan size", f"{plan.get('bytes', 0) / 1024:.1f} KiB")
        table.add_row("build time", f"{plan.get('build_s', 0):.2f} s" + (" (cached)" if plan.get("cached") else ""))
    else:
        table.add_row("plan", f"none: the {s['backend']} backend runs the weights directly")
    table.add_row("opened in", f"{s['open_s']:.2f} s")
    table.add_row("held-out observations", str(q["observations"]))
    table.add_row("token agreement vs fp32", f"{q['token_agreement']:.4f} (gate >= {gate['min_token_agreement']})")
    table.add_row("max |logit - fp32 logit|", f"{q['max_abs_logit_diff']:.2e}")
    limit = gate["max_action_rmse_rad"] * 1e3
    table.add_row("action RMSE", f"{q['action_rmse_rad'] * 1e3:.4f} mrad (gate <= {limit:.4f})")
    table.add_row("fp32 target action RMSE", f"{q['ref_action_rmse_rad'] * 1e3:.4f} mrad")
    table.add_row("quality gate", "[green]PASS[/green]" if s["passed"] else "[red]FAIL[/red]")
    table.add_row("exactness", "[yellow]LOSSY[/yellow] (tokens differ from fp32 greedy)" if s["lossy"] else "exact")
    console.print(table)
