"""What each edgeinfer command runs: its *Config dataclasses (imported by a function, so that only the command
that runs imports its own: most never import torch) and its entry point, `run(args, *configs) -> exit code`.

The command line (edgeinfer.cli) names them in its table, parses each command's options from those dataclasses
(core.config.add_options) and calls the entry point with the instances they filled; args holds the positional
arguments and `argv`, the command line after `edgeinfer` (what a bench records it was run with).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from edgeinfer.core.commands import SLO_INVALID_EXIT


def _typed(args: argparse.Namespace) -> list[str]:
    """The command line as typed, for a result to record."""
    return ["edgeinfer", *args.argv]


# ------------------------------------------------------------------------------------- replay, hil, launch

def replay_configs():
    from edgeinfer.sim.run_config import ReplayConfig

    return (ReplayConfig,)


def replay(args, cfg) -> int:
    if cfg.dry_run:
        return _print_graph("replay", cfg)
    from edgeinfer.sim.replay import replay as run_replay

    report = run_replay(cfg)
    restarted = ("runtime.restarted.log",) if ((report.get("injected") or {}).get("runtime_kill") or {}).get(
        "restarted") else ()
    print(f"wrote {cfg.out}/: {_outputs(cfg, report, 'runtime.log', *restarted, 'control.log')}")
    if report["interrupted"]:
        return 130
    if not all(code == 0 for code in report["process_exit_codes"].values()):
        return 1
    if (report.get("slo") or {}).get("verdict") == "INVALID":
        print(f"edgeinfer replay: SLO {cfg.slo!r} INVALID: exit code {SLO_INVALID_EXIT}", file=sys.stderr)
        return SLO_INVALID_EXIT
    return 0


def hil_configs():
    from edgeinfer.sim.hil import HilConfig

    return (HilConfig,)


def hil(args, cfg) -> int:
    if cfg.dry_run:
        return _print_graph("hil", cfg)
    from edgeinfer.sim.hil import hil as run_hil

    report = run_hil(cfg)
    print(f"wrote {cfg.out}/: {_outputs(cfg, report, 'control.log')}")
    return 130 if report["interrupted"] else (0 if report["process_exit_codes"]["control"] == 0 else 1)


def _outputs(cfg, report: dict, *logs: str) -> str:
    """What a replay or hil run wrote into cfg.out, for its last line (run.mcap: when its report says so)."""
    from edgeinfer.sim.plots import PLOT_FILES

    plots = PLOT_FILES if getattr(cfg, "plots", True) else ()  # hil always plots
    mcap = [f] if (f := (report.get("run_mcap") or {}).get("file")) else []
    return ", ".join(("report.json", "ticks.csv", *plots, *mcap, *logs))


def _print_graph(command: str, cfg) -> int:
    """The process graph a replay or hil run would start, as `edgeinfer launch FILE --dry-run` prints it."""
    from edgeinfer.launch import graph
    from edgeinfer.procs.node_spec import NodeSpec

    print(graph([NodeSpec(command, (replace(cfg, dry_run=False),))]), end="")
    return 0


def launch_configs():
    from edgeinfer.launch import LaunchConfig

    return (LaunchConfig,)


def launch(args, cfg) -> int:
    from edgeinfer.launch import launch as run_launch

    return run_launch(args.file, cfg)


# ------------------------------------------------------------------------------------------------- nodes

def serve_configs():
    from edgeinfer.core.transport import Endpoints
    from edgeinfer.node.runtime import RuntimeConfig

    return RuntimeConfig, Endpoints


def serve(args, cfg, endpoints) -> int:
    from edgeinfer.node.serve import serve as run_serve

    run_serve(cfg, endpoints)
    return 0


def control_configs():
    from edgeinfer.control.loop import ControlConfig
    from edgeinfer.core.transport import Endpoints

    return ControlConfig, Endpoints


def control(args, cfg, endpoints) -> int:
    from edgeinfer.control.loop import ControlLoop
    from edgeinfer.core.logwriter import print_last

    with ControlLoop(cfg, endpoints) as loop:
        stats = loop.run(loop.handshake())
    print_last(f"control: {stats}")
    return 0


def fleet_configs():
    from edgeinfer.node.fleet_config import FleetConfig

    return (FleetConfig,)


def fleet(args, cfg) -> int:
    from edgeinfer.node.fleet_node import serve_fleet

    serve_fleet(cfg)
    return 0


def fleet_replay_configs():
    from edgeinfer.sim.fleet_replay import FleetReplayConfig

    return (FleetReplayConfig,)


def fleet_replay(args, cfg) -> int:
    from edgeinfer.sim.fleet_replay import fleet_replay as run_fleet_replay

    report = run_fleet_replay(cfg)
    return 130 if report["interrupted"] else 1 if report["failed_processes"] else 0


def fleet_robots_configs():
    from edgeinfer.sim.fleet_group import FleetRobotsConfig

    return (FleetRobotsConfig,)


def fleet_robots(args, cfg) -> int:
    from edgeinfer.sim.fleet_group import run_group

    return run_group(cfg)


def preload_nodes() -> None:
    """Import what every node shares (the fork server's, once, before it forks them): both nodes, and torch
    through the engines."""
    import edgeinfer.control.loop  # noqa: F401
    import edgeinfer.engines.backends.build  # noqa: F401
    import edgeinfer.node.serve  # noqa: F401


# ------------------------------------------------------------------------------------------ models, engines

def train_configs():
    from edgeinfer.engines.training.fit_config import TrainConfig

    return (TrainConfig,)


def train(args, cfg) -> int:
    from edgeinfer.engines.training.train import train as run_train

    policy = run_train(cfg)
    print(f"wrote {cfg.out} and {cfg.out.with_suffix('.pt')}; held-out verdict: "
          f"{policy.manifest['heldout']['verdict']}")
    return 0


def distill_configs():
    from edgeinfer.engines.training.fit_config import DistillConfig

    return (DistillConfig,)


def distill(args, cfg) -> int:
    from edgeinfer.engines.models.policy import load_policy
    from edgeinfer.engines.training.distill import distill as run_distill

    draft = run_distill(load_policy(cfg.target), cfg)
    print(f"wrote {cfg.out}; held-out: {draft.manifest.get('metrics_held_out')}")
    return 0


def build_configs():
    from edgeinfer.engines.backends.build import BuildConfig

    return (BuildConfig,)


def build(args, cfg) -> int:
    from edgeinfer.engines.backends.build import build as build_engine

    return 0 if build_engine(cfg)["passed"] else 1


# ------------------------------------------------------------------------------------ keys, sweep, compare

def keys(args) -> int:
    from edgeinfer.core.keys import make_keys

    for path in make_keys(args.dir).values():
        print(f"wrote {path}")
    return 0


def sweep_configs():
    from edgeinfer.sim.sweep import SweepConfig

    return (SweepConfig,)


def sweep(args, cfg) -> int:
    from edgeinfer.sim.sweep import sweep as run_sweep

    rows = run_sweep(args.file, cfg)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


@dataclass
class CompareConfig:
    """What `edgeinfer compare` writes and when it fails."""

    json: Path | None = None  # also write the comparison as JSON here
    fail_on_regression: bool = False  # exit 1 when any figure is worse
    alpha: float = 0.05  # per-figure significance level

    def __post_init__(self):
        if not 0 < self.alpha < 1:
            raise ValueError(f"CompareConfig.alpha must be in (0, 1), got {self.alpha}")


def compare_configs():
    return (CompareConfig,)


def compare(args, cfg: CompareConfig) -> int:
    from edgeinfer.sim.compare import main as run_compare

    return run_compare(args.a, args.b, cfg.json, cfg.fail_on_regression, cfg.alpha)


# ------------------------------------------------------------------------------------------------ benches

def bench_configs():
    from edgeinfer.bench.suite import BenchConfig

    return (BenchConfig,)


def bench(args, cfg) -> int:
    from edgeinfer.bench.suite import run_command

    return run_command(cfg, _typed(args))


def bench_engines_configs():
    from edgeinfer.bench.engines import EnginesBenchConfig

    return (EnginesBenchConfig,)


def bench_engines(args, cfg) -> int:
    from edgeinfer.bench.engines import run_command

    return run_command(cfg)


def bench_spec_configs():
    from edgeinfer.bench.speculation import SpecBenchConfig

    return (SpecBenchConfig,)


def bench_spec(args, cfg) -> int:
    from edgeinfer.bench.speculation import run_command

    return run_command(cfg)


def bench_anytime_configs():
    from edgeinfer.bench.anytime import AnytimeConfig

    return (AnytimeConfig,)


def bench_anytime(args, cfg) -> int:
    from edgeinfer.bench.anytime import run_command

    return run_command(cfg, _typed(args))


def bench_fleet_configs():
    from edgeinfer.bench.fleet_capacity import FleetBenchConfig

    return (FleetBenchConfig,)


def bench_fleet(args, cfg) -> int:
    from edgeinfer.bench.fleet_capacity import run_command

    return run_command(cfg, _typed(args))


def bench_transport_configs():
    from edgeinfer.bench.transport_costs import TransportBenchConfig

    return (TransportBenchConfig,)


def bench_transport(args, cfg) -> int:
    from edgeinfer.bench.transport_costs import run_command

    return run_command(cfg)
