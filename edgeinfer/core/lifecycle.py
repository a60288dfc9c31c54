"""Process lifecycle helpers for the nodes a replay (or a launch) starts."""
from __future__ import annotations

import os
import signal
import sys
from typing import NoReturn

from edgeinfer.core.logwriter import flush_process_writer

PARENT_PID_ENV = "EDGEINFER_PARENT_PID"  # set by whoever starts a node and wants it to die with it


class ParentWatch:
    """Notices when the process that started this one has died.

    A node started by a replayer that was SIGKILLed would otherwise wait out its start-up timeout or tick
    to the end of the log on its own. The starter names itself in EDGEINFER_PARENT_PID (it may be gone
    before this process gets to look at its parent); without it the parent at construction is watched, so
    a node started from a shell or by systemd keeps running as long as that parent does.
    """

    def __init__(self):
        self.ppid = int(os.environ.get(PARENT_PID_ENV, os.getppid()))

    def parent_gone(self) -> bool:
        return os.getppid() != self.ppid

    def check(self) -> None:
        """Raise RuntimeError when the parent is gone (for handshake `check` hooks)."""
        if self.parent_gone():
            raise RuntimeError(f"parent process {self.ppid} exited")


def exit_now(code: int) -> NoReturn:
    """End this process with exit status `code` once its queued log lines (core.logwriter, at most its flush
    timeout) and stdout and stderr are written, skipping the interpreter's teardown: atexit handlers, finalizers
    and the unloading of torch and numba, 0.6-0.7 s on a 2-core VM. For a node whose main has returned (its sockets
    closed, its files written in `with` blocks): a replay, launch or restart waits for it to exit."""
    flush_process_writer()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed, or replaced by None
            pass
    os._exit(code)


def raise_interrupt(signum, frame):
    """A signal handler: the signal as Ctrl-C (KeyboardInterrupt), so that the starter's cleanup runs."""
    raise KeyboardInterrupt(f"signal {signum}")


class InterruptSignals:
    """SIGINT and SIGTERM raise KeyboardInterrupt from construction on (a run stops early, its report and
    teardown still come); ignore() them for the teardown, so that a second Ctrl-C cannot cut it short; restore()
    the handlers there were before."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)):
        self.previous = {s: signal.signal(s, raise_interrupt) for s in signals}

    def ignore(self) -> None:
        for s in self.previous:
            signal.signal(s, signal.SIG_IGN)

    def restore(self) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)
