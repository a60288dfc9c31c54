"""A node of a process graph, described, not started: `python -m edgeinfer <command> <options>` with its
*Config dataclasses, log file and how to start it. A launch file's tables become NodeSpecs (edgeinfer.launch), a
replay builds the same (edgeinfer.sim.replay.replay_nodes), and edgeinfer.procs.nodes starts either; to_toml
renders any list of them as a launch file, so a replay's graph can be read, or run, as one.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from edgeinfer.core import commands
from edgeinfer.core.config import field_default, to_argv


@dataclass
class NodeSpec:
    """command: an edgeinfer command that is a node (core.commands.node_commands(): checked by `task` and
    `ready_endpoint`, the lookups of the registered command table; a node started without them, as a sweep's Ray
    task starts its replay, needs no table). configs: its *Config instances
    (their fields become its options, core.config.to_argv). name: its role in the graph and its log's stem
    (default: the command). log: its stdout and stderr (None: discarded). fork: forked from the fork server
    (procs/forkserver.py) instead of a fresh interpreter. env: added to its environment (not with fork).
    options: command-line options already rendered from its configs (to_argv), appended after `configs`' own:
    for a starter that holds argv, not dataclasses (a sweep's Ray task)."""

    command: str
    configs: tuple = ()
    name: str = ""
    log: Path | None = None
    fork: bool = False
    env: dict[str, str] = field(default_factory=dict)
    options: tuple[str, ...] = ()

    def __post_init__(self):
        if self.fork and self.env:
            raise ValueError(f"NodeSpec {self.command}: env is not passed to a forked node (fork=True)")
        self.configs, self.options = tuple(self.configs), tuple(self.options)
        self.name = self.name or self.command
        self.log = Path(self.log) if self.log is not None else None

    @property
    def task(self) -> bool:
        """A task is done when it exits; a service runs until it is stopped. Raises ValueError for a command that
        is not a node."""
        return commands.node(self.command).node == "task"

    @property
    def ready_endpoint(self) -> str | None:
        """Where a service publishes its Hello once ready (None: ready once started). Raises ValueError for a
        command that is not a node."""
        field_name = commands.node(self.command).ready
        for cfg in self.configs:
            if field_name is not None and hasattr(cfg, field_name):
                return getattr(cfg, field_name)
        return None

    @property
    def args(self) -> list[str]:
        """`edgeinfer` arguments: the command and its options."""
        return [self.command, *(a for cfg in self.configs for a in to_argv(cfg)), *self.options]

    @property
    def argv(self) -> list[str]:
        """The whole command line of a fresh interpreter."""
        return [sys.executable, "-m", "edgeinfer", *self.args]

    def table(self) -> dict:
        """Its launch-file table: the fields of its configs that differ from their defaults (nested dataclasses
        as nested tables; None left out, as to_argv leaves it out), so that it reads at a glance."""
        out: dict = {}
        for cfg in self.configs:
            out.update(_fields(cfg, _default(type(cfg))))
        return out


def _default(cls) -> dict:
    """Field name -> default of dataclass `cls` (fields without one are left out: always shown)."""
    defaults = {f.name: field_default(f) for f in dataclasses.fields(cls)}
    return {name: d for name, d in defaults.items() if d is not dataclasses.MISSING}


def _fields(obj, defaults: dict) -> dict:
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            if sub := _fields(value, _default(type(value))):
                out[f.name] = sub
        elif value is not None and (f.name not in defaults or value != defaults[f.name]):
            # absolute: launch reads a file's relative paths against its folder, not the working directory
            out[f.name] = value.absolute() if isinstance(value, Path) else value
    return out


def to_toml(specs: list[NodeSpec]) -> str:
    """`specs` as a launch file (one table per node, in order; edgeinfer.launch.load_nodes reads it back to the
    same argv). Raises ValueError for two nodes of one command (a launch file has one table per command)."""
    seen = [s.command for s in specs]
    if dup := sorted({c for c in seen if seen.count(c) > 1}):
        raise ValueError(f"a launch file has one table per command; {dup} appear more than once")
    lines: list[str] = []
    for spec in specs:
        log = f": log {spec.log.absolute()}" if spec.log else ""
        lines.append(f"# {spec.name}{log}" + (" (forked)" if spec.fork else ""))
        _table(lines, spec.command, spec.table())
    return "\n".join(lines) + "\n"


def _table(lines: list[str], name: str, values: dict, top: bool = True) -> None:
    subtables = {k: v for k, v in values.items() if isinstance(v, dict)}
    scalars = [f"{k} = {_value(v)}" for k, v in values.items() if k not in subtables]
    if top or scalars:  # a nested table with only tables inside needs no header of its own
        lines += [f"[{name}]", *scalars, ""]
    for k, v in subtables.items():
        _table(lines, f"{name}.{k}", v, top=False)


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return json.dumps(str(v))  # a TOML basic string: JSON's escapes are TOML's
