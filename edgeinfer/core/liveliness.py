"""Peer liveliness: heartbeats with a lease (the ROS 2 / DDS LIVELINESS QoS, automatic kind) plus the
connection itself (a ZMQ socket monitor), so a dead peer is noticed from whichever comes first:

- its process dies: the kernel closes its sockets, the TCP connection drops, and the monitor reports
  EVENT_DISCONNECTED within microseconds on one host;
- it hangs, or the network path dies without a FIN: no heartbeat for `lease_ns`.

A peer becomes alive again only on a Heartbeat received after the loss: a Heartbeat on a SUB proves the
subscription reached the (possibly new) publisher, so nothing after it is lost to the slow joiner. That is
the re-handshake after a reconnect; `instance` (the sender's pid) tells a restart from a blip.
"""
from __future__ import annotations

import os
import threading
from typing import Callable

import zmq
from zmq.utils.monitor import recv_monitor_message

from edgeinfer.core.clock import now_ns
from edgeinfer.core.wire import Heartbeat, Start


class Lease:
    """Liveliness of one named peer, fed with its Heartbeats and its connection events.

    Counters: `joined` (times it became alive), `lost` (times it was declared dead: lease expiry or a
    dropped connection), `restarts` (a Heartbeat from a new instance), `expired` (losses by lease expiry).
    """

    def __init__(self, peer: str, default_lease_ns: int):
        self.peer = peer
        self.lease_ns = default_lease_ns  # replaced by the lease the peer announces
        self.alive = False
        self.instance = -1
        self.last_ns = 0
        self.lost_at_ns: int | None = None  # when it was last declared dead (None: never)
        self.joined = self.lost = self.restarts = self.expired = 0

    def beat(self, hb: Heartbeat, t_ns: int) -> None:
        if hb.sender != self.peer:
            return
        if self.instance != -1 and hb.instance != self.instance:
            self.restarts += 1
        self.instance, self.last_ns, self.lease_ns = hb.instance, t_ns, hb.lease_ns
        if not self.alive:
            self.alive = True
            self.joined += 1

    def drop(self, t_ns: int) -> None:
        """The peer's connection went down (or the caller knows it is gone)."""
        if self.alive:
            self.alive = False
            self.lost += 1
            self.lost_at_ns = t_ns

    def check(self, t_ns: int) -> bool:
        """Whether the peer is alive at t_ns (expires the lease when due)."""
        if self.alive and t_ns - self.last_ns > self.lease_ns:
            self.expired += 1
            self.drop(t_ns)
        return self.alive


class LinkMonitor:
    """Connection events of one socket (connect side), read without blocking.

    `poll()` returns (connected, disconnected) counts since the last call. Uses zmq_socket_monitor on an
    inproc PAIR in the socket's context; costs one non-blocking recv per call when nothing happened.
    """

    EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED

    def __init__(self, sock: zmq.Socket):
        self.sock = sock
        self.mon = sock.get_monitor_socket(self.EVENTS)
        self.disconnects = 0

    def poll(self) -> tuple[int, int]:
        up = down = 0
        while True:
            try:
                event = recv_monitor_message(self.mon, flags=zmq.NOBLOCK)
            except zmq.Again:
                return up, down
            if event["event"] == zmq.EVENT_DISCONNECTED:
                down += 1
                self.disconnects += 1
            elif event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                up += 1

    def close(self) -> None:
        self.sock.disable_monitor()
        self.mon.close(linger=0)


class Beacon(threading.Thread):
    """Publishes `sender`'s Heartbeat every heartbeat_ms (absolute deadlines) and the Telemetry's Stats when due,
    on `out` (a transport.LockedSender shared with the node's main thread), from a daemon thread, so a node
    busy decoding still beats. `schedule` (the run's Start) is repeated in each Heartbeat once set; `peer` is
    the Lease of the peer whose instance the Heartbeat acknowledges. `refresh()` runs before each Stats."""

    def __init__(self, out, sender: str, heartbeat_ms: float, lease_ms: float, peer: Lease | None, telemetry,
                 refresh: Callable[[], None] | None = None):
        super().__init__(name=f"{sender}-beacon", daemon=True)
        self.out, self.sender, self.peer, self.telemetry, self.refresh = out, sender, peer, telemetry, refresh
        self.period_ns, self.lease_ns = int(heartbeat_ms * 1e6), int(lease_ms * 1e6)
        self.schedule: Start | None = None
        self.seq = 0
        self._stop_event = threading.Event()

    def heartbeat(self) -> Heartbeat:
        run, peer = self.schedule, self.peer
        t0, period, n = (run.t0_ns, run.period_ns, run.n_ticks) if run is not None else (-1, -1, -1)
        self.seq += 1
        return Heartbeat(self.sender, os.getpid(), self.seq, now_ns(), self.lease_ns,
                         peer.instance if peer is not None and peer.alive else -1, t0, period, n)

    def run(self) -> None:
        next_ns = now_ns()
        while not self._stop_event.is_set():
            self.out.send(self.heartbeat())
            if self.telemetry is not None and self.telemetry.stats_due(now_ns()):
                if self.refresh is not None:
                    self.refresh()
                self.out.send(self.telemetry.snapshot())
            next_ns += self.period_ns
            self._stop_event.wait(max(0, next_ns - now_ns()) / 1e9)

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=1.0)
