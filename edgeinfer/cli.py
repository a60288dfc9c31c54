"""`edgeinfer` command line: replay (the main job), serve (runtime node), control (control loop node), train,
build (an engine, quality-gated)."""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from edgeinfer.core.commands import COMMANDS, SLO_INVALID_EXIT, config_classes
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


# the options a user reaches for first, listed at the top of `--help` (and in its usage line), in this order
FIRST_OPTIONS = ("--log", "--policy", "--out", "--budget-ms", "--deadline-ms", "--decode", "--backend", "--slo",
                 "--duration-s", "--endpoint", "--curve-dir", "--data", "--held-out", "--target")
HIDDEN_COMMANDS = ("fleet-robots",)  # internal: a node of `edgeinfer fleet-replay`, not listed by -h


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"edgeinfer {version('edgeinfer')}"
    except PackageNotFoundError:
        return "edgeinfer (not installed)"


def _first_options_on_top(p: argparse.ArgumentParser) -> None:
    """Move FIRST_OPTIONS into a group of their own at the top of -h, and into the usage line."""
    by_option = {s: a for a in p._actions for s in a.option_strings}
    first = [by_option[o] for o in FIRST_OPTIONS if o in by_option]
    if not first:
        return
    group = p.add_argument_group("the options used most (the rest, grouped by component, below)")
    for action in first:
        for g in p._action_groups:
            if action in g._group_actions:
                g._group_actions.remove(action)
        group._group_actions.append(action)
        action.generated = False  # shown in the usage line
    p._action_groups.remove(group)
    p._action_groups.insert(2, group)  # after positional arguments and -h
    rest = [a for a in p._actions if a not in first]
    hand_written = [a for a in rest if not getattr(a, "generated", False)]
    p._actions[:] = hand_written + first + [a for a in rest if a not in hand_written]  # the usage line's order


def _suggest(p: argparse.ArgumentParser, unknown: list[str]) -> None:
    """Refuse the first unknown option by name, with the closest known one (difflib: argparse's own
    suggest_on_error is Python 3.14's), in the usage of the command it was given to. Exits 2."""
    import difflib

    words = [u for u in unknown if u.startswith("-")] or unknown
    word = words[0].split("=", 1)[0]
    known = [s for a in p._actions for s in a.option_strings if a.help is not argparse.SUPPRESS]
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    p.error(f"unrecognized argument {word}" + (f"; did you mean {close[0]}?" if close else
                                                f" (`{p.prog} -h` lists the options)"))


def _option_error(e: OSError, p: argparse.ArgumentParser | None, args) -> str | None:
    """An OSError about a path or endpoint a command-line option gave, as one line naming that option."""
    if e.filename is None or p is None:
        return None
    name = str(e.filename)
    options = {a.dest: a.option_strings[0] for a in p._actions if a.option_strings}
    for dest, value in vars(args).items():
        if dest not in options or not isinstance(value, (str, Path)) or not str(value):
            continue
        if name != str(value) and not name.startswith(str(value).rstrip("/") + "/"):
            continue
        if isinstance(e, FileExistsError) and not Path(name).is_dir():
            why = f"a file is in the way of the folder {options[dest]} names; give a folder (created when missing)"
        elif isinstance(e, FileNotFoundError) and name == str(value) and dest.endswith("policy"):
            from edgeinfer.engines.paths import POLICY_NAMES

            why = f"no such manifest file, nor a shipped policy's name ({', '.join(POLICY_NAMES)})"
        elif isinstance(e, FileNotFoundError) and name == str(value):
            why = "no such file or folder (or, for an output, its parent folder cannot be created)"
        elif isinstance(e, NotADirectoryError):
            why = "a file where a folder should be"
        else:  # an endpoint's error (transport.EndpointError) says what and why already
            why = getattr(e, "text", None) or (e.strerror or str(e)).lower()
        return f"{options[dest]} {value}: {why}"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = argv[0] if argv else None

    parser = argparse.ArgumentParser(prog="edgeinfer", description=__doc__)
    parser.add_argument("--version", action="version", version=_version())
    listed = [c for c in COMMANDS if c not in HIDDEN_COMMANDS]
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(listed) + "}")
    subparsers = {}
    for command, spec in COMMANDS.items():  # core.commands: the one list of commands
        help_ = {} if command in HIDDEN_COMMANDS else {"help": spec.help}
        p = subparsers[command] = sub.add_parser(command, description=spec.description or spec.help, **help_)
        _arguments(p, command)
        if command == chosen:  # only the command being run imports its config classes: most never import torch
            add_options(p, *config_classes(command))
            _first_options_on_top(p)
            argv = argv[:1] + expand_bool_flags(p, argv[1:])  # a bool option alone means true
    if argv[:1] == ["bench"] and argv[1:2] in (["engines"], ["spec"], ["transport"], ["anytime"], ["fleet"]):  # own -h
        args = argparse.Namespace(command="bench", suite=argv[1], rest=argv[2:])
    else:
        args, unknown = parser.parse_known_args(argv)
        if unknown:
            _suggest(subparsers[args.command], unknown)
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
        if isinstance(e, OSError):
            text = _option_error(e, subparsers.get(args.command), args) or text
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
        if not all(code == 0 for code in report["process_exit_codes"].values()):
            return 1
        if (report.get("slo") or {}).get("verdict") == "INVALID":
            print(f"edgeinfer replay: SLO {cfg.slo!r} INVALID: exit code {SLO_INVALID_EXIT}", file=sys.stderr)
            return SLO_INVALID_EXIT
        return 0
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
