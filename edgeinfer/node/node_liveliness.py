"""The runtime node's liveliness beside its loop (edgeinfer.core.liveliness): its own Heartbeat, the control
loop's lease, and its parent process.

- A Beacon thread publishes the runtime's Heartbeat every runtime_heartbeat_ms (and the Stats when due) on the
  chunk PUB, so a node busy decoding still beats; the Heartbeat names the control loop it hears.
- The control loop's Heartbeats on the status SUB feed its Lease (poll() once per loop iteration); every loss
  of it is an ErrorEvent ("control_lost") and a log line, its return a log line (both throttled in the log).
- ParentWatch: the handshake gives up, and the loop ends, when the process that started this one is gone.
- The idle exit (`gone()`) follows the control loop, not the observations: the runtime serves while the control
  loop beats, however long the source pauses (a log with a gap, a robot that waits). It ends when the control loop
  has been unheard for idle_timeout_s; before its first Heartbeat (or with no status endpoint), when the source has
  been silent that long.
"""
from __future__ import annotations

import sys

from edgeinfer.core.lifecycle import ParentWatch
from edgeinfer.core.liveliness import Beacon, Lease
from edgeinfer.core.wire import Heartbeat, Start
from edgeinfer.node.node_telemetry import NodeTelemetry


class RuntimeLiveliness:
    """Lifecycle: start() -> poll() per loop iteration -> stop(). out: the chunk PUB (a transport.LockedSender).
    status_rx: the control loop's status SUB (None: no status endpoint, the control loop stays unheard). parent:
    the watch made when the process started (its parent may die while the policy loads)."""

    def __init__(self, out, heartbeat_ms: float, lease_ms: float, status_rx, telemetry: NodeTelemetry,
                 parent: ParentWatch):
        self.parent, self.telemetry = parent, telemetry
        self.status_rx = status_rx
        self.control = Lease("control", int(lease_ms * 1e6))
        self.beacon = Beacon(out, "runtime", heartbeat_ms, lease_ms, self.control, telemetry.telemetry,
                             telemetry.refresh)
        self._heartbeat_ms = heartbeat_ms

    def start(self) -> None:
        # the beacon thread must get the GIL within a fraction of the lease while the main thread decodes
        # (CPython's default switch interval is 5 ms)
        sys.setswitchinterval(min(sys.getswitchinterval(), self._heartbeat_ms / 2000))
        self.beacon.start()

    def schedule(self, start: Start) -> None:
        """Repeat the run's schedule in every Heartbeat from now on (a restarted peer learns it from there)."""
        self.beacon.schedule = start

    def poll(self, t_ns: int) -> None:
        """Take the control loop's pending Heartbeats, and expire its lease when due."""
        if self.status_rx is None:
            return
        control = self.control
        for msg in self.status_rx.drain():
            if isinstance(msg, Heartbeat) and msg.sender == "control":
                joined = control.joined
                control.beat(msg, t_ns)
                if control.joined != joined:
                    self.telemetry.log.line(f"control_{control.joined_as}",
                                            f"control loop {msg.instance} {control.joined_as}")
        if control.alive and not control.check(t_ns):
            self.telemetry.report("control_lost", f"control loop {control.instance} lost: no heartbeat for "
                                  f"{(t_ns - control.last_ns) / 1e6:.1f} ms (lease {control.lease_ns / 1e6:.1f} ms "
                                  "expired)", every=True)

    def gone(self, t_ns: int, source_heard_ns: int, idle_ns: int) -> str | None:
        """Why the run is over at t_ns, or None: the parent process exited, or the peer the idle exit follows (the
        control loop once it has beaten, else the observation source, last heard at source_heard_ns) has been
        unheard for more than idle_ns."""
        if self.parent.parent_gone():
            return f"parent process {self.parent.ppid} exited"
        control = self.control
        if control.joined:
            if t_ns - control.last_ns > idle_ns:
                return f"no Heartbeat from the control loop for {(t_ns - control.last_ns) / 1e9:.1f} s"
        elif t_ns - source_heard_ns > idle_ns:
            return f"no message for {(t_ns - source_heard_ns) / 1e9:.1f} s (no control loop heard)"
        return None

    def stop(self) -> None:
        """Stop beating (before the socket the beacon shares closes). Idempotent."""
        self.beacon.stop()
