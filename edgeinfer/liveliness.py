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

import zmq
from zmq.utils.monitor import recv_monitor_message

from edgeinfer.wire import Heartbeat


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
