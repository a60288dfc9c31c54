"""`edgeinfer` command line: replay (the main job), serve (runtime node), control (control loop node), train,
build (an engine, quality-gated)."""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from edgeinfer.core.commands import COMMANDS, config_classes
from edgeinfer.core.config import add_options, build, expand_bool_flags, load_launch
from edgeinfer.core.lifecycle import raise_interrupt


def _arguments(p: argparse.ArgumentParser, command: str) -> None:
    """The arguments no *Config dataclass holds: positional ones, and compare's."""
    if command == "replay":
        p.add_argument("--launch", type=Path, default=None, help="TOML launch file filling these options")
    elif command == "launch":
        p.add_argument("file", type=Path, help="launch file: one table per node, named by its command ([serve], "
                                               "[replay], ...), started in the file's order")
    elif command == "keys":
        p.add_argument("dir", type=Path, help="directory to create them in (never overwritten)")
    elif command == "sweep":
        p.add_argument("file", type=Path, help="sweep file: [sweep] logs, out; [base]; [configs.NAME]; [grid]")
    elif command == "compare":
        p.add_argument("a", type=Path, metavar="A.json", help="the baseline's report.json (edgeinfer replay --out)")
        p.add_argument("b", type=Path, metavar="B.json", help="the candidate's report.json")
        p.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write the comparison as JSON")
        p.add_argument("--fail-on-regression", action="store_true", help="exit 1 when any figure is worse")
        p.add_argument("--alpha", type=float, default=0.05, help="per-figure significance level (default: 0.05)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = argv[0] if argv else None

    parser = argparse.ArgumentParser(prog="edgeinfer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for command, spec in COMMANDS.items():  # core.commands: the one list of commands
        p = sub.add_parser(command, help=spec.help, description=spec.description)
        _arguments(p, command)
        if command == chosen:  # only the command being run imports its config classes: most never import torch
            add_options(p, *config_classes(command))
            argv = argv[:1] + expand_bool_flags(p, argv[1:])  # a bool option alone means true
    if argv[:1] == ["bench"] and argv[1:2] in (["engines"], ["spec"], ["transport"], ["anytime"], ["fleet"]):  # own -h
        args = argparse.Namespace(command="bench", suite=argv[1], rest=argv[2:])
    else:
        args = parser.parse_args(argv)
        args.suite, args.rest = None, argv[1:]
    if args.command == "bench":  # SIGTERM as Ctrl-C: the benches' cleanup runs, and their child processes end
        signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        return _run(args, parser)
    except KeyboardInterrupt:
        print(f"edgeinfer {args.command}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, TimeoutError, RuntimeError, KeyError) as e:
        # configuration, data and start-up errors already name their field, file or process: no traceback
        text = e.args[0] if isinstance(e, KeyError) and e.args else e  # KeyError's str() adds quotes
        print(f"edgeinfer {args.command}: error: {text}", file=sys.stderr)
        return 2


def _outputs(cfg, report: dict, *logs: str) -> str:
    """What a replay or hil run wrote into cfg.out, for its last line (run.mcap: when its report says so)."""
    from edgeinfer.sim.plots import PLOT_FILES

    plots = PLOT_FILES if getattr(cfg, "plots", True) else ()  # hil always plots
    mcap = [f] if (f := (report.get("run_mcap") or {}).get("file")) else []
    return ", ".join(("report.json", "ticks.csv", *plots, *mcap, *logs))


def _print_graph(command: str, cfg) -> int:
    """The process graph a replay or hil run would start, as `edgeinfer launch FILE --dry-run` prints it."""
    from dataclasses import replace

    from edgeinfer.launch import graph
    from edgeinfer.procs.spec import NodeSpec

    print(graph([NodeSpec(command, (replace(cfg, dry_run=False),))]), end="")
    return 0


def _run(args, parser) -> int:
    if args.command == "replay":
        from edgeinfer.sim.config import ReplayConfig
        from edgeinfer.sim.replay import replay

        launch_dir = args.launch.resolve().parent if args.launch else None
        launch = load_launch(args.launch, "replay")
        try:
            cfg = build(ReplayConfig, args, launch, launch_dir)
        except ValueError as e:
            raise ValueError(f"{args.launch}: {e}" if args.launch else str(e)) from None
        if cfg.dry_run:
            return _print_graph("replay", cfg)
        report = replay(cfg)
        print(f"wrote {cfg.out}/: {_outputs(cfg, report, 'runtime.log', 'control.log')}")
        if report["interrupted"]:
            return 130
        return 0 if all(code == 0 for code in report["process_exit_codes"].values()) else 1
    if args.command == "launch":
        from edgeinfer.launch import LaunchConfig, launch

        return launch(args.file, build(LaunchConfig, args))
    if args.command == "serve":
        from edgeinfer.core.transport import Endpoints
        from edgeinfer.node.runtime import RuntimeConfig
        from edgeinfer.node.serve import serve

        serve(build(RuntimeConfig, args), build(Endpoints, args))
        return 0
    if args.command == "fleet-replay":
        from edgeinfer.sim.fleet_replay import FleetReplayConfig, fleet_replay

        report = fleet_replay(build(FleetReplayConfig, args))
        return 130 if report["interrupted"] else 1 if report["failed_processes"] else 0
    if args.command == "fleet-robots":
        from edgeinfer.sim.fleet_group import FleetRobotsConfig, run_group

        return run_group(build(FleetRobotsConfig, args))
    if args.command == "fleet":
        from edgeinfer.node.fleet import serve_fleet
        from edgeinfer.node.fleet_config import FleetConfig

        serve_fleet(build(FleetConfig, args))
        return 0
    if args.command == "control":
        from edgeinfer.control.loop import ControlConfig, ControlLoop
        from edgeinfer.core.transport import Endpoints

        with ControlLoop(build(ControlConfig, args), build(Endpoints, args)) as loop:
            stats = loop.run(loop.handshake())
        print(f"control: {stats}")
        return 0
    if args.command == "train":
        from edgeinfer.engines.train import TrainConfig, train

        cfg = build(TrainConfig, args)
        policy = train(cfg)
        print(f"wrote {cfg.out} and {cfg.out.with_suffix('.pt')}; held-out verdict: "
              f"{policy.manifest['heldout']['verdict']}")
        return 0
    if args.command == "bench":
        if args.suite == "spec":
            from edgeinfer.bench.spec import main as bench_spec

            return bench_spec(args.rest)
        if args.suite == "transport":
            from edgeinfer.bench.transport import main as bench_transport

            return bench_transport(args.rest)
        if args.suite == "engines":
            from edgeinfer.bench.engines import main as bench_engines

            return bench_engines(args.rest)
        if args.suite == "anytime":
            from edgeinfer.bench.anytime import main as bench_anytime

            return bench_anytime(args.rest)
        if args.suite == "fleet":
            from edgeinfer.bench.fleet import main as bench_fleet

            return bench_fleet(args.rest)
        from edgeinfer.bench.suite import main as bench

        return bench(args.rest)
    if args.command == "distill":
        from edgeinfer.engines.distill import DistillConfig, distill
        from edgeinfer.engines.policy import load_policy

        cfg = build(DistillConfig, args)
        draft = distill(load_policy(cfg.target), cfg)
        print(f"wrote {cfg.out}; held-out: {draft.manifest.get('metrics_held_out')}")
        return 0
    if args.command == "compare":
        from edgeinfer.sim.compare import main as compare

        return compare(args.a, args.b, args.json, args.fail_on_regression, args.alpha)
    if args.command == "hil":
        from edgeinfer.sim.hil import HilConfig, hil

        cfg = build(HilConfig, args)
        if cfg.dry_run:
            return _print_graph("hil", cfg)
        report = hil(cfg)
        print(f"wrote {cfg.out}/: {_outputs(cfg, report, 'control.log')}")
        return 130 if report["interrupted"] else (0 if report["process_exit_codes"]["control"] == 0 else 1)
    if args.command == "sweep":
        from edgeinfer.sim.sweep import SweepConfig, sweep

        rows = sweep(args.file, build(SweepConfig, args))
        return 0 if all(r["status"] == "ok" for r in rows) else 1
    if args.command == "keys":
        from edgeinfer.core.keys import make_keys

        for path in make_keys(args.dir).values():
            print(f"wrote {path}")
        return 0
    if args.command == "build":
        from edgeinfer.engines.build import BuildConfig
        from edgeinfer.engines.build import build as build_engine

        return 0 if build_engine(build(BuildConfig, args))["passed"] else 1
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
