"""Receivers that cannot die: oversized frames, over-long messages and wrong joint counts are counted and dropped, the
connection kept and the valid messages after them served. Over real loopback TCP sockets (libzmq's frame limit acts
in its TCP decoder, not over inproc)."""

import time

import numpy as np
import pytest
import zmq
from delivery import heard, received

from edgeinfer.core.transport import MAX_MESSAGE_BYTES, Receiver, pub, pull, push, recv_frames, send, sub
from edgeinfer.core.wire import MAX_FRAMES, MAX_HEADER_BYTES, ActionChunk, Observation, WireError, encode


def _obs(seq: int, joints: int = 6) -> Observation:
    return Observation(seq, time.perf_counter_ns(), np.full(joints, float(seq)), np.zeros(joints), np.zeros(joints))


def _seqs(msgs) -> list[int]:
    return [m.seq for m in msgs if isinstance(m, Observation)]


def test_frames_over_the_wire_limits_are_counted_and_the_subscriber_keeps_its_connection(ctx, ep):
    """A 5 MiB frame (over the old 4 MiB ZMQ_MAXMSGSIZE, which cut the SUB's link for good) is refused by decode."""
    tx, rx = pub(ctx, ep.obs), Receiver(sub(ctx, ep.obs))
    heard(tx, rx)
    big = 5 * 1024 * 1024
    header = encode(_obs(0))[0]
    tx.send_multipart([b"\x00" * big])  # a header frame over MAX_HEADER_BYTES
    tx.send_multipart([header, b"\x00" * big, bytes(48), bytes(48)])  # an array frame over its shape's bytes
    for seq in range(1, 4):
        send(tx, _obs(seq))
    assert _seqs(received(rx, 3)) == [1, 2, 3]
    assert rx.malformed_by_kind == {"oversize": 2} and rx.malformed == 2
    assert f"array 'q_rad': oversized frame, {big} bytes" in rx.last_error  # the newest of the two


def test_the_hard_frame_cap_is_far_above_every_valid_frame():
    largest_array = len(encode(ActionChunk(0, 0, 0, 0, 1, np.zeros((256, 64)), "full", 0, 0, 0, 0))[1])
    assert MAX_MESSAGE_BYTES >= 64 * max(MAX_HEADER_BYTES, largest_array)


def test_a_message_of_250_frames_is_dropped_without_a_copy_and_the_next_one_served(ctx, ep):
    tx, rx = push(ctx, ep.commands), Receiver(pull(ctx, ep.commands))
    megabyte = np.zeros(1 << 17)  # 1 MiB, sent zero-copy
    tx.send_multipart([encode(_obs(0))[0], *[megabyte] * 250], copy=False)  # 250 MiB in one message
    send(tx, _obs(1))
    assert _seqs(received(rx, 1)) == [1]
    assert rx.malformed_by_kind == {"frames": 1}
    assert "got 251, expected 1..16" in rx.last_error


@pytest.mark.parametrize("n_frames, kept", [(MAX_FRAMES, MAX_FRAMES), (MAX_FRAMES + 1, None), (1000, None)])
def test_recv_frames_keeps_at_most_max_frames_and_leaves_the_socket_at_the_next_message(ctx, ep, n_frames, kept):
    tx, rx = push(ctx, ep.commands), pull(ctx, ep.commands)
    tx.send_multipart([b"x"] * n_frames)
    tx.send_multipart([b"next"])
    assert rx.poll(10_000)
    if kept is None:
        with pytest.raises(WireError, match=f"got {n_frames}, expected 1..{MAX_FRAMES}") as e:
            recv_frames(rx)
        assert e.value.kind == "frames"
    else:
        frames = recv_frames(rx)
        assert len(frames) == kept and all(isinstance(f, zmq.Frame) for f in frames)  # views, not copies
    assert [bytes(f) for f in recv_frames(rx)] == [b"next"]


def test_recv_frames_counts_a_routers_envelope_apart(ctx, ep):
    router = ctx.socket(zmq.ROUTER)
    router.bind(ep.commands)
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(ep.commands)
    dealer.send_multipart([b"h"] * MAX_FRAMES)  # the most a message carries: kept, with the routing id before it
    assert router.poll(10_000)
    assert len(recv_frames(router, envelope=1)) == MAX_FRAMES + 1
    dealer.close(0)
    router.close(0)


def test_a_receiver_with_a_joint_count_counts_other_counts_and_serves_its_own(ctx, ep):
    """A 1-joint observation was broadcast over six joints, a 3-joint one killed the control loop."""
    tx, rx = push(ctx, ep.commands), Receiver(pull(ctx, ep.commands), joints=6)
    send(tx, _obs(0, joints=1))
    send(tx, _obs(1, joints=3))
    send(tx, ActionChunk(2, 0, 0, 0, 1, np.zeros((4, 3)), "full", 0, 0, 0, 0))
    send(tx, _obs(3))
    assert _seqs(received(rx, 1)) == [3]
    assert rx.malformed_by_kind == {"joints": 3} and rx.received == 1
    assert "array 'steps_rad': 3 joint(s), this receiver expects 6" in rx.last_error


def test_a_receiver_without_a_joint_count_takes_any(ctx, ep):
    tx, rx = push(ctx, ep.commands), Receiver(pull(ctx, ep.commands))
    send(tx, _obs(0, joints=1))
    send(tx, _obs(1, joints=3))
    assert _seqs(received(rx, 2)) == [0, 1] and rx.malformed == 0
