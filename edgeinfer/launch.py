"""`edgeinfer launch FILE`: start the nodes a TOML launch file names, wait for their handshakes, supervise
them, and tear everything down on Ctrl-C, SIGTERM or a failure.

A launch file has one table per node, named by its edgeinfer command; the nodes start in the file's order,
each only once the one before it is ready:

    [serve]                        # a service: runs until the tasks are done (or Ctrl-C)
    obs = "tcp://127.0.0.1:5601"   # every key fills the command's *Config dataclasses (edgeinfer.core.config.load)
    [hil]                          # a task: the launch is done when every task has exited
    endpoint = "tcp://127.0.0.1:5602"

Every table is checked (edgeinfer.core.config.load: unknown keys and wrong types name the key) before anything starts,
and each node runs as `python -m edgeinfer <command> <its options>` (core.config.to_argv), in a session of its
own (its own process group), its output in LOG_DIR/<command>.log. Ready means: a runtime (serve) published a
Hello on its chunk endpoint (its own start-up handshake, after its engine's warm-up: transport.wait_for_hello);
a control node (which sends nothing before a run begins) and a task are ready once started (a task's handshakes
with its peers are its own business). A node that exits non-zero fails
the launch. Teardown (procs.nodes.NodeGroup, the wirer that replay and hil start their nodes with too):
SIGTERM to each node's process group, newest first, SIGKILL to what is left after grace_s, and the same for any
descendant that left the group (a replayer's runtime and control nodes run in sessions of their own).
`--dry-run true` prints the process graph as a launch file, with the nodes each replay or hil starts, and
starts nothing. Exit code: 0 when every node succeeded, 1 when any failed, 130 when interrupted.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from edgeinfer.core import commands, transport
from edgeinfer.core.config import load, read_toml
from edgeinfer.core.lifecycle import InterruptSignals
from edgeinfer.procs.node_spec import NodeSpec, to_toml
from edgeinfer.procs.nodes import Node, NodeGroup


@dataclass
class LaunchConfig:
    """How a launch starts, supervises and tears down its nodes."""

    grace_s: float = 10.0  # SIGTERM -> SIGKILL on teardown, s
    handshake_timeout_s: float = 300.0  # how long a service may take to be ready, s
    log_dir: Path | None = None  # each node's output as <command>.log (None: out/launch/<launch file's name>)
    # Print the process graph (the file's nodes as a launch file, and the nodes a replay among them starts) and
    # start nothing.
    dry_run: bool = False

    def __post_init__(self):
        self.log_dir = Path(self.log_dir) if self.log_dir is not None else None
        if not 0 < self.grace_s <= 600:
            raise ValueError(f"LaunchConfig.grace_s must be in (0, 600], got {self.grace_s}")
        if not self.handshake_timeout_s > 0:
            raise ValueError(f"LaunchConfig.handshake_timeout_s must be > 0, got {self.handshake_timeout_s}")


def load_nodes(path: Path) -> list[NodeSpec]:
    """The nodes of launch file `path`, in file order, each table checked against its command's *Config
    dataclasses (relative paths resolve against the file's folder). Raises ValueError naming the file and the
    table or key for invalid TOML, an unknown command, an unknown key or a wrong type; FileNotFoundError."""
    doc = read_toml(path)
    node_commands = commands.node_commands()  # registered by the command line
    unknown = [k for k in doc if k not in node_commands]
    if unknown or not doc:
        raise ValueError(f"{path}: {'no node tables' if not doc else f'unknown table(s) {unknown}'}; a launch "
                         f"file has one table per node, named by its command: {sorted(node_commands)}")
    base = path.resolve().parent
    nodes = []
    for command, table in doc.items():
        if not isinstance(table, dict):
            raise ValueError(f"{path}: {command} must be a table ([{command}]), got {table!r}")
        classes = commands.config_classes(command)
        known = set().union(*({f for f in cls.__dataclass_fields__} for cls in classes))
        if extra := sorted(set(table) - known):
            raise ValueError(f"{path}: [{command}]: unknown keys {extra}; known: {sorted(known)}")
        configs = []
        for cls in classes:
            part = {k: v for k, v in table.items() if k in cls.__dataclass_fields__}
            try:
                cfg = load(cls, part, base_dir=base)
            except ValueError as e:
                raise ValueError(f"{path}: [{command}]: {e}") from None
            configs.append(cfg)
        nodes.append(NodeSpec(command, tuple(configs)))
    return nodes


class Launch:
    """The running nodes of one launch file: start() them in order, supervise() until the tasks are done,
    close() (always) tears everything down (procs.nodes.NodeGroup). Use as a context manager."""

    def __init__(self, specs: list[NodeSpec], cfg: LaunchConfig, log_dir: Path, console: Console):
        self.specs, self.cfg, self.log_dir, self.console = specs, cfg, log_dir, console
        self.group = NodeGroup(cfg.grace_s, say=self._say)
        self.started: dict[int, Node] = {}  # index in specs -> its node

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _say(self, node: Node, text: str, style: str = "") -> None:
        self.console.print(f"[bold]{node.spec.command}[/bold] (pid {node.pid}): "
                           + (f"[{style}]{escape(text)}[/]" if style else escape(text)))

    def start(self) -> None:
        """Start each node, then wait for it to be ready before the next. Raises RuntimeError naming the
        node when one exits during start-up, TimeoutError when a service is not ready in time."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for i, spec in enumerate(self.specs):
            spec.log = self.log_dir / f"{spec.command}.log"
            spec.env = {"COLUMNS": os.environ.get("COLUMNS", "120")}
            node = self.started[i] = self.group.start(spec)
            self._say(node, f"started: {' '.join(spec.argv[2:4])} ... (log {spec.log})")
            if spec.task:
                node.state = "running"
                self._say(node, "running", "green")
                continue
            if spec.ready_endpoint is not None:
                self.group.await_hello(node, self.cfg.handshake_timeout_s, check=self.poll)
            node.ready_s, node.state = time.monotonic() - node.t_start, "ready"
            self._say(node, f"ready after {node.ready_s:.1f} s", "green")

    def poll(self) -> None:
        """Update node states from exited processes (and note their descendants, for teardown); raise
        RuntimeError naming a node that failed, with its log's tail."""
        for node in self.group.poll():
            code = node.returncode
            self._say(node, f"exited with code {code}", "green" if code == 0 else "red")
            if code != 0:
                raise RuntimeError(f"{node.spec.command} exited with code {code}; its log {node.spec.log} ends:\n"
                                   + "\n".join(node.tail(20_000).splitlines()[-20:]))

    def supervise(self) -> None:
        """Until every task has exited (every node, when there is no task). Raises RuntimeError as poll."""
        any_task = any(s.task for s in self.specs)
        while True:
            self.poll()
            if not [n for n in self.started.values() if n.returncode is None and (n.spec.task or not any_task)]:
                return
            self.group.wait_any(1.0)  # wakes when a child exits; the timeout refreshes descendants

    def close(self) -> None:
        """SIGTERM every live node's process group (newest first), SIGKILL whatever is left after grace_s,
        including descendants that left the group (NodeGroup.close)."""
        self.group.close()

    def table(self) -> Table:
        t = Table(title="edgeinfer launch")
        for col in ("node", "kind", "pid", "state", "ready after", "exit code"):
            t.add_column(col, no_wrap=True)
        t.add_column("log", overflow="fold")
        colour = {"done": "green", "stopped": "yellow", "failed": "red"}
        for i, spec in enumerate(self.specs):
            n = self.started.get(i)
            state = n.state if n is not None else "pending"
            t.add_row(spec.command, "task" if spec.task else "service", str(n.pid) if n else "-",
                      f"[{colour.get(state, 'default')}]{state}[/]",
                      f"{n.ready_s:.1f} s" if n is not None and n.ready_s is not None else "-",
                      str(n.returncode) if n is not None and n.returncode is not None else "-",
                      str(spec.log or "-"))
        return t


def graph(specs: list[NodeSpec]) -> str:
    """The process graph of a launch file's nodes as a launch file, each replay followed by the nodes it starts
    (commented out: the replay starts them itself, on endpoints it picks when it runs)."""
    text = to_toml(specs)
    for spec in specs:
        if spec.command in ("replay", "hil"):
            inner = to_toml(_nodes_of(spec))
            text += f"\n# the nodes [{spec.command}] starts:\n" + "".join(f"# {line}\n" if line else "#\n"
                                                                           for line in inner.splitlines())
    return text


def _nodes_of(spec: NodeSpec) -> list[NodeSpec]:
    if spec.command == "replay":
        from edgeinfer.sim.replay import replay_nodes

        return replay_nodes(spec.configs[0], transport.Endpoints.free_loopback())
    from edgeinfer.sim.hil import hil_endpoints, hil_nodes

    return hil_nodes(spec.configs[0], hil_endpoints(spec.configs[0])[0])


def launch(path: Path, cfg: LaunchConfig | None = None, console: Console | None = None) -> int:
    """Run launch file `path` (see the module docstring). Returns the exit code: 0 when every node succeeded
    (services stopped at the end count as succeeded), 1 when any node failed, 130 on SIGINT/SIGTERM. Raises
    ValueError for a bad launch file (nothing is started then)."""
    cfg = cfg or LaunchConfig()
    console = console or Console()
    path = Path(path)
    nodes = load_nodes(path)
    if cfg.dry_run:
        print(graph(nodes), end="")
        return 0
    log_dir = cfg.log_dir or Path("out") / "launch" / path.stem
    signals = InterruptSignals()
    code = 0
    try:
        with Launch(nodes, cfg, log_dir, console) as run:
            try:
                run.start()
                run.supervise()
            except KeyboardInterrupt:
                console.print("[yellow]interrupted: tearing down[/yellow]")
                code = 130
            except (RuntimeError, TimeoutError) as e:
                console.print(f"[red]{escape(str(e))}[/red]")
                code = 1
            finally:
                signals.ignore()  # a second Ctrl-C must not cut the teardown short
    finally:
        signals.restore()
    console.print(run.table())
    if code == 0 and any(n.state == "failed" for n in run.group.nodes):
        code = 1
    return code
