"""A node's telemetry beside its loop: counters and histograms (edgeinfer.core.telemetry.Telemetry), rate-limited
ErrorEvents, its Stats, published on the node's own PUB (a transport.LockedSender shared with its beacon), and its
log lines, throttled per kind (edgeinfer.core.throttle.NodeLog: `log.line(kind, text)`)."""
from __future__ import annotations

from typing import Callable

from edgeinfer.core.telemetry import Telemetry
from edgeinfer.core.wire import WireError


class NodeTelemetry:
    """sender: the node's name. counters(): the counters the node keeps elsewhere (its receivers', its runtime's),
    read into each Stats just before it goes out (from the beacon thread, too). Lifecycle: publish_final() once,
    at the end of the run."""

    def __init__(self, sender: str, stats_ms: float, out, counters: Callable[[], dict[str, int]]):
        self.telemetry = Telemetry(sender, stats_ms, publish=out.send)
        self.out, self._counters = out, counters
        self.count, self.observe_ns = self.telemetry.count, self.telemetry.observe_ns  # the loop's two verbs
        self.report, self.log = self.telemetry.report, self.telemetry.log  # errors (ErrorEvents), log lines

    def wire_error(self, e: WireError) -> None:
        self.report(e.kind, str(e))

    def refresh(self) -> None:
        """The node's counters into the next Stats snapshot."""
        self.telemetry.counters.update(self._counters())

    def publish_final(self) -> None:
        """The final Stats, for the replayer's report (after the beacon stopped: it shares the socket)."""
        self.refresh()
        self.out.send(self.telemetry.snapshot())
        self.log.close()

    def summary(self) -> str:
        t = self.telemetry
        return f"counters {dict(sorted(t.counters.items()))} (last error: {t.last_error or '-'})"
