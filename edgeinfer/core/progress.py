"""Progress of long work, for a person at a terminal and for a log file alike: what a command is doing and how
far along it is.

    with Progress("training target", total=3000, console=console) as bar:
        for step in range(3000):
            ...
            bar.advance()

At a terminal (console.is_terminal) a rich progress bar, redrawn from the caller's thread when it advances (no
refresh thread); otherwise (output piped to a log) plain lines, flushed, at most one every `every_s` seconds and
at each new phase (a new label), then one line when the work ends. Only the main thread of a command reports:
never the control loop's tick or the replayer's send loop, whose timing a write to a full pipe would upset.

say() prints one line of status (escaped: a hint such as pip install 'edgeinfer[logs]' keeps its brackets).
"""
from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape

PLAIN_EVERY_S = 10.0  # plain lines in a log: one per 10 s at most (and one per phase)
PLAIN_MIN_S = 1.0  # phases that change faster than this share a line
REDRAW_S = 0.1  # a terminal bar redraws at most this often


def say(console: Console | None, text: str, style: str | None = None) -> None:
    """One line of status on `console` (a new rich Console on stdout when None), markup in `text` escaped, flushed
    at once (a pipe buffers until then)."""
    console = console or Console()
    body = escape(text)
    console.print(f"[{style}]{body}[/{style}]" if style else body, highlight=False, soft_wrap=True)
    console.file.flush()


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


class Progress:
    """How far along `total` steps of work (None: unknown) a command is; a context manager. advance(n, label) and
    update(completed, label) move it; label names the phase (a new one gets a plain line at once), detail is shown
    after it (a figure that changes every step, such as a loss: no new line)."""

    def __init__(self, label: str, total: int | None = None, console: Console | None = None,
                 every_s: float = PLAIN_EVERY_S, clock=time.monotonic):
        self.label, self.total, self.completed = label, total, 0
        self.console = console or Console()
        self.every_s, self.clock = every_s, clock
        self.terminal = self.console.is_terminal
        self._bar = self._task = None
        self._t0 = self._last_line = self._last_draw = 0.0
        self._printed_label: str | None = None
        self.detail = ""

    def __enter__(self) -> Progress:
        self._t0 = self.clock()
        if self.terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as Bar

            columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
            self._bar = Bar(*columns, *([TimeRemainingColumn()] if self.total else []), console=self.console,
                            auto_refresh=False, transient=True)
            self._bar.start()
            self._task = self._bar.add_task(escape(self._shown()), total=self.total)
            self._draw(force=True)
        else:
            self._line(force=True)
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()
        elapsed = _duration(self.clock() - self._t0)
        of = f", {self.completed}/{self.total}" if self.total else f", {self.completed}" if self.completed else ""
        how = "interrupted" if exc_type is KeyboardInterrupt else "stopped by an error" if exc_type else "done"
        if not self.terminal or exc_type is None:
            say(self.console, f"{self.label}: {how}{of} in {elapsed}")

    def advance(self, n: int = 1, label: str | None = None, detail: str | None = None) -> None:
        self.update(self.completed + n, label, detail)

    def update(self, completed: int | None = None, label: str | None = None, detail: str | None = None) -> None:
        if completed is not None:
            self.completed = completed
        if label is not None:
            self.label = label
        if detail is not None:
            self.detail = detail
        if self.terminal:
            self._draw()
        else:
            self._line()

    def _shown(self) -> str:
        return f"{self.label} ({self.detail})" if self.detail else self.label

    def _draw(self, force: bool = False) -> None:
        now = self.clock()
        if self._bar is None or (not force and now - self._last_draw < REDRAW_S and self.completed != self.total):
            return
        self._bar.update(self._task, completed=self.completed, description=escape(self._shown()))
        self._bar.refresh()
        self._last_draw = now

    def _line(self, force: bool = False) -> None:
        now = self.clock()
        since = now - self._last_line
        new_phase = self.label != self._printed_label
        if not (force or since >= self.every_s or (new_phase and since >= PLAIN_MIN_S)):
            return
        elapsed = now - self._t0
        if self.total:
            left = ""
            if 0 < self.completed < self.total and elapsed > 0:
                left = f", about {_duration(elapsed / self.completed * (self.total - self.completed))} left"
            text = (f"{self._shown()}: {self.completed}/{self.total} ({100 * self.completed / self.total:.0f} %), "
                    f"{_duration(elapsed)} elapsed{left}")
        else:
            done = f", {self.completed} done" if self.completed else ""
            text = f"{self._shown()}: {_duration(elapsed)} elapsed{done}"
        say(self.console, text)
        self._last_line, self._printed_label = now, self.label
