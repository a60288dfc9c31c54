"""`edgeinfer launch FILE`: start the nodes a TOML launch file names, wait for their handshakes, supervise
them, and tear everything down on Ctrl-C, SIGTERM or a failure.

A launch file has one table per node, named by its edgeinfer command; the nodes start in the file's order,
each only once the one before it is ready:

    [serve]                        # a service: runs until the tasks are done (or Ctrl-C)
    obs = "tcp://127.0.0.1:5601"   # every key fills the command's *Config dataclasses (config_cli.build)
    [hil]                          # a task: the launch is done when every task has exited
    endpoint = "tcp://127.0.0.1:5602"

Every table is checked (config_cli.build: unknown keys and wrong types name the key) before anything starts,
and each node runs as `python -m edgeinfer <command> <its options>` (config_cli.to_argv), in a session of its
own (its own process group), its output in LOG_DIR/<command>.log. Ready means: a runtime (serve) published a
Hello on its chunk endpoint (its own start-up handshake, after its engine's warm-up: transport.wait_for_hello);
a control node (which sends nothing before a run begins) and a task are ready once started (a task's handshakes
with its peers are its own business). A node that exits non-zero fails
the launch. Teardown: SIGTERM to each node's process group, newest first, SIGKILL to what is left after
grace_s, and the same for any descendant that left the group (a replayer's runtime and control nodes run in
sessions of their own). Exit code: 0 when every node succeeded, 1 when any failed, 130 when interrupted.
"""
from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import zmq
from rich.console import Console
from rich.table import Table

from edgeinfer.core import transport
from edgeinfer.core.config import build, to_argv
from edgeinfer.core.lifecycle import PARENT_PID_ENV


@dataclass
class LaunchConfig:
    """grace_s: SIGTERM -> SIGKILL on teardown. handshake_timeout_s: how long a service may take to be ready.
    log_dir: each node's output as <command>.log (None: out/launch/<launch file's name>)."""

    grace_s: float = 10.0
    handshake_timeout_s: float = 300.0
    log_dir: Path | None = None

    def __post_init__(self):
        self.log_dir = Path(self.log_dir) if self.log_dir is not None else None
        if not 0 < self.grace_s <= 600:
            raise ValueError(f"LaunchConfig.grace_s must be in (0, 600], got {self.grace_s}")
        if not self.handshake_timeout_s > 0:
            raise ValueError(f"LaunchConfig.handshake_timeout_s must be > 0, got {self.handshake_timeout_s}")


def _replay():
    from edgeinfer.sim.replay import ReplayConfig
    return (ReplayConfig,)


def _serve():
    from edgeinfer.node.runtime import RuntimeConfig
    return (RuntimeConfig, transport.Endpoints)


def _control():
    from edgeinfer.control.loop import ControlConfig
    return (ControlConfig, transport.Endpoints)


def _hil():
    from edgeinfer.sim.hil import HilConfig
    return (HilConfig,)


# command -> (its *Config classes, imported on use; a task (True) or a service (False))
NODE_KINDS = {"replay": (_replay, True), "hil": (_hil, True), "serve": (_serve, False), "control": (_control, False)}


@dataclass
class Node:
    """One child process of a launch: its command, argv, state and exit code."""

    command: str
    argv: list[str]
    task: bool
    ready_endpoint: str | None = None  # a service's chunk PUB: ready at its first Hello there
    endpoints: transport.Endpoints | None = None
    proc: subprocess.Popen | None = None
    log: Path | None = None
    state: str = "pending"  # pending, starting, ready, done, failed, stopped
    t_start: float = 0.0
    ready_s: float | None = None
    returncode: int | None = None
    descendants: dict[int, str] = field(default_factory=dict)  # pid -> start time, seen while it ran


def load_nodes(path: Path) -> list[Node]:
    """The nodes of launch file `path`, in file order, each table checked against its command's *Config
    dataclasses (relative paths resolve against the file's folder). Raises ValueError naming the file and the
    table or key for invalid TOML, an unknown command, an unknown key or a wrong type; FileNotFoundError."""
    with open(path, "rb") as fh:
        try:
            doc = tomllib.load(fh)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: {e}") from None
    unknown = [k for k in doc if k not in NODE_KINDS]
    if unknown or not doc:
        raise ValueError(f"{path}: {'no node tables' if not doc else f'unknown table(s) {unknown}'}; a launch "
                         f"file has one table per node, named by its command: {sorted(NODE_KINDS)}")
    base = path.resolve().parent
    nodes = []
    for command, table in doc.items():
        classes_of, task = NODE_KINDS[command]
        if not isinstance(table, dict):
            raise ValueError(f"{path}: {command} must be a table ([{command}]), got {table!r}")
        classes = classes_of()
        known = set().union(*({f for f in cls.__dataclass_fields__} for cls in classes))
        if extra := sorted(set(table) - known):
            raise ValueError(f"{path}: [{command}]: unknown keys {extra}; known: {sorted(known)}")
        argv, endpoints = [], None
        for cls in classes:
            part = {k: v for k, v in table.items() if k in cls.__dataclass_fields__}
            try:
                cfg = build(cls, argparse.Namespace(), part, base)
            except ValueError as e:
                raise ValueError(f"{path}: [{command}]: {e}") from None
            if isinstance(cfg, transport.Endpoints):
                endpoints = cfg
            argv += to_argv(cfg)
        ready = endpoints.chunks if (endpoints is not None and command == "serve") else None
        nodes.append(Node(command, [sys.executable, "-m", "edgeinfer", command, *argv], task, ready, endpoints))
    return nodes


def _proc_start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks): with the pid, names one process for good.
    None when there is no such process or it is a zombie (dead, waiting to be reaped)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def descendants(pid: int) -> dict[int, str]:
    """{pid: start time} of every living descendant of `pid` (from /proc/*/stat parent pids)."""
    parent_of = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent_of[int(d)] = int(fields[1])
    out, frontier = {}, [pid]
    while frontier:
        p = frontier.pop()
        for child, parent in parent_of.items():
            if parent == p and child not in out:
                if (start := _proc_start_time(child)) is not None:
                    out[child] = start
                    frontier.append(child)
    return out


class Launch:
    """The running nodes of one launch file: start() them in order, supervise() until the tasks are done,
    close() (always) tears everything down. Use as a context manager."""

    def __init__(self, nodes: list[Node], cfg: LaunchConfig, log_dir: Path, console: Console):
        self.nodes, self.cfg, self.log_dir, self.console = nodes, cfg, log_dir, console
        self.ctx = zmq.Context()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _say(self, node: Node, text: str, style: str = "") -> None:
        pid = node.proc.pid if node.proc is not None else "-"
        self.console.print(f"[bold]{node.command}[/bold] (pid {pid}): " + (f"[{style}]{text}[/]" if style else text))

    def start(self) -> None:
        """Start each node, then wait for it to be ready before the next. Raises RuntimeError naming the
        node when one exits during start-up, TimeoutError when a service is not ready in time."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            node.log = self.log_dir / f"{node.command}.log"
            env = {**os.environ, PARENT_PID_ENV: str(os.getpid()), "COLUMNS": os.environ.get("COLUMNS", "120")}
            with node.log.open("w") as out:  # the child holds its own copy of the descriptor
                node.proc = subprocess.Popen(node.argv, stdout=out, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True, env=env)
            node.t_start, node.state = time.monotonic(), "starting"
            self._say(node, f"started: {' '.join(node.argv[2:4])} ... (log {node.log})")
            if node.ready_endpoint is not None:
                self._await_hello(node)
            if node.task:
                node.state = "running"
                self._say(node, "running", "green")
            else:
                node.ready_s, node.state = time.monotonic() - node.t_start, "ready"
                self._say(node, f"ready after {node.ready_s:.1f} s", "green")

    def _await_hello(self, node: Node) -> None:
        sock = transport.sub(self.ctx, node.ready_endpoint, curve=node.endpoints.curve_keys())
        try:
            def alive():  # any node started so far that exited: poll() records it and raises if it failed
                if any(n.proc is not None and n.returncode is None and n.proc.poll() is not None for n in self.nodes):
                    self.poll()
                if node.returncode is not None:
                    raise RuntimeError(f"{node.command} exited with code {node.returncode} during start-up")
            transport.wait_for_hello([transport.Receiver(sock)], self.cfg.handshake_timeout_s, check=alive)
        finally:
            sock.close(linger=0)

    def poll(self) -> None:
        """Update node states from exited processes and note their descendants (for teardown); raise
        RuntimeError naming a node that failed."""
        for node in self.nodes:
            if node.proc is None or node.returncode is not None:
                continue
            node.descendants.update(descendants(node.proc.pid))
            if (code := node.proc.poll()) is None:
                continue
            node.returncode = code
            node.state = "done" if code == 0 else "failed"
            self._say(node, f"exited with code {code}", "green" if code == 0 else "red")
            if code != 0:
                raise RuntimeError(f"{node.command} exited with code {code}; its log {node.log} ends:\n"
                                   + _tail(node.log))

    def supervise(self) -> None:
        """Until every task has exited (every node, when there is no task). Raises RuntimeError as poll."""
        pidfds = {}
        for node in self.nodes:
            try:
                pidfds[os.pidfd_open(node.proc.pid)] = node
            except (OSError, AttributeError):  # exited and reaped already, or no pidfd (wake on the timeout)
                pass
        try:
            while True:
                self.poll()
                waiting = [n for n in self.nodes if n.returncode is None and (n.task or not any(m.task for m in
                                                                                                  self.nodes))]
                if not waiting:
                    return
                live = [fd for fd, n in pidfds.items() if n.returncode is None]
                select.select(live, [], [], 1.0)  # wakes when a child exits; the timeout refreshes descendants
        finally:
            for fd in pidfds:
                os.close(fd)

    def close(self) -> None:
        """SIGTERM every live node's process group (newest first), SIGKILL whatever is left after grace_s,
        including descendants that left the group; record each node's exit code."""
        live = [n for n in reversed(self.nodes) if n.proc is not None and n.proc.poll() is None]
        for node in live:
            node.descendants.update(descendants(node.proc.pid))
            _signal_group(node.proc.pid, signal.SIGTERM)
            self._say(node, "SIGTERM")
        deadline = time.monotonic() + self.cfg.grace_s
        for node in live:
            try:
                node.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(node.proc.pid, signal.SIGKILL)
                node.proc.wait()
                self._say(node, f"SIGKILL after {self.cfg.grace_s} s", "red")
        for node in self.nodes:  # a grandchild in a session of its own, still running after its parent
            for pid, start in node.descendants.items():
                if _proc_start_time(pid) == start:
                    _kill_pid(pid, start, self.cfg.grace_s)
            if node.proc is not None and node.returncode is None:
                node.returncode = node.proc.returncode
                node.state = "stopped" if node.state in ("ready", "running", "starting") else node.state
        self.ctx.destroy(linger=0)

    def table(self) -> Table:
        t = Table(title="edgeinfer launch")
        for col in ("node", "kind", "pid", "state", "ready after", "exit code"):
            t.add_column(col, no_wrap=True)
        t.add_column("log", overflow="fold")
        colour = {"done": "green", "stopped": "yellow", "failed": "red"}
        for n in self.nodes:
            t.add_row(n.command, "task" if n.task else "service", str(n.proc.pid) if n.proc else "-",
                      f"[{colour.get(n.state, 'default')}]{n.state}[/]",
                      f"{n.ready_s:.1f} s" if n.ready_s is not None else "-",
                      str(n.returncode) if n.returncode is not None else "-", str(n.log or "-"))
        return t


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the node leads its own session, so its group id is its pid
    except ProcessLookupError:
        pass


def _kill_pid(pid: int, start: str, grace_s: float) -> None:
    """SIGTERM, then SIGKILL after grace_s, a process named by (pid, start time) that is not our child."""
    for sig in (signal.SIGTERM, signal.SIGCONT):  # a stopped process handles SIGTERM only once continued
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
    deadline = time.monotonic() + grace_s
    while _proc_start_time(pid) == start and time.monotonic() < deadline:
        time.sleep(0.02)  # not our child: no pidfd wait for a zombie we cannot reap; a short poll
    if _proc_start_time(pid) == start:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _tail(path: Path | None, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except (OSError, AttributeError):
        return "(no log)"


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def launch(path: Path, cfg: LaunchConfig | None = None, console: Console | None = None) -> int:
    """Run launch file `path` (see the module docstring). Returns the exit code: 0 when every node succeeded
    (services stopped at the end count as succeeded), 1 when any node failed, 130 on SIGINT/SIGTERM. Raises
    ValueError for a bad launch file (nothing is started then)."""
    cfg = cfg or LaunchConfig()
    console = console or Console()
    path = Path(path)
    nodes = load_nodes(path)
    log_dir = cfg.log_dir or Path("out") / "launch" / path.stem
    previous = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
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
                console.print(f"[red]{e}[/red]")
                code = 1
            finally:
                for s in previous:  # a second Ctrl-C must not cut the teardown short
                    signal.signal(s, signal.SIG_IGN)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    console.print(run.table())
    if code == 0 and any(n.state == "failed" for n in nodes):
        code = 1
    return code
