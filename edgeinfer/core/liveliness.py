"""Peer liveliness: heartbeats with a lease (the ROS 2 / DDS LIVELINESS QoS, automatic kind) plus the
connection itself (a ZMQ socket monitor), so a dead peer is noticed from whichever comes first:

- its process dies: the kernel closes its sockets, the TCP connection drops, and the monitor reports
  EVENT_DISCONNECTED within microseconds on one host;
- it hangs, or the network path dies without a FIN: no heartbeat for `lease_ns`.

A peer becomes alive again only on a Heartbeat received after the loss: a Heartbeat on a SUB proves the
subscription reached the (possibly new) publisher, so nothing after it is lost to the slow joiner. That is
the re-handshake after a reconnect; `instance` (the sender's pid) tells a restart from a blip, and a loss
after which the same instance beats again was a late peer, not a dead one (`returned`).

The lease can follow the measured link: LEASE_GAP_FACTOR x the longest gap between the peer's Heartbeats
(as taken in) among the last GAP_WINDOW, never shorter than the lease the peer announces (its promise) and
never longer than the caller's ceiling (how long it may go without knowing).
"""
from __future__ import annotations

import os
import threading
from collections import deque
from typing import Callable

import zmq

from edgeinfer.core import transport
from edgeinfer.core.clock import now_ns
from edgeinfer.core.wire import Heartbeat, Start

LEASE_GAP_FACTOR = 1.5  # a derived lease: this many times the longest recent heartbeat gap
GAP_WINDOW = 1024  # heartbeat gaps the longest is taken over (2 s of 2 ms beats)


class GapWindow:
    """The longest of the last `n` gaps (ns) added: a sliding-window maximum over a monotonic deque
    (O(1) amortised per gap). 0 before the first."""

    def __init__(self, n: int = GAP_WINDOW):
        self.n, self.added = n, 0
        self._q: deque[tuple[int, int]] = deque()  # (index, gap), gaps strictly decreasing

    def add(self, gap_ns: int) -> None:
        while self._q and self._q[-1][1] <= gap_ns:
            self._q.pop()
        self._q.append((self.added, gap_ns))
        self.added += 1
        if self._q[0][0] <= self.added - 1 - self.n:
            self._q.popleft()

    def max(self) -> int:
        return self._q[0][1] if self._q else 0

    def clear(self) -> None:
        self._q.clear()


class Lease:
    """Liveliness of one named peer, fed with its Heartbeats and its connection events (times: monotonic ns, as
    the caller took the message in).

    lease_ns: how long the peer may go unheard. Without ceiling_ns, the lease the peer announces
    (Heartbeat.lease_ns; `default_lease_ns` until it does). With ceiling_ns, derived from the measured link:
    LEASE_GAP_FACTOR x the longest of the last GAP_WINDOW gaps between its Heartbeats of one instance (a gap
    across a dropped connection or a restart is not the link's), clamped to [announced, ceiling_ns]; the
    announced lease wins over a smaller ceiling (the peer cannot beat faster than it does).

    Counters: `joined` (times it became alive), `lost` (times it was declared dead: lease expiry or a
    dropped connection), `restarts` (a Heartbeat from a new instance), `expired` (losses by lease expiry),
    `returned` (losses after which the same instance beat again: it was late, not dead), `implausible` (Heartbeats
    announcing a lease <= 0, which would expire at once: corrupt, not taken in). `joined_as`: how it
    last became alive ("alive": the first time, "back": returned, "restarted": a new instance).
    """

    def __init__(self, peer: str, default_lease_ns: int, ceiling_ns: int | None = None):
        self.peer = peer
        self.announced_ns = self.lease_ns = default_lease_ns
        self.ceiling_ns = ceiling_ns
        self.gaps = GapWindow()
        self.alive = False
        self.instance = -1
        self.last_ns = 0
        self._gap_from: int | None = None  # the last Heartbeat's time, while gaps from it are the link's
        self.lost_at_ns: int | None = None  # when it was last declared dead (None: never)
        self.joined = self.lost = self.restarts = self.expired = self.returned = self.implausible = 0
        self.joined_as = ""

    def beat(self, hb: Heartbeat, t_ns: int) -> int | None:
        """Take one Heartbeat in at t_ns. Returns the gap (ns) since the previous one of the same instance, None
        when there is none (first, after a restart or a dropped connection, another peer's, or an implausible one)."""
        if hb.sender != self.peer:
            return None
        if hb.lease_ns <= 0:
            self.implausible += 1
            return None
        gap = t_ns - self._gap_from if self._gap_from is not None else None
        joined_as = "alive"
        if self.instance != -1 and hb.instance != self.instance:
            self.restarts += 1
            self.gaps.clear()
            gap, joined_as = None, "restarted"
        elif not self.alive and self.lost_at_ns is not None:
            self.returned += 1
            joined_as = "back"
        if gap is not None:
            self.gaps.add(gap)
        self.instance, self.last_ns, self._gap_from, self.announced_ns = hb.instance, t_ns, t_ns, hb.lease_ns
        self.lease_ns = self._derive()
        if not self.alive:
            self.alive, self.joined_as = True, joined_as
            self.joined += 1
        return gap

    def _derive(self) -> int:
        if self.ceiling_ns is None:
            return self.announced_ns
        return max(self.announced_ns, min(self.ceiling_ns, int(LEASE_GAP_FACTOR * self.gaps.max())))

    def drop(self, t_ns: int) -> None:
        """The peer's connection went down (or the caller knows it is gone)."""
        self._gap_from = None
        self._lose(t_ns)

    def _lose(self, t_ns: int) -> None:
        if self.alive:
            self.alive = False
            self.lost += 1
            self.lost_at_ns = t_ns

    def check(self, t_ns: int) -> bool:
        """Whether the peer is alive at t_ns (expires the lease when due)."""
        if self.alive and t_ns - self.last_ns > self.lease_ns:
            self.expired += 1
            self._lose(t_ns)
        return self.alive


class LinkMonitor:
    """Connection events of one socket (connect side), read without blocking; with `endpoint`, it also heals the
    link libzmq gives up on.

    `poll()` returns (connected, disconnected) counts since the last call. Uses zmq_socket_monitor on an
    inproc PAIR in the socket's context; costs one non-blocking recv per call when nothing happened.

    libzmq reconnects a connecting socket whose peer went away, but not one it disconnected itself for a protocol
    error: a frame over ZMQ_MAXMSGSIZE (transport.MAX_MESSAGE_BYTES) from a peer cuts that link for good. With
    `endpoint` (the one the socket connected to), every disconnect is answered by disconnect + connect, which
    brings such a link back at once (and a peer's restart is reconnected as libzmq would); `relinks` counts them.
    """

    def __init__(self, sock: zmq.Socket, endpoint: str | None = None):
        self.sock, self.endpoint = sock, endpoint
        # a socket made by core.transport has its monitor from birth (the handshake checks read it too): shared
        self.events = transport.socket_events(sock)
        self._own = self.events is None
        if self._own:
            self.events = transport.SocketEvents(sock, curve=False)
        self.disconnects = 0
        self.relinks = 0

    def poll(self) -> tuple[int, int]:
        up, down = self.events.take()
        self.disconnects += down
        if down and self.endpoint is not None:
            self._relink()
        return up, down

    def _relink(self) -> None:
        try:
            self.sock.disconnect(self.endpoint)
        except zmq.ZMQError:  # libzmq has dropped the endpoint already (a protocol error): nothing to undo
            pass
        self.sock.connect(self.endpoint)
        self.relinks += 1

    def close(self) -> None:
        if self._own:  # a transport socket's monitor closes with it
            self.events.close()


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
