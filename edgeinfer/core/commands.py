"""The registry of the edgeinfer commands: what each one is, as the layers below the command line need to know it.

The table itself (each command's entry point and *Config dataclasses, really imported) is the command line's
(edgeinfer.cli.COMMANDS); the command line registers it here at start-up (edgeinfer.cli.register_commands), so that
the layers below it read it without importing upward: a launch file (edgeinfer.launch) and `edgeinfer replay
--launch` (core.config.load_launch) accept a table for each command, and the process wirer (edgeinfer.procs)
knows which commands are nodes, and how a service says it is ready. A process that never runs the command line
(a Ray task of a sweep) builds and starts NodeSpecs without it: only those lookups need the table.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Callable, Literal

# `replay --slo ...` whose verdict is INVALID exits with this (CI: a missed objective fails the job); a sweep counts
# such a run as completed (its verdict in the table), not failed
SLO_INVALID_EXIT = 3


@dataclass(frozen=True)
class Command:
    """One edgeinfer command.

    help: the line `edgeinfer -h` shows. run: its entry point, `run(args, *configs) -> exit code`: args the parsed
    namespace (its `argv`: the command line after `edgeinfer`), configs one instance of each class `configs()`
    returns, filled from the options. configs: None for a command without options, else a function that imports
    and returns its *Config dataclasses (imported only for the command that runs: most never import torch), whose
    fields are its options (one flat option set, core.config.add_options). arguments: adds what no dataclass
    holds (positional arguments). node: how a launch file runs it: a "service" runs until the launch's tasks are
    done, a "task" is done when it exits (None: not a node). ready: for a service, the field of its configs on
    which it publishes its Hello when ready (None: ready once started). description: `edgeinfer COMMAND -h`'s
    text above the options (None: the help line). hidden: not listed by `edgeinfer -h` (internal). suites: its
    own subcommands (`edgeinfer bench engines`), each a Command.
    """

    help: str
    run: Callable[..., int]
    configs: Callable[[], tuple[type, ...]] | None = None
    arguments: Callable[[argparse.ArgumentParser], None] | None = None
    node: Literal["service", "task"] | None = None
    ready: str | None = None
    description: str | None = None
    hidden: bool = False
    suites: dict[str, Command] = field(default_factory=dict)

    def config_classes(self) -> tuple[type, ...]:
        """Its *Config dataclasses, imported now (() for a command without options)."""
        return self.configs() if self.configs is not None else ()


_registered: dict[str, Command] = {}


def register(table: dict[str, Command]) -> None:
    """Make `table` the commands the layers below the command line look up (replacing any registered before)."""
    _registered.clear()
    _registered.update(table)


def registered() -> dict[str, Command]:
    """The registered table. Raises RuntimeError when none is (the command line registers it at start-up)."""
    if not _registered:
        raise RuntimeError("no edgeinfer command table is registered: edgeinfer.cli.register_commands() does it "
                           "(edgeinfer.cli.main at start-up)")
    return _registered


def node_commands() -> tuple[str, ...]:
    """The commands that are nodes: the tables `edgeinfer launch` starts."""
    return tuple(name for name, c in registered().items() if c.node is not None)


def config_tables() -> tuple[str, ...]:
    """The commands with options: the tables a TOML file may hold (`edgeinfer replay --launch` reads [replay] and
    skips the others), so that a typo is refused, not run with defaults."""
    return tuple(name for name, c in registered().items() if c.configs is not None)


def node(command: str) -> Command:
    """The registered node `command`. Raises ValueError naming it when it is not a node."""
    c = registered().get(command)
    if c is None or c.node is None:
        raise ValueError(f"{command!r} is not an edgeinfer node; nodes: {sorted(node_commands())}")
    return c


def config_classes(command: str) -> tuple[type, ...]:
    """The *Config dataclasses of `command`, imported now. Raises KeyError naming an unknown command."""
    table = registered()
    if command not in table:
        raise KeyError(f"unknown edgeinfer command {command!r}; known: {sorted(table)}")
    return table[command].config_classes()
