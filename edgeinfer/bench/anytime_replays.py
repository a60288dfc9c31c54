"""The replays of `edgeinfer bench anytime`: each policy under cut budgets and with a slowed engine, through the
real replay machinery (edgeinfer.sim.replay: replayer -> runtime -> control -> replayer over ZeroMQ, one process
graph per replay, the nodes forked from one server as the bench's e2e scenarios are).

A condition is a scheduler budget (SchedulerConfig.budget_ms: decode each chunk within this many ms of its
observation) or a slowdown (every target pass, prefill included, made `slowdown` times its measured cost by the
runtime's fault injection, edgeinfer/node/faults.py `fault_pass_delay_ms`, at the default budget). Per (policy,
condition) the held-out runs' reports are pooled: ticks, deadline misses with an exact 95 % interval, held ticks,
the rung of every tick and of every chunk, and the action RMSE of what was commanded against the recorded q at
the same tick (sim/metrics.py quality: holds included, and without them).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeinfer.core.scheduler import SchedulerConfig
from edgeinfer.core.wire import RUNGS
from edgeinfer.node.faults import FaultConfig
from edgeinfer.node.runtime import RuntimeConfig
from edgeinfer.sim.run_config import ReplayConfig
from edgeinfer.sim.stats import clopper_pearson_interval


@dataclass(frozen=True)
class Condition:
    """One replay condition: budget_ms (None: the default, the time between two chunk starts) and slowdown (1: the
    engine as it is; s: every target pass lasts s x pass_ms)."""

    budget_ms: float | None = None
    slowdown: float = 1.0

    @property
    def name(self) -> str:
        return f"slowed {self.slowdown:g}x" if self.slowdown != 1 else f"budget {self.budget_ms:g} ms"

    def pass_delay_ms(self, pass_ms: float) -> float:
        """The fault injection's delay per target pass that makes a pass of pass_ms last slowdown x pass_ms."""
        return (self.slowdown - 1.0) * pass_ms


def conditions(budgets_ms: list[float], slowdowns: list[float]) -> list[Condition]:
    """The cut budgets, then the slowdowns at the default budget."""
    return [Condition(budget_ms=b) for b in budgets_ms] + [Condition(slowdown=s) for s in slowdowns]


def replay_once(policy: Path, run_dir: Path, cond: Condition, pass_ms: float, out: Path, backend: str = "torch",
                duration_s: float | None = None) -> dict:
    """One replay of held-out run `run_dir` served by `policy` (a manifest) on `backend` under `cond`; returns its
    report (sim/metrics.summarize). Artefacts (report.json, ticks.csv, node logs) go to out/. Raises what
    sim.replay.replay raises (LogError, RuntimeError, TimeoutError)."""
    from rich.console import Console

    from edgeinfer.sim.replay import replay

    runtime = RuntimeConfig(policy=policy, backend=backend, scheduler=SchedulerConfig(budget_ms=cond.budget_ms),
                            faults=FaultConfig(fault_pass_delay_ms=round(cond.pass_delay_ms(pass_ms), 4)))
    cfg = ReplayConfig(log=run_dir, out=out, runtime=runtime, duration_s=duration_s, fork_nodes=True, plots=False,
                       run_mcap=False, host_baseline_s=0.0)
    report = replay(cfg, Console(quiet=True))
    if report.get("interrupted"):  # Ctrl-C or SIGTERM stopped the replay early: stop the bench, pool nothing cut
        raise KeyboardInterrupt(f"replay {out} interrupted")
    return report


def _pooled_rmse(reports: list[dict], key: str, count: str) -> float | None:
    """The RMSE over every report's ticks together: sqrt(sum n_i rmse_i^2 / sum n_i)."""
    pairs = [(r["quality"][key], r["quality"][count]) for r in reports if r["quality"].get(key) is not None]
    n = sum(c for _, c in pairs)
    return float(np.sqrt(sum(c * v * v for v, c in pairs) / n)) if n else None


def pooled(reports: list[dict], cond: Condition, pass_ms: float) -> dict:
    """One (policy, condition) row from its replays' reports, pooled over the runs (see the module docstring).
    miss_rate_scope: each run's ("steady state" when the pre-roll covered start-up, sim/metrics.py)."""
    ticks = sum(r["observations_sent"] for r in reports)
    misses = sum(r["deadline_misses"] for r in reports)
    tick_rungs, chunk_rungs = Counter({r: 0 for r in RUNGS}), Counter({r: 0 for r in RUNGS if r != "hold"})
    for r in reports:
        tick_rungs.update(r["fallbacks"])
        chunk_rungs.update(r["chunks"]["rungs"])
    return {
        "condition": cond.name, "budget_ms": reports[0]["budget_ms"] if reports else cond.budget_ms,
        "slowdown": cond.slowdown, "pass_delay_ms": round(cond.pass_delay_ms(pass_ms), 4),
        "runs": [r["log"] for r in reports], "engine": sorted({r["engine"] for r in reports}), "ticks": ticks,
        "deadline_misses": misses,
        "miss_rate": misses / ticks if ticks else None,
        "miss_rate_ci95": list(clopper_pearson_interval(misses, ticks)),
        "miss_rate_scope": sorted({r["miss_rate_scope"] for r in reports}),
        "held_ticks": sum(r["outcomes"]["hold"] for r in reports),
        "tick_rungs": dict(tick_rungs), "chunk_rungs": dict(chunk_rungs),
        "action_rmse_rad": _pooled_rmse(reports, "action_rmse_rad_with_holds", "ticks_compared_with_holds"),
        "action_rmse_rad_without_holds": _pooled_rmse(reports, "action_rmse_rad", "ticks_compared"),
        "tokens_per_target_pass": _mean([r["spec"]["tokens_per_target_pass"] for r in reports]),
        "process_exit_codes": [r["process_exit_codes"] for r in reports],
    }


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None
