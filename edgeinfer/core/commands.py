"""The edgeinfer commands, listed once: name -> the *Config dataclasses its options fill (as "module:Class",
imported only when that command runs), its one-line help, and how a launch file runs it.

The command line (edgeinfer.cli) builds its subcommands from this table, a launch file (edgeinfer.launch) and
`edgeinfer replay --launch` (core.config.load_launch) accept a table for each command that is a node, and the
process wirer (edgeinfer.procs) turns a node's configs into `python -m edgeinfer <command> <options>`. The
classes are named, not imported: this module sits below every layer that defines them.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Literal

# `replay --slo ...` whose verdict is INVALID exits with this (CI: a missed objective fails the job); a sweep counts
# such a run as completed (its verdict in the table), not failed
SLO_INVALID_EXIT = 3


@dataclass(frozen=True)
class Command:
    """help: the one line `edgeinfer -h` shows. configs: "module:Class" of each *Config dataclass whose fields
    are the command's options (one flat option set, core.config.add_options). node: how a launch file runs it:
    a "service" runs until the launch's tasks are done, a "task" is done when it exits (None: not a node).
    ready: for a service, the Endpoints field on which it publishes its Hello when ready (None: ready once
    started). description: `edgeinfer COMMAND -h`'s text above the options (None: the help line)."""

    help: str
    configs: tuple[str, ...] = ()
    node: Literal["service", "task"] | None = None
    ready: str | None = None
    description: str | None = None


_ENDPOINTS = "edgeinfer.core.transport:Endpoints"

COMMANDS: dict[str, Command] = {
    "replay": Command("replay a recorded arm log through runtime + control over ZeroMQ",
                      ("edgeinfer.sim.config:ReplayConfig",), node="task",
                      description="Replay a recorded arm log through runtime + control over ZeroMQ, and report latency "
                                  "and deadline misses (docs/replay.md). Exit status: 0 done, 1 a node process "
                                  "failed, 2 an error before the run (one line naming its option), 3 --slo's verdict "
                                  "is INVALID (so that a CI job fails on a missed objective), 130 interrupted."),
    "launch": Command("start and supervise the nodes of a TOML launch file (launch/*.toml); exits non-zero when "
                      "any node failed", ("edgeinfer.launch:LaunchConfig",)),
    "serve": Command("run the runtime node (observations in, action chunks out)",
                     ("edgeinfer.node.runtime:RuntimeConfig", _ENDPOINTS), node="service", ready="chunks"),
    "fleet": Command("run the fleet runtime node: one runtime serving many robots (Join -> Admission, observations "
                     "-> action chunks, on one ROUTER; docs/fleet.md)", ("edgeinfer.node.fleet_config:FleetConfig",),
                     node="service"),
    "fleet-replay": Command("replay N real logs as N robots (each its own clock and control loop) against one fleet "
                            "runtime, or one per robot; a report per robot and for the fleet (docs/fleet.md)",
                            ("edgeinfer.sim.fleet_replay:FleetReplayConfig",)),
    "fleet-robots": Command("run a group of fleet robots in one process (a node of `edgeinfer fleet-replay`)",
                            ("edgeinfer.sim.fleet_group:FleetRobotsConfig",), node="task"),
    "control": Command("run the fixed-rate control loop node", ("edgeinfer.control.loop:ControlConfig", _ENDPOINTS),
                       node="service"),
    "train": Command("train the target policy on any logs `replay` reads (default: the Schunk recordings)",
                     ("edgeinfer.engines.fit_config:TrainConfig",)),
    "distill": Command("distill the learned drafter from a target on its training data",
                       ("edgeinfer.engines.fit_config:DistillConfig",)),
    "build": Command("build an engine (backend, precision, device), gated on held-out quality",
                     ("edgeinfer.engines.build:BuildConfig",)),
    "keys": Command("write ZeroMQ CURVE key pairs for non-loopback endpoints (--curve-dir DIR)"),
    "hil": Command("hardware in the loop: replay a log here (replayer + control loop) against a runtime on another "
                   "host (`edgeinfer serve` there; tcp://HOST:PORT is its chunk publisher, the run uses ports "
                   "PORT..PORT+5); separates network from inference", ("edgeinfer.sim.hil:HilConfig",), node="task"),
    "sweep": Command("many replays (logs x configurations from a TOML file, e.g. benchmarks/sweep.toml) as Ray "
                     "tasks, on a cluster (--address) or local Ray; one table of the results (needs the `sweep` "
                     "extra)", ("edgeinfer.sim.sweep:SweepConfig",)),
    "compare": Command("compare two replay reports (A = baseline, B = candidate) figure by figure, with verdicts "
                       "from the confidence intervals"),
    "bench": Command("every ruler on real logs, target-only vs speculative (options below); suites: `bench "
                     "engines` (backends and precisions), `bench spec` (speculative decoding: drafters, k, "
                     "adaptive, sampling, the HF peer), `bench anytime` (step vs DCT action tokens: the anytime "
                     "curve, cut budgets, a slowed engine), `bench fleet` (robots served per way of serving them)",
                     ("edgeinfer.bench.suite:BenchConfig",),
                     description="Every ruler (time to first action, time per token, chunk throughput, end-to-end "
                                 "tails and misses in steady / idle-gap / overload replays, quality, zmq and wake-up "
                                 "floors), target-only vs speculative; --scenarios names a file in benchmarks/ "
                                 "(default, quick) or a TOML path. Suites with their own -h: `edgeinfer bench "
                                 "engines`, `edgeinfer bench spec`, `edgeinfer bench anytime`, `edgeinfer bench "
                                 "fleet`."),
}

# the tables `edgeinfer launch` starts: one per node command
NODE_COMMANDS = tuple(name for name, c in COMMANDS.items() if c.node is not None)
# the tables a TOML file may hold (`edgeinfer replay --launch` reads [replay] and skips the others): one per
# command with options, so that a typo is refused, not run with defaults
CONFIG_TABLES = tuple(name for name, c in COMMANDS.items() if c.configs)


def config_classes(command: str) -> tuple[type, ...]:
    """The *Config dataclasses of `command`, imported now. Raises KeyError naming an unknown command."""
    if command not in COMMANDS:
        raise KeyError(f"unknown edgeinfer command {command!r}; known: {sorted(COMMANDS)}")
    out = []
    for name in COMMANDS[command].configs:
        module, _, attr = name.partition(":")
        out.append(getattr(importlib.import_module(module), attr))
    return tuple(out)
