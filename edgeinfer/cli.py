"""`edgeinfer` command line: the one table of commands (COMMANDS), each parsed from its *Config dataclasses and run
by its entry point (edgeinfer/entry_points.py)."""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import NoReturn

from edgeinfer import entry_points as run
from edgeinfer.core import commands
from edgeinfer.core.commands import Command
from edgeinfer.core.config import add_options, build, expand_bool_flags, load_launch, name_options
from edgeinfer.core.lifecycle import exit_now, raise_interrupt

DESCRIPTION = ("edgeinfer: a learned robot policy in a control loop with hard deadlines. Start with `edgeinfer "
               "replay` (the main job: a recorded log through the runtime and control nodes, latency and deadline "
               "misses reported); every command below has its own --help.")

# ------------------------------------------------------------------------------------- the command table
# COMMANDS is the one list of commands: each one's entry point and *Config dataclasses (edgeinfer.entry_points,
# really imported), its help, positional arguments and node kind. main() builds every parser from it and
# registers it with the layers below (core.commands) at start-up; the fork server gets main itself, passed in.

def _replay_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--launch", type=Path, default=None, help="TOML launch file filling these options")


def _launch_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", type=Path, help="launch file: one table per node, named by its command ([serve], "
                                           "[replay], ...), started in the file's order")


def _keys_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path, help="directory to create them in (never overwritten)")


def _sweep_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", type=Path, help="sweep file: [sweep] logs, out; [base]; [configs.NAME]; [grid]")


def _compare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", type=Path, metavar="A.json", help="the baseline's report.json (edgeinfer replay --out)")
    p.add_argument("b", type=Path, metavar="B.json", help="the candidate's report.json")


def _fork_server(args) -> int:
    """The fork server's own process (procs/forkserver.py starts `python -m edgeinfer fork-server`): imports what
    the nodes share once, then forks each node to run this command line's main."""
    from edgeinfer.procs.forkserver import serve_forks

    serve_forks(main, run.preload_nodes)
    return 0


BENCH_SUITES = {
    "engines": Command("every (backend, precision[, CUDA graphs]) side by side: latency and parity, then the "
                       "ultrafast rows", run.bench_engines, run.bench_engines_configs),
    "spec": Command("speculative decoding side by side on held-out real observations: drafters, k, adaptive, "
                    "sampling, the HF peer", run.bench_spec, run.bench_spec_configs),
    "anytime": Command("step vs DCT action tokens: the anytime curve, cut budgets, a slowed engine",
                       run.bench_anytime, run.bench_anytime_configs),
    "fleet": Command("how many robots one machine serves, five ways of serving them", run.bench_fleet,
                     run.bench_fleet_configs),
    "transport": Command("the observation -> chunk round trip against raw pyzmq floors", run.bench_transport,
                         run.bench_transport_configs),
}

COMMANDS: dict[str, Command] = {
    "replay": Command("replay a recorded arm log through runtime + control over ZeroMQ", run.replay,
                      run.replay_configs, _replay_arguments, node="task",
                      description="Replay a recorded arm log through runtime + control over ZeroMQ, and report latency "
                                  "and deadline misses (docs/replay.md). Exit status: 0 done, 1 a node process "
                                  "failed, 2 an error before the run (one line naming its option), 3 --slo's verdict "
                                  "is INVALID (so that a CI job fails on a missed objective), 130 interrupted."),
    "launch": Command("start and supervise the nodes of a TOML launch file (launch/*.toml); exits non-zero when "
                      "any node failed", run.launch, run.launch_configs, _launch_arguments),
    "serve": Command("run the runtime node (observations in, action chunks out)", run.serve, run.serve_configs,
                     node="service", ready="chunks"),
    "fleet": Command("run the fleet runtime node: one runtime serving many robots (Join -> Admission, observations "
                     "-> action chunks, on one ROUTER; docs/fleet.md)", run.fleet, run.fleet_configs, node="service"),
    "fleet-replay": Command("replay N real logs as N robots (each its own clock and control loop) against one fleet "
                            "runtime, or one per robot; a report per robot and for the fleet (docs/fleet.md)",
                            run.fleet_replay, run.fleet_replay_configs),
    "fleet-robots": Command("run a group of fleet robots in one process (a node of `edgeinfer fleet-replay`)",
                            run.fleet_robots, run.fleet_robots_configs, node="task", hidden=True),
    "control": Command("run the fixed-rate control loop node", run.control, run.control_configs, node="service"),
    "train": Command("train the target policy on any logs `replay` reads (default: the Schunk recordings)",
                     run.train, run.train_configs),
    "distill": Command("distill the learned drafter from a target on its training data", run.distill,
                       run.distill_configs),
    "build": Command("build an engine (backend, precision, device), gated on held-out quality", run.build,
                     run.build_configs),
    "keys": Command("write ZeroMQ CURVE key pairs for non-loopback endpoints (--curve-dir DIR)", run.keys,
                    arguments=_keys_arguments),
    "hil": Command("hardware in the loop: replay a log here (replayer + control loop) against a runtime on another "
                   "host (`edgeinfer serve` there; tcp://HOST:PORT is its chunk publisher, the run uses ports "
                   "PORT..PORT+5); separates network from inference", run.hil, run.hil_configs, node="task"),
    "sweep": Command("many replays (logs x configurations from a TOML file, e.g. benchmarks/sweep.toml) as Ray "
                     "tasks, on a cluster (--address) or local Ray; one table of the results (needs the `sweep` "
                     "extra)", run.sweep, run.sweep_configs, _sweep_arguments),
    "compare": Command("compare two replay reports (A = baseline, B = candidate) figure by figure, with verdicts "
                       "from the confidence intervals", run.compare, run.compare_configs, _compare_arguments),
    "bench": Command("every ruler on real logs, target-only vs speculative (options below); suites: `bench "
                     "engines` (backends and precisions), `bench spec` (speculative decoding: drafters, k, "
                     "adaptive, sampling, the HF peer), `bench anytime` (step vs DCT action tokens: the anytime "
                     "curve, cut budgets, a slowed engine), `bench fleet` (robots served per way of serving them), "
                     "`bench transport` (the round trip against raw pyzmq)", run.bench, run.bench_configs,
                     description="Every ruler (time to first action, time per token, chunk throughput, end-to-end "
                                 "tails and misses in steady / idle-gap / overload replays, quality, zmq and wake-up "
                                 "floors), target-only vs speculative; --scenarios names a file in benchmarks/ "
                                 "(default, quick) or a TOML path. Suites with their own -h: `edgeinfer bench "
                                 "engines`, `edgeinfer bench spec`, `edgeinfer bench anytime`, `edgeinfer bench "
                                 "fleet`, `edgeinfer bench transport`.", suites=BENCH_SUITES),
    "fork-server": Command("the fork server's process (procs/forkserver.py)", _fork_server, hidden=True),
}


def register_commands() -> None:
    """Register COMMANDS with the layers below (core.commands): launch files, `replay --launch` and the process
    wirer look their commands up there. main() does it at start-up."""
    commands.register(COMMANDS)


# ------------------------------------------------------------------------------------------- the parsers

# the options a user reaches for first, listed at the top of `--help` (and in its usage line), in this order
FIRST_OPTIONS = ("--log", "--policy", "--out", "--budget-ms", "--deadline-ms", "--decode", "--backend", "--slo",
                 "--duration-s", "--endpoint", "--curve-dir", "--data", "--held-out", "--target")


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
            from edgeinfer.engines.models.paths import POLICY_NAMES

            why = f"no such manifest file, nor a shipped policy's name ({', '.join(POLICY_NAMES)})"
        elif isinstance(e, FileNotFoundError) and name == str(value):
            why = "no such file or folder (or, for an output, its parent folder cannot be created)"
        elif isinstance(e, NotADirectoryError):
            why = "a file where a folder should be"
        else:  # an endpoint's error (transport.EndpointError) says what and why already
            why = getattr(e, "text", None) or (e.strerror or str(e)).lower()
        return f"{options[dest]} {value}: {why}"
    return None


def _chosen(argv: list[str]) -> tuple[str, ...]:
    """The command path argv names (("bench", "spec")), () when it names none."""
    if not argv or argv[0] not in COMMANDS:
        return ()
    suites = COMMANDS[argv[0]].suites
    return (argv[0], argv[1]) if argv[1:2] and argv[1] in suites else (argv[0],)


def _parsers(chosen: tuple[str, ...]) -> tuple[argparse.ArgumentParser, dict[tuple, argparse.ArgumentParser]]:
    """The top parser, and each command's parser by its path; only the chosen command's options are added (its
    config classes imported): every command's from its *Config dataclasses (core.config.add_options)."""
    top = argparse.ArgumentParser(prog="edgeinfer", description=DESCRIPTION)
    top.add_argument("--version", action="version", version=_version())
    parsers: dict[tuple[str, ...], argparse.ArgumentParser] = {}

    def add(parent: argparse.ArgumentParser, table: dict[str, Command], path: tuple[str, ...]) -> None:
        listed = [name for name, c in table.items() if not c.hidden]
        sub = parent.add_subparsers(dest="suite" if path else "command", required=not path,
                                    metavar="{" + ",".join(listed) + "}")
        for name, command in table.items():
            help_ = {} if command.hidden else {"help": command.help}
            p = parsers[(*path, name)] = sub.add_parser(name, description=command.description or command.help,
                                                        **help_)
            if command.arguments is not None:
                command.arguments(p)
            if command.suites:
                add(p, command.suites, (*path, name))
            if (*path, name) == chosen:
                add_options(p, *command.config_classes())
                _first_options_on_top(p)

    add(top, COMMANDS, ())
    return top, parsers


def _command(path: tuple[str, ...]) -> Command:
    command = COMMANDS[path[0]]
    return command.suites[path[1]] if len(path) > 1 else command


def _configs(command: Command, args: argparse.Namespace, name: str) -> list:
    """The command's *Config instances from its options, over the [name] table of `--launch FILE` when given."""
    path = getattr(args, "launch", None)  # `replay --launch FILE`
    try:
        table = load_launch(path, name)
        return [build(cls, args, table, path.resolve().parent if path else None) for cls in command.config_classes()]
    except ValueError as e:
        raise ValueError(f"{path}: {e}" if path and not str(e).startswith(f"{path}:") else str(e)) from None


def main(argv: list[str] | None = None) -> int:
    typed = sys.argv[1:] if argv is None else list(argv)
    register_commands()
    chosen = _chosen(typed)
    top, parsers = _parsers(chosen)
    argv = typed
    if chosen:  # a bool option alone means true
        argv = typed[:len(chosen)] + expand_bool_flags(parsers[chosen], typed[len(chosen):])
    args, unknown = top.parse_known_args(argv)
    path = (args.command, *([args.suite] if getattr(args, "suite", None) else []))
    if unknown:
        _suggest(parsers[path], unknown)
    args.argv = typed  # what a bench records it was run with
    if path[0] == "bench":  # SIGTERM as Ctrl-C: the benches' cleanup runs, and their child processes end
        signal.signal(signal.SIGTERM, raise_interrupt)
    name = " ".join(path)
    try:
        command = _command(path)
        return command.run(args, *_configs(command, args, path[-1]))
    except KeyboardInterrupt:
        print(f"edgeinfer {name}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, TimeoutError, RuntimeError, KeyError) as e:
        # configuration, data and start-up errors already name their field, file or process: no traceback
        text = e.args[0] if isinstance(e, KeyError) and e.args else e  # KeyError's str() adds quotes
        if isinstance(e, OSError):
            text = _option_error(e, parsers.get(path), args) or text
        elif isinstance(e, ValueError) and getattr(args, "launch", None) is None and path in parsers:
            text = name_options(str(text), parsers[path])  # the options typed, not the config's fields
        print(f"edgeinfer {name}: error: {text}", file=sys.stderr)
        return 2


def process_main() -> NoReturn:
    """The `edgeinfer` program and `python -m edgeinfer`: main(), then exit with its status. A node's command
    (Command.node: serve, control, fleet, replay, hil, ...) ends without the interpreter's teardown
    (core.lifecycle.exit_now: 0.6-0.7 s with torch loaded), as a forked node does: whoever started it waits for it."""
    code = main()
    command = COMMANDS.get(sys.argv[1]) if len(sys.argv) > 1 else None
    if command is not None and command.node is not None:
        exit_now(code)
    sys.exit(code)


if __name__ == "__main__":
    process_main()
