"""The one process wirer: start the nodes a NodeSpec describes, check them during start-up, wait for a
service's Hello, supervise them, and tear them down leaving no process behind.

Every node runs `edgeinfer <command> <options>`, as `python -m edgeinfer ...` or forked from the fork server
(spec.fork, procs/forkserver.py), in a session of its own (Ctrl-C on the terminal reaches only its starter,
which stops it by message or signal), its stdout and stderr in spec.log, with EDGEINFER_PARENT_PID naming this
process (or the fork server), so that a node never outlives its starter (core.lifecycle). Teardown
(NodeGroup.close): SIGTERM (and SIGCONT, for a stopped one) to each live node's process group, newest first,
SIGKILL to what is left after grace_s, and the same for every descendant seen while it ran, which may have left
the group (a replay's runtime and control nodes run in sessions of their own). Process trees come from psutil;
a (pid, create time) pair, which psutil.Process holds, names a process for good.

Users: edgeinfer.launch (a launch file's nodes), edgeinfer.sim.replay and edgeinfer.sim.hil (the runtime and
control nodes of a run), edgeinfer.bench.transport_costs (a null runtime). Helper processes that are not nodes
(a measuring peer: the hil round-trip prober, the transport bench's echo peers) start the same way through
procs/peers.py.
"""
from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

import psutil
import zmq

from edgeinfer.core import transport
from edgeinfer.core.lifecycle import PARENT_PID_ENV
from edgeinfer.procs.node_spec import NodeSpec

# Who sends a node a signal its own code does not: a hint for the error that names it.
_SIGNAL_CAUSES = {signal.SIGKILL: ": the kernel's OOM killer, if no one ran kill -9 (dmesg names its victims)",
                  signal.SIGSEGV: ": a crash in native code (an extension, a driver)"}


class Started:
    """A started process held as `proc` (subprocess.Popen, or a forkserver.ForkedNode): pid, returncode, poll()
    and wait(timeout) (raises subprocess.TimeoutExpired) are its. Base of Node and procs.peers.Peer."""

    proc: subprocess.Popen

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout=timeout)


_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|.?)")  # CSI, OSC, two-byte
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_STATUS = re.compile(r"(?:WARNING: )?[A-Za-z][\w.-]*: \S")  # "who: what", not a warning's path or source line


class Node(Started):
    """A started node: its spec, its process (subprocess.Popen, or a forkserver.ForkedNode), its state
    ("starting", then "ready"/"running" as its starter says, "done"/"failed" on exit, "stopped" when torn down)
    and the descendants seen while it ran. Has the subprocess.Popen methods: pid, poll(), wait(timeout) (raises
    subprocess.TimeoutExpired), send_signal, terminate, kill, returncode."""

    def __init__(self, spec: NodeSpec, proc):
        self.spec, self.proc = spec, proc
        self.state = "starting"
        self.t_start = time.monotonic()
        self.ready_s: float | None = None
        self.descendants: dict[int, psutil.Process] = {}

    @property
    def name(self) -> str:
        return self.spec.name

    def send_signal(self, sig: int) -> None:
        if self.proc.poll() is None:  # not reaped yet, so the pid is still this node's
            self.proc.send_signal(sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def status_line(self, chars: int = 4096, width: int = 100) -> str:
        """The last status line in the end of its log (`chars` characters): a "who: what" line as the nodes write
        them ("engine: waiting for process 7 to finish compiling ..."), terminal escapes and control characters
        removed, cut to `width` characters; "" when there is none (no log, only a library's warning text). For a
        progress line, to say what a starting node is doing."""
        for line in reversed(self.tail(chars).splitlines()):  # "(no log)" is not a status line
            line = _CONTROL.sub("", _ESCAPE.sub("", line)).strip()
            if _STATUS.match(line):
                return line if len(line) <= width else line[:width - 1] + "…"
        return ""

    def tail(self, chars: int = 2000) -> str:
        """The end of its log ("(no log)" when it has none)."""
        try:
            return self.spec.log.read_text(errors="replace")[-chars:]
        except (OSError, AttributeError):
            return "(no log)"

    def exit_report(self) -> tuple[str, str]:
        """(how it ended: "exited with code 2", or "was killed by SIGKILL (...)" for a negative return code, the
        signal that ended it; the end of its log, or that the log is empty), for an error that names the node."""
        code = self.returncode
        how = f"exited with code {code}"
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            how = f"was killed by {name} (exit code {code}{_SIGNAL_CAUSES.get(-code, '')})"
        tail = self.tail()
        if self.spec.log is not None and not tail.strip():
            tail = f"(its log {self.spec.log} is empty: it died before writing a line)"
        return how, tail

    def note_descendants(self) -> None:
        """Remember its living descendants (for teardown: they may leave its process group)."""
        try:
            children = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return
        self.descendants.update((p.pid, p) for p in children)


def _said(tail: str) -> str:
    """How a start-up error quotes a node's log: the command line's own one-line error (`edgeinfer CMD: error:
    ...`, which names the cause and the fix, e.g. a CURVE mismatch) when its log ends with one, else the tail."""
    last = tail.rstrip().rpartition("\n")[2]
    if re.match(r"edgeinfer [\w-]+: error: ", last) and "usage:" not in tail:
        return f": {last}"
    return f":\n{tail}"


def spawn(spec: NodeSpec) -> Node:
    """Start one node (see the module docstring). Raises OSError when it cannot be started, RuntimeError when
    the fork server cannot fork it."""
    if spec.fork:
        from edgeinfer.procs.forkserver import ForkedNode

        return Node(spec, ForkedNode(spec.args, spec.log or Path(os.devnull)))
    env = {**os.environ, PARENT_PID_ENV: str(os.getpid()), **spec.env}
    if spec.log is None:
        proc = subprocess.Popen(spec.argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    else:
        with spec.log.open("w") as out:  # the child holds its own copy of the descriptor
            proc = subprocess.Popen(spec.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env=env)
    return Node(spec, proc)


def run_to_exit(spec: NodeSpec, timeout_s: float) -> int | None:
    """Start one task node and wait for it to exit: its exit code, or None when it ran past timeout_s (then it
    and its descendants are torn down, SIGTERM then SIGKILL)."""
    with NodeGroup(grace_s=5.0) as group:
        node = group.start(spec)
        try:
            return node.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None


class NodeGroup:
    """The nodes one process started. start() them, check_started() while a handshake waits, await_hello() of a
    service, poll()/wait_any() to supervise, finish() the ones told to stop, and close() (always: a context
    manager) tears down whatever is left, descendants included. `say(node, text, style)` hears each SIGTERM and
    SIGKILL of close()."""

    def __init__(self, grace_s: float = 10.0, say: Callable[[Node, str, str], None] | None = None):
        if not grace_s > 0:
            raise ValueError(f"NodeGroup.grace_s must be > 0, got {grace_s}")
        self.grace_s = grace_s
        self.say = say or (lambda node, text, style: None)
        self.nodes: list[Node] = []
        self._lock = threading.Lock()  # a fault drill starts a node from a thread

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def start(self, spec: NodeSpec) -> Node:
        """Start `spec` (spawn) as a member of this group."""
        node = spawn(spec)
        with self._lock:
            self.nodes.append(node)
        return node

    def check_started(self, nodes: list[Node] | None = None) -> None:
        """Raise RuntimeError, with its log's tail, for the first of `nodes` (default: all) that has exited: a
        node must not exit while its starter waits for its handshake."""
        for node in self.nodes if nodes is None else nodes:
            if node.poll() is not None:
                how, tail = node.exit_report()
                raise RuntimeError(f"{node.name} process {how} during start-up{_said(tail)}")

    def await_hello(self, node: Node, timeout_s: float, check: Callable[[], None] | None = None) -> None:
        """Wait until the service `node` publishes a Hello on its spec's ready endpoint (its own start-up
        handshake, after its warm-up; transport.wait_for_hello), calling check() meanwhile. Raises TimeoutError,
        RuntimeError when the node exits first, and whatever check() raises."""
        ctx = zmq.Context.instance()
        endpoints = next((c for c in node.spec.configs if isinstance(c, transport.Endpoints)), None)
        sock = transport.sub(ctx, node.spec.ready_endpoint, curve=endpoints.curve_keys() if endpoints else None)

        def alive():
            if check is not None:
                check()
            if node.poll() is not None:
                how, tail = node.exit_report()
                raise RuntimeError(f"{node.name} process {how} during start-up{_said(tail)}")
        try:
            transport.wait_for_hello([transport.Receiver(sock)], timeout_s, check=alive)
        finally:
            sock.close(linger=0)
        node.ready_s = time.monotonic() - node.t_start

    def poll(self) -> list[Node]:
        """Note every live node's descendants; the nodes that exited since the last poll (their state is then
        "done" or "failed", by exit code)."""
        exited = []
        for node in list(self.nodes):
            if node.state in ("done", "failed", "stopped"):
                continue
            node.note_descendants()
            if (code := node.poll()) is not None:
                node.state = "done" if code == 0 else "failed"
                exited.append(node)
        return exited

    def wait_any(self, timeout_s: float) -> None:
        """Sleep until a live node exits or timeout_s passes."""
        fds = []
        try:
            for node in self.nodes:
                if node.poll() is None:
                    try:
                        fds.append(os.pidfd_open(node.pid))
                    except OSError:  # exited meanwhile (or no pidfd): the timeout wakes us
                        pass
            if fds:
                select.select(fds, [], [], timeout_s)
            else:
                time.sleep(timeout_s)
        finally:
            for fd in fds:
                os.close(fd)

    def finish(self, nodes: list[Node], timeout_s: float = 10.0, poke: Callable[[], None] | None = None,
               term_s: float = 5.0) -> dict[str, int]:
        """Wait up to timeout_s (in all) for `nodes`, told to stop, to exit, calling poke() every 100 ms meanwhile
        (to repeat the stop message to a late subscriber); SIGTERM a straggler, SIGKILL it term_s later. Returns
        name -> exit code."""
        deadline = time.monotonic() + timeout_s
        for node in nodes:
            while node.poll() is None and time.monotonic() < deadline:
                if poke is not None:
                    poke()
                try:
                    node.wait(timeout=0.1)
                except subprocess.TimeoutExpired:
                    pass
            if node.poll() is None:
                node.terminate()
                try:
                    node.wait(timeout=term_s)
                except subprocess.TimeoutExpired:
                    node.kill()
                    node.wait()
        return {node.name: node.returncode for node in nodes}

    def close(self) -> None:
        """SIGTERM every live node's process group (newest first), SIGKILL whatever is left after grace_s; then
        the same for every descendant seen that still runs. Every node's state ends "done", "failed" or
        "stopped"."""
        with self._lock:
            nodes = list(self.nodes)
        live = [n for n in reversed(nodes) if n.poll() is None]
        for node in live:
            node.note_descendants()
            terminate_group(node.pid)
            self.say(node, "SIGTERM", "")
        deadline = time.monotonic() + self.grace_s
        for node in live:
            try:
                node.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                signal_group(node.pid, signal.SIGKILL)
                node.wait()
                self.say(node, f"SIGKILL after {self.grace_s} s", "red")
        kill_tree([p for n in nodes for p in n.descendants.values()], self.grace_s)
        for node in nodes:
            if node.state not in ("done", "failed"):
                node.state = "stopped" if node in live else ("done" if node.returncode == 0 else "failed")


def kill_tree(procs: list[psutil.Process], grace_s: float) -> None:
    """SIGTERM (and SIGCONT) each still-running process of `procs` (which need not be our children), SIGKILL
    those left after grace_s."""
    living = [p for p in procs if _living(p)]
    for p in living:
        for sig in (signal.SIGTERM, signal.SIGCONT):
            try:
                p.send_signal(sig)  # psutil checks the create time first: never a reused pid
            except psutil.Error:
                pass
    deadline = time.monotonic() + grace_s
    while (living := [p for p in living if _living(p)]) and time.monotonic() < deadline:
        time.sleep(0.02)  # not our children: no pidfd wait for a zombie we cannot reap; a short poll
    for p in living:
        try:
            p.kill()
        except psutil.Error:
            pass


def _living(p: psutil.Process) -> bool:
    """Running and not a zombie (a zombie has exited: only its parent's wait is missing)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def terminate_group(pid: int) -> None:
    """SIGTERM the process group led by `pid`, then SIGCONT it: a stopped process handles SIGTERM only once
    continued."""
    signal_group(pid, signal.SIGTERM)
    signal_group(pid, signal.SIGCONT)


def signal_group(pid: int, sig: int) -> None:
    """Send `sig` to the process group led by `pid` (a node or peer leads its own session); a no-op when the group
    is gone."""
    try:
        os.killpg(pid, sig)  # the node leads its own session, so its group id is its pid
    except (ProcessLookupError, PermissionError):
        pass

