"""edgeinfer.core.transport over real loopback TCP sockets; a backlog over inproc, where a message is in the reader's
queue once send returns (tests/delivery.py)."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
from delivery import heard, inproc

from edgeinfer.core.transport import (
    LATEST_HWM,
    Endpoints,
    Receiver,
    pub,
    pull,
    push,
    send,
    sub,
    wait_for_hello,
    wait_until_subscribed,
)
from edgeinfer.core.wire import Observation, Start, Stop

ROOT = Path(__file__).resolve().parents[1]


def _obs(seq: int) -> Observation:
    return Observation(seq=seq, t_ns=time.perf_counter_ns(), q_rad=np.full(3, float(seq)),
                       qd_rad_s=np.zeros(3), q_prev_rad=np.zeros(3))


def test_free_loopback_ports_are_distinct():
    e = Endpoints.free_loopback()
    urls = [e.obs, e.chunks, e.commands, e.ready]
    assert len(set(urls)) == 4 and all(u.startswith("tcp://127.0.0.1:") for u in urls)


def test_sockets_are_bounded_and_do_not_linger(ctx, ep):
    s = pub(ctx, ep.obs, hwm=1)
    assert s.getsockopt(zmq.LINGER) == 0
    assert s.getsockopt(zmq.SNDHWM) == 1 and s.getsockopt(zmq.RCVHWM) == 1
    with pytest.raises(ValueError):
        pub(ctx, ep.chunks, hwm=0)


BACKLOG_EP = inproc("backlog").obs


def _latest_rx(ctx) -> Receiver:
    return Receiver(sub(ctx, BACKLOG_EP, hwm=LATEST_HWM), latest=Observation)


def _subscribed(ctx, rx, hwm=LATEST_HWM):
    """A PUB on BACKLOG_EP whose subscriber rx has heard a Hello (no later message lost to the slow joiner)."""
    tx = pub(ctx, BACKLOG_EP, hwm=hwm)
    heard(tx, rx)
    while rx.recv(50) is not None:  # the Hellos still queued
        pass
    return tx


def test_recv_latest_returns_the_newest_after_a_backlog(ctx):
    # a stall: 3000 observations queued (far more than READ_LIMIT) before the reader reads again
    rx = _latest_rx(ctx)
    tx = _subscribed(ctx, rx)
    received_before = rx.received
    for seq in range(3000):
        assert send(tx, _obs(seq))
    newest = []
    for _ in range(50):  # READ_LIMIT at a time: the newest comes back once the queue is read to its end
        got = rx.recv_latest(0)
        assert got.others == []
        if got.msg is not None:
            newest.append(got.msg.seq)
        if got.msg is None and got.count == 0:
            break
    assert newest == [2999]  # never an older one first (before: seq 256, read while 2999 was queued)
    assert rx.received - received_before == 3000 and rx.stale_dropped == 2999


def test_recv_latest_holds_the_newest_over_the_read_limit(ctx):
    rx = _latest_rx(ctx)
    tx = _subscribed(ctx, rx)
    send(tx, Start(1, 2, 3))
    tx.send_multipart([b"garbage"])
    for seq in range(20):
        send(tx, _obs(seq))
    send(tx, Stop("end"))
    first, second, third = rx.recv_latest(1000, limit=10), rx.recv_latest(0, limit=10), rx.recv_latest(0, limit=10)
    assert (first.msg, [type(m) for m in first.others], first.count) == (None, [Start], 8)  # + garbage + Start
    assert (second.msg, second.others, second.count) == (None, [], 10)
    assert (third.msg.seq, third.others, third.count) == (19, [Stop("end")], 2)
    assert (rx.stale_dropped, rx.malformed_by_kind["garbage"]) == (19, 1)
    assert rx.recv_latest(0) == (None, [], 0)


def test_a_latest_only_reader_needs_a_deep_queue(ctx, ep):
    with pytest.raises(ValueError, match="RCVHWM is 100.*LATEST_HWM"):
        Receiver(sub(ctx, ep.obs), latest=Observation)
    with pytest.raises(ValueError, match="latest="):
        Receiver(sub(ctx, ep.chunks)).recv_latest(0)


def test_send_never_blocks_when_the_queue_is_full(ctx, ep):
    tx = push(ctx, ep.commands, hwm=1)  # connected to nobody: the pipe fills after HWM messages
    results = []
    sender = threading.Thread(target=lambda: results.extend(send(tx, _obs(seq)) for seq in range(10)), daemon=True)
    sender.start()
    sender.join(timeout=10)  # a blocking send would wait for a reader for ever
    assert not sender.is_alive(), "send blocked on a full queue"
    assert results[0] is True and results[1:] == [False] * 9


def test_malformed_is_counted_and_skipped(ctx, ep):
    rx = Receiver(pull(ctx, ep.commands))
    tx = push(ctx, ep.commands)
    tx.send_multipart([b"garbage"])
    tx.send_multipart([b"\x81\xa6schema\xa4nope"])
    assert send(tx, _obs(7))
    msg = rx.recv(2000)
    assert isinstance(msg, Observation) and msg.seq == 7
    assert rx.malformed == 2 and "nope" in rx.last_error
    assert rx.drain() == []


def test_handshake_times_out_naming_missing_peers(ctx, ep):
    p = pub(ctx, ep.obs)
    ready = Receiver(pull(ctx, ep.ready))
    with pytest.raises(TimeoutError, match="ghost"):
        wait_until_subscribed(p, "replayer", ready, {"ghost"}, timeout_s=0.05)
    with pytest.raises(TimeoutError, match="tcp://"):
        wait_for_hello([Receiver(sub(ctx, ep.chunks))], timeout_s=0.05)


_PEER = """
import sys
import zmq
from edgeinfer.core.transport import Receiver, announce_ready, push, sub, wait_for_hello
from edgeinfer.core.wire import Hello

obs_ep, ready_ep = sys.argv[1:3]
ctx = zmq.Context()
rx = Receiver(sub(ctx, obs_ep))
ready = push(ctx, ready_ep)
wait_for_hello([rx], timeout_s=10)
assert announce_ready(ready, "control")
while isinstance(msg := rx.recv(10_000), Hello):  # Hellos may still be queued: skip them
    pass
print(type(msg).__name__, getattr(msg, "seq", None), flush=True)
ctx.destroy(linger=0)
"""


def test_handshake_with_subscriber_in_another_process(ctx, ep):
    p = pub(ctx, ep.obs)
    ready = Receiver(pull(ctx, ep.ready))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    peer = subprocess.Popen([sys.executable, "-c", _PEER, ep.obs, ep.ready], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_subscribed(p, "replayer", ready, {"control"}, timeout_s=10)
        assert send(p, _obs(0))  # exactly one message: lost to the slow joiner, the peer would time out
        out, err = peer.communicate(timeout=10)
    finally:
        if peer.poll() is None:
            peer.kill()
            peer.wait()
    assert peer.returncode == 0, err
    assert out.strip() == "Observation 0"
