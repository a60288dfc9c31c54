"""`edgeinfer` command line: replay (the main job), serve (runtime node), control (control loop node), train,
build (an engine, quality-gated)."""
from __future__ import annotations

import argparse
import importlib
import signal
import sys
from pathlib import Path

from edgeinfer.core.config import add_options, build, load_launch

# The config classes behind each command's options, imported only for the command being run: a node that
# does not run the policy (control, replay, hil, launch, ...) then never imports torch (~4 s per start).
CONFIGS = {
    "replay": ("edgeinfer.sim.replay:ReplayConfig",),
    "launch": ("edgeinfer.launch:LaunchConfig",),
    "serve": ("edgeinfer.node.runtime:RuntimeConfig", "edgeinfer.core.transport:Endpoints"),
    "control": ("edgeinfer.control.loop:ControlConfig", "edgeinfer.core.transport:Endpoints"),
    "train": ("edgeinfer.engines.train:TrainConfig",),
    "distill": ("edgeinfer.engines.distill:DistillConfig",),
    "build": ("edgeinfer.engines.build:BuildConfig",),
    "hil": ("edgeinfer.sim.hil:HilConfig",),
    "sweep": ("edgeinfer.sim.sweep:SweepConfig",),
    "bench": ("edgeinfer.bench.suite:BenchConfig",),
}


def _config(name: str) -> type:
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = argv[0] if argv else None

    def add(p: argparse.ArgumentParser, command: str) -> None:  # the command's options, when it is the one run
        if command == chosen:
            add_options(p, *(_config(c) for c in CONFIGS[command]))

    parser = argparse.ArgumentParser(prog="edgeinfer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("replay", help="replay a recorded arm log through runtime + control over ZeroMQ")
    p.add_argument("--launch", type=Path, default=None, help="TOML launch file filling these options")
    add(p, "replay")
    p = sub.add_parser("launch", help="start and supervise the nodes of a TOML launch file (launch/*.toml); "
                                      "exits non-zero when any node failed")
    p.add_argument("file", type=Path, help="launch file: one table per node, named by its command ([serve], "
                                           "[replay], ...), started in the file's order")
    add(p, "launch")
    p = sub.add_parser("serve", help="run the runtime node (observations in, action chunks out)")
    add(p, "serve")
    p = sub.add_parser("control", help="run the fixed-rate control loop node")
    add(p, "control")
    p = sub.add_parser("train", help="train the target policy on the Schunk recordings")
    add(p, "train")
    p = sub.add_parser("distill", help="distill the learned drafter from the target on the training runs")
    add(p, "distill")
    p = sub.add_parser("build", help="build an engine (backend, precision, device), gated on held-out quality")
    add(p, "build")
    p = sub.add_parser("keys", help="write ZeroMQ CURVE key pairs for non-loopback endpoints (--curve-dir DIR)")
    p.add_argument("dir", type=Path, help="directory to create them in (never overwritten)")
    p = sub.add_parser("hil", help="hardware in the loop: replay a log here (replayer + control loop) against a "
                                   "runtime on another host (`edgeinfer serve` there; tcp://HOST:PORT is its chunk "
                                   "publisher, the run uses ports PORT..PORT+5); separates network from inference")
    add(p, "hil")
    p = sub.add_parser("sweep", help="many replays (logs x configurations from a TOML file, e.g. "
                                     "benchmarks/sweep.toml) as Ray tasks, on a cluster (--address) or local Ray; "
                                     "one table of the results (needs the `sweep` extra)")
    p.add_argument("file", type=Path, help="sweep file: [sweep] logs, out; [base]; [configs.NAME]; [grid]")
    add(p, "sweep")
    p = sub.add_parser("compare", help="compare two replay reports (A = baseline, B = candidate) figure by "
                                       "figure, with verdicts from the confidence intervals")
    p.add_argument("a", type=Path, metavar="A.json")
    p.add_argument("b", type=Path, metavar="B.json")
    p.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write the comparison as JSON")
    p.add_argument("--fail-on-regression", action="store_true", help="exit 1 when any figure is worse")
    p.add_argument("--alpha", type=float, default=0.05, help="per-figure significance level (default: 0.05)")
    p = sub.add_parser("bench", help="every ruler on real logs, target-only vs speculative (options below); "
                                     "suites: `bench engines` (backends and precisions), `bench spec` "
                                     "(speculative decoding: drafters, k, adaptive, sampling, the HF peer)",
                       description="Every ruler (time to first action, time per token, chunk throughput, "
                                   "end-to-end tails and misses in steady / idle-gap / overload replays, quality, "
                                   "zmq and wake-up floors), target-only vs speculative; --scenarios names a file "
                                   "in benchmarks/ (default, quick) or a TOML path. Suites with their own -h: "
                                   "`edgeinfer bench engines`, `edgeinfer bench spec`.")
    add(p, "bench")
    if argv[:1] == ["bench"] and argv[1:2] in (["engines"], ["spec"], ["transport"]):  # a suite: its own parser and -h
        args = argparse.Namespace(command="bench", suite=argv[1], rest=argv[2:])
    else:
        args = parser.parse_args(argv)
        args.suite, args.rest = None, argv[1:]
    if args.command == "bench":  # SIGTERM as Ctrl-C: the benches' cleanup runs, and their child processes end
        signal.signal(signal.SIGTERM, _interrupt)
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


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _run(args, parser) -> int:
    if args.command == "replay":
        from edgeinfer.sim.replay import ReplayConfig, replay

        launch_dir = args.launch.resolve().parent if args.launch else None
        launch = load_launch(args.launch, "replay")
        try:
            cfg = build(ReplayConfig, args, launch, launch_dir)
        except ValueError as e:
            raise ValueError(f"{args.launch}: {e}" if args.launch else str(e)) from None
        report = replay(cfg)
        print(f"wrote {cfg.out}/: report.json, ticks.csv, latency_histogram.png, latency.png, stages.png, "
              "runtime.log, control.log")
        if report["interrupted"]:
            return 130
        return 0 if all(code == 0 for code in report["process_exit_codes"].values()) else 1
    if args.command == "launch":
        from edgeinfer.launch import LaunchConfig, launch

        return launch(args.file, build(LaunchConfig, args))
    if args.command == "serve":
        from edgeinfer.core.transport import Endpoints
        from edgeinfer.node.runtime import RuntimeConfig, serve

        serve(build(RuntimeConfig, args), build(Endpoints, args))
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
        print(f"wrote {cfg.out} and {cfg.out.with_suffix('.pt')}; held-out metrics: "
              f"{policy.manifest['metrics_held_out']}")
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
        from edgeinfer.bench.suite import main as bench

        return bench(args.rest)
    if args.command == "distill":
        from edgeinfer.engines.distill import DistillConfig, distill
        from edgeinfer.engines.policy import load_policy

        cfg = build(DistillConfig, args)
        draft = distill(load_policy(), cfg)
        print(f"wrote {cfg.out}; held-out: {draft.manifest.get('metrics_held_out')}")
        return 0
    if args.command == "compare":
        from edgeinfer.sim.compare import main as compare

        return compare(args.a, args.b, args.json, args.fail_on_regression, args.alpha)
    if args.command == "hil":
        from edgeinfer.sim.hil import HilConfig, hil

        cfg = build(HilConfig, args)
        report = hil(cfg)
        print(f"wrote {cfg.out}/: report.json, ticks.csv, latency_histogram.png, latency.png, stages.png, control.log")
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
