"""A node's log lines leave through a bounded queue and a writer thread: the tick never writes to a file descriptor.

A print() in a control tick blocks for as long as the node's stdout takes to drain: a slow disk, a terminal
at 10 KB/s, a pipe nobody reads (forever). So every node (runtime, control loop, fleet node) hands its lines to
`emit(text)`, which only cuts the line to max_chars (a marker says how much was cut: an unknown schema name
quoted whole can be 64 KB) and appends it to a queue of at most max_lines lines; one that finds the queue full
is dropped and counted (`dropped`, the counter "log_dropped" of the node's Stats), and the next line written
says how many went. A daemon thread, at normal priority whatever the node's, writes the queue to stdout with
os.write (no Python buffer lock held while it blocks, so neither interpreter exit nor another thread's print
waits on it). `flush(timeout_s)` at the end of a run waits a bounded time for the queue to empty.
"""
from __future__ import annotations

import atexit
import os
import threading
from collections import deque
from typing import Callable

from edgeinfer.core.clock import leave_realtime

MAX_LINE_CHARS = 300  # a line longer than this is cut, with a marker, to this length
QUEUE_LINES = 256  # lines waiting for the writer thread at most (~75 KB): more are dropped, counted
FLUSH_TIMEOUT_S = 1.0  # how long flush() (and interpreter exit) waits for the queue to empty


def cut(text: str, max_chars: int = MAX_LINE_CHARS) -> str:
    """`text` on one line of at most max_chars characters (>= 40): newlines become spaces, and a longer text
    keeps its head with a marker " ...[N chars cut]" at the end. Raises ValueError for max_chars < 40."""
    if max_chars < 40:
        raise ValueError(f"cut: max_chars must be >= 40, got {max_chars}")
    text = text.replace("\n", " ")
    if len(text) <= max_chars:
        return text
    marker = f" ...[{len(text)} chars, cut]"
    return text[:max_chars - len(marker)] + marker


def _write_fd(fd: int, data: bytes) -> None:
    while data:  # a pipe takes a large write in parts
        data = data[os.write(fd, data):]


class LogWriter:
    """Lines to `write` (stdout's file descriptor by default) from a thread, through a queue of max_lines lines.

    Counters: `accepted` (lines queued), `written`, `dropped` (the queue was full), `cut` (lines cut to
    max_chars), `failed` (lines lost to a write error: a closed stdout). `pending` = accepted - written - failed.
    put() never blocks beyond a lock held for a deque append; the thread starts on the first put()."""

    def __init__(self, write: Callable[[str], None] | None = None, max_lines: int = QUEUE_LINES,
                 max_chars: int = MAX_LINE_CHARS):
        if max_lines < 1:
            raise ValueError(f"LogWriter: max_lines must be >= 1, got {max_lines}")
        cut("", max_chars)  # checks max_chars
        self.write = write or (lambda line: _write_fd(1, (line + "\n").encode(errors="replace")))
        self.max_lines, self.max_chars = max_lines, max_chars
        self.accepted = self.written = self.dropped = self.cut = self.failed = 0
        self._queue: deque[str] = deque()
        self._ready = threading.Condition()
        self._dropped_told = 0  # drops already reported in a written line
        self._thread: threading.Thread | None = None

    @property
    def pending(self) -> int:
        return self.accepted - self.written - self.failed

    def put(self, text: str) -> bool:
        """Queue one line (cut to max_chars); False, counted in `dropped`, when max_lines are already waiting."""
        line = cut(text, self.max_chars)
        with self._ready:
            if len(self._queue) >= self.max_lines:
                self.dropped += 1
                return False
            self.cut += len(line) != len(text)
            self.accepted += 1
            self._queue.append(line)
            self._ready.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
                self._thread.start()
        return True

    def _run(self) -> None:
        leave_realtime()  # this thread only (Linux: per thread): a blocked write must not compete with the tick
        while True:
            with self._ready:
                while not self._queue:
                    self._ready.wait()
                line = self._queue[0]  # left queued until written: flush() waits for it
                dropped = self.dropped - self._dropped_told
                self._dropped_told = self.dropped
            try:
                self.write(line + (f" ({dropped} log lines dropped before this one: stdout was slow)"
                                   if dropped else ""))
                ok = True
            except (OSError, ValueError):  # stdout closed: nothing to tell it, count the loss
                ok = False
            with self._ready:
                self._queue.popleft()
                self.written += ok
                self.failed += not ok
                self._ready.notify_all()

    def flush(self, timeout_s: float = FLUSH_TIMEOUT_S) -> bool:
        """Wait up to timeout_s for every queued line to be written; True when they were."""
        with self._ready:
            return self._ready.wait_for(lambda: not self._queue, timeout_s)


_process_writer: LogWriter | None = None
_lock = threading.Lock()


def process_writer() -> LogWriter:
    """The writer of this process's stdout, made on first use (one per process: one stdout); interpreter exit
    waits at most FLUSH_TIMEOUT_S for its queue."""
    global _process_writer
    with _lock:
        if _process_writer is None:
            _process_writer = LogWriter()
            atexit.register(_process_writer.flush)
        return _process_writer


def flush_process_writer(timeout_s: float = FLUSH_TIMEOUT_S) -> bool:
    """Wait up to timeout_s for this process's queued log lines to be written (True when they were, or when no
    line was ever queued): what interpreter exit does, for a process that ends with os._exit."""
    writer = _process_writer
    return writer is None or writer.flush(timeout_s)


def print_last(text: str) -> None:
    """A node's closing summary on stdout, whole (emit cuts long lines) and after every line queued before it (the
    queue is flushed first, for at most its flush timeout)."""
    flush_process_writer()
    print(text, flush=True)


def _forget_after_fork() -> None:
    global _process_writer  # a forked child (procs/forkserver.py) has none of its parent's threads
    _process_writer = None


os.register_at_fork(after_in_child=_forget_after_fork)


def emit(text: str) -> bool:
    """A node's log line, off the caller's thread (see the module docstring); False when dropped."""
    return process_writer().put(text)
