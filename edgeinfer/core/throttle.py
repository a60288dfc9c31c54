"""Per-kind rate limits that count what they hold back: the log lines and ErrorEvents of every node.

A flood of one kind (an overrun warning at 500 Hz, a lease that expires on every link stall) must neither
bury the rest of a node's log or status channel nor hide how many there were. Each kind passes at most once
per interval, and what passes next says how many were held back meanwhile: rclcpp's
RCLCPP_WARN_THROTTLE, plus the count it lacks. Times are monotonic ns, given by the caller (testable on an
injected clock).
"""
from __future__ import annotations

from typing import Callable

from edgeinfer.core.clock import now_ns
from edgeinfer.core.logwriter import emit

LOG_INTERVAL_MS = 1000.0  # a node prints at most one line of a kind per second


class Throttle:
    """At most one pass per `interval_ns` for each kind. `suppressed`: everything held back, all kinds."""

    def __init__(self, interval_ns: int):
        if interval_ns < 0:
            raise ValueError(f"Throttle: interval_ns must be >= 0, got {interval_ns}")
        self.interval_ns = interval_ns
        self.suppressed = 0
        self._last_ns: dict[str, int] = {}
        self._held: dict[str, int] = {}  # per kind, held back since it last passed

    def admit(self, kind: str, t_ns: int) -> int | None:
        """None when `kind` passed less than interval_ns before t_ns (held back and counted); else how many of
        it were held back since it last passed (0: none)."""
        last = self._last_ns.get(kind)
        if last is not None and t_ns - last < self.interval_ns:
            self._held[kind] = self._held.get(kind, 0) + 1
            self.suppressed += 1
            return None
        self._last_ns[kind] = t_ns
        return self._held.pop(kind, 0)

    def flush(self) -> dict[str, int]:
        """Kind -> held back since it last passed, for the kinds that have some; forgets them (as if passed)."""
        held, self._held = self._held, {}
        return held


class NodeLog:
    """A node's log lines, throttled per kind: `line(kind, text)` writes "<node>: <text>" unless a line of the
    same kind went out less than interval_ms ago; the next one that goes out ends with how many were
    suppressed meanwhile, and `close()` writes what is still held back. `suppressed` (all kinds) is a counter
    for the node's Stats. write: the sink (default: edgeinfer.core.logwriter.emit, which queues the line for a
    writer thread and never blocks the caller); clock: monotonic ns."""

    def __init__(self, node: str, interval_ms: float = LOG_INTERVAL_MS, clock: Callable[[], int] = now_ns,
                 write: Callable[[str], bool | None] = emit):
        self.node, self.clock, self.write = node, clock, write
        self.throttle = Throttle(int(interval_ms * 1e6))

    @property
    def suppressed(self) -> int:
        return self.throttle.suppressed

    def line(self, kind: str, text: str) -> bool:
        """Write one line of `kind` unless throttled. True when it was written."""
        held = self.throttle.admit(kind, self.clock())
        if held is None:
            return False
        self.write(f"{self.node}: {text}" + (f" ({held} more like this suppressed)" if held else ""))
        return True

    def close(self) -> None:
        """Write the count of every kind still held back (at the end of a run)."""
        for kind, held in sorted(self.throttle.flush().items()):
            self.write(f"{self.node}: {held} more {kind} lines suppressed")
