"""Waiting for messages in tests by what arrives, never by a sleep: a stalled host delays delivery, and a sleep long
enough for every machine is a bar on time all the same.

- `heard`: past the PUB/SUB slow joiner before a test sends what it counts.
- `received`: the messages a test expects, however late they come (a generous deadline, then its count fails).
- `inproc`: endpoints whose messages are in the reader's queue once send returns, for a backlog built at once
  (over TCP it reaches the queue some time later, and nothing says when without reading it).
"""
from __future__ import annotations

import time
from typing import Callable

from edgeinfer.core.clock import now_ns
from edgeinfer.core.transport import Endpoints, Receiver, send
from edgeinfer.core.wire import Hello


def heard(tx, rx: Receiver, timeout_s: float = 10.0) -> None:
    """Send Hellos on socket tx until Receiver rx yields a Hello (rx hears tx, or its peer answering: a ready PULL).
    Raises TimeoutError after timeout_s s."""
    deadline = time.monotonic() + timeout_s
    while not isinstance(rx.recv(20), Hello):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no Hello on {rx.sock.last_endpoint!r} within {timeout_s} s")
        send(tx, Hello("test", 0, now_ns()))


def received(rx: Receiver, expected: int, timeout_s: float = 10.0, keep: Callable[[object], bool] | None = None
             ) -> list:
    """Messages from Receiver rx until `expected` have come (those keep() refuses are left out, and not counted),
    then whatever else is queued already. A message that never comes fails the caller's count after timeout_s s."""
    def wanted(m):
        return m is not None and (keep is None or keep(m))

    msgs = []
    deadline = time.monotonic() + timeout_s
    while len(msgs) < expected and time.monotonic() < deadline:
        msgs += filter(wanted, [rx.recv(100)])
    return msgs + list(filter(wanted, rx.drain()))


def inproc(name: str) -> Endpoints:
    """Endpoints inproc://{name}-obs, -chunks, -commands, -ready: for sockets of one zmq.Context (a node's ctx)."""
    return Endpoints(*(f"inproc://{name}-{kind}" for kind in ("obs", "chunks", "commands", "ready")))
