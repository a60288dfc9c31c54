"""One point of `edgeinfer bench fleet`: N robots served one way, one phase pattern, as one fleet replay
(edgeinfer.sim.fleet_replay: the runtime process(es) and the robots' replayers and control loops over ZeroMQ),
reduced to the bench's figures (`point`).

The runtime is sized to the fleet it is asked to serve: n_slots = N (configuration a: 1 per process), so a
batched pass never carries empty slots beyond the fleet's, and admission (configuration d) decides within them.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import replace
from pathlib import Path

from edgeinfer.sim.stats import clopper_pearson_interval


def measure_point(cfg, conf: str, phase: str, n: int, out: Path) -> dict:
    """Replay n robots against configuration `conf` (bench.fleet.CONFIGURATIONS) in phase pattern `phase` for
    cfg.duration_s (cfg: FleetBenchConfig); its outputs go to out/. Returns `point` of its report. Raises
    KeyboardInterrupt when the replay was interrupted (its figures are cut: not a point), and what fleet_replay
    raises."""
    from rich.console import Console

    from edgeinfer.bench.fleet_configs import CONFIGURATIONS
    from edgeinfer.core.fleet_batching import FleetPolicy
    from edgeinfer.node.fleet_config import FleetConfig
    from edgeinfer.sim.fleet_replay import FleetReplayConfig, fleet_replay

    c = CONFIGURATIONS[conf]
    fleet = FleetConfig(policy=cfg.policy, backend=cfg.backend, n_slots=1 if c.process_per_robot else n,
                        scheduling=replace(FleetPolicy(), **c.policy))
    report = fleet_replay(FleetReplayConfig(robots=n, phase=phase, duration_s=cfg.duration_s, out=out,
                                            runtime_per_robot=c.process_per_robot, plots=False, fleet=fleet,
                                            runtimes=min(n, len(os.sched_getaffinity(0))) if c.per_core else 1),
                          Console(quiet=True))
    if report.get("interrupted"):
        raise KeyboardInterrupt(f"fleet replay {out} interrupted")
    return point(report, n)


def point(report: dict, n: int) -> dict:
    """The bench's figures of one fleet report (sim/fleet_replay.py; its keys in docs/fleet.md): over the robots
    served (admitted, not killed). Latency quantiles are the worst served robot's (per-robot quantiles cannot be
    pooled without their samples); k and batch histograms sum the runtime's per-robot counts (a pass of batch B
    counted once per robot in it), None when the runtime reports none."""
    fleet = report["fleet"]
    served = [r for r in report["robots"].values() if r.get("admitted") and not r.get("killed")]
    requests = sum(r["requests"] for r in served)
    on_time = sum(r["on_time_any"] for r in served)
    steady = sum(r["control"]["steady_ticks"] for r in served)
    misses = sum(r["control"]["misses"] for r in served)
    attained = sum(r["attained"] for r in served)
    return {
        "robots_requested": n, "robots_admitted": len(served), "refused": fleet.get("refused", {}),
        "attainment_worst": _worst(served, lambda r: r["attainment"], min),
        "attainment_pooled": attained / requests if requests else None,
        "attainment_pooled_ci95": list(clopper_pearson_interval(attained, requests)) if requests else None,
        "chunks_requested": requests,
        "on_time_any_worst": _worst(served, lambda r: r["on_time_any_rate"], min),
        "on_time_any_pooled": on_time / requests if requests else None,
        "latency_ms": {q: _worst(served, lambda r, q=q: r["latency_ms"].get(q), max) for q in ("p50", "p99", "p999")},
        "control_ticks": steady, "control_misses": misses,
        "control_miss_worst": _worst(served, lambda r: r["control"]["miss_rate"], max),
        "control_miss_pooled": misses / steady if steady else None,
        "k_histogram": _histogram(report, "k_hist"), "batch_histogram": _histogram(report, "batch_hist"),
        "process_exit_codes": report.get("processes", {}),
        "process_failures": {name: code for name, code in report.get("processes", {}).items() if code != 0},
    }


def _worst(robots: list[dict], value, pick) -> float | None:
    """pick (min or max) of value(robot) over robots; None when there is none, or any robot has no value (a served
    robot without a figure cannot be at the bar)."""
    values = [value(r) for r in robots]
    return None if not values or any(v is None for v in values) else float(pick(values))


def _histogram(report: dict, key: str) -> dict | None:
    total: Counter = Counter()
    for runtime in (report.get("runtime") or {}).values():
        for robot in (runtime or {}).get("robots", {}).values():
            total.update(robot.get(key) or {})
    return dict(sorted(total.items(), key=lambda kv: _bin_order(kv[0]))) or None


def _bin_order(name: str) -> tuple:
    """Histogram bins in numeric order ("k0", "k1-2", "3", "17-32" ...): by the first number in the name."""
    digits = "".join(ch if ch.isdigit() else " " for ch in name).split()
    return (int(digits[0]) if digits else 0, name)
