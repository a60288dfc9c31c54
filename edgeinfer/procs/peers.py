"""Helper processes that are not edgeinfer nodes: `python -m MODULE ARGS`, started the way procs/nodes.py
starts a node, for a run's or a bench's measuring peers (the hil round-trip prober, sim/roundtrip.py; the
transport bench's raw echo peers, bench/echo_peers.py).

A peer runs in a session of its own (Ctrl-C on the terminal reaches only its starter, which stops it), with
EDGEINFER_PARENT_PID naming this process (core.lifecycle.ParentWatch: a peer that watches it exits when its
starter is gone), its stdin a pipe or /dev/null, its stdout a pipe (text: its one-line handshake with the
starter, as `ready` or a port number) and its stderr in `log` (None: this process's stderr, so that a peer's
traceback is seen). Teardown (Peer.finish, Peer.close, always: a context manager): wait for a peer told to stop,
then SIGTERM (and SIGCONT) to its process group, SIGKILL after term_s; then its pipes are closed.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from edgeinfer.core.lifecycle import PARENT_PID_ENV
from edgeinfer.procs.nodes import Started, signal_group, terminate_group


class Peer(Started):
    """A started helper process: `proc` (subprocess.Popen, text pipes), its `name` (for errors), stdin (a pipe
    when asked for, else None) and stdout (a pipe). Has pid, poll(), wait(timeout) (raises
    subprocess.TimeoutExpired), returncode."""

    def __init__(self, name: str, proc: subprocess.Popen):
        self.name, self.proc = name, proc

    @property
    def stdin(self):
        return self.proc.stdin

    @property
    def stdout(self):
        return self.proc.stdout

    def finish(self, timeout_s: float = 0.0, term_s: float = 2.0) -> int:
        """Wait up to timeout_s for it to exit (told to stop), then SIGTERM (and SIGCONT) its process group and
        SIGKILL the group term_s later; close its pipes. Returns its exit code (negative: the signal). A no-op,
        but for the pipes, once it has exited."""
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            terminate_group(self.pid)
            try:
                self.proc.wait(timeout=term_s)
            except subprocess.TimeoutExpired:
                signal_group(self.pid, signal.SIGKILL)
                self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except BrokenPipeError:  # stdin's unflushed text, to a peer that is gone
                    pass
        return self.proc.returncode

    def close(self) -> None:
        """Tear it down now (finish with no wait)."""
        self.finish(0.0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def spawn_peer(module: str, args: list[str], name: str | None = None, stdin: bool = False,
               log: Path | None = None, env: dict[str, str] | None = None) -> Peer:
    """Start `python -m module *args` as a Peer (see the module docstring). stdin: a pipe to it (else
    /dev/null). log: its stderr (None: ours). env: added to its environment. Raises OSError when it cannot be
    started."""
    argv = [sys.executable, "-m", module, *args]
    env = {**os.environ, PARENT_PID_ENV: str(os.getpid()), **(env or {})}
    err = Path(log).open("w") if log is not None else None
    try:  # the child holds its own copy of the log's descriptor
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True, env=env)
    finally:
        if err is not None:
            err.close()
    return Peer(name or module, proc)
