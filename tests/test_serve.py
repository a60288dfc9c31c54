"""The runtime node loop (edgeinfer/node/serve.py), in process with the null policy: handshake, then one step at a
time: the newest observation only, stale ones dropped, a non-finite chunk never published, the final Stats."""
import dataclasses
import threading
import time

import numpy as np
import pytest
import zmq

from edgeinfer.core.clock import now_ns
from edgeinfer.core.transport import Endpoints, Receiver, pub, pull, send, sub, wait_for_hello
from edgeinfer.core.wire import ActionChunk, Hello, Observation, Start, Stats, Stop
from edgeinfer.node.faults import FaultConfig
from edgeinfer.node.runtime import NullRuntime, RuntimeConfig
from edgeinfer.node.serve import RuntimeNode


def _obs(seq: int, t_ns: int | None = None) -> Observation:
    q = np.full(6, 0.1 * seq)
    return Observation(seq, now_ns() if t_ns is None else t_ns, q, np.zeros(6), q.copy())


@pytest.fixture
def node_and_peers():
    """A started RuntimeNode and the replayer's side of it: (node, obs PUB, chunk SUB)."""
    def start(cfg: RuntimeConfig):
        ep = dataclasses.replace(Endpoints.free_loopback(), status=None)
        ctx = zmq.Context()
        peers.append(ctx)
        obs_pub, ready = pub(ctx, ep.obs), Receiver(pull(ctx, ep.ready))
        chunks = Receiver(sub(ctx, ep.chunks))
        node = RuntimeNode(cfg, ep).open()
        nodes.append(node)
        result = {}
        shaker = threading.Thread(target=lambda: result.update(ok=node.handshake(10.0)))
        shaker.start()
        deadline = now_ns() + 10_000_000_000
        while not isinstance(ready.recv(20), Hello):  # until the runtime hears us and says it is ready
            assert now_ns() < deadline, "the runtime never answered the replayer's Hellos"
            send(obs_pub, Hello("replayer", 0, now_ns()))
        wait_for_hello([chunks], 10.0)  # our chunk SUB is live: no first chunk lost (as sim/session.py)
        send(obs_pub, Start(now_ns(), 4_000_000, 1000))
        shaker.join(10)
        assert result == {"ok": True}
        return node, obs_pub, chunks
    peers, nodes = [], []
    yield start
    for node in nodes:
        node.close()
    for ctx in peers:
        ctx.destroy(linger=0)


def _next(rx, kind, timeout_ms=2000):
    """The next message of `kind` on rx (Hellos, Heartbeats and Stats of other kinds skipped)."""
    deadline = now_ns() + timeout_ms * 1_000_000
    while now_ns() < deadline:
        msg = rx.recv(50)
        if isinstance(msg, kind):
            return msg
    return None


def _step_until_chunk(node, chunks):
    for _ in range(20):
        node.step()
        if (chunk := _next(chunks, ActionChunk, 20)) is not None:
            return chunk
    return None


def test_node_decodes_the_newest_observation_and_drops_stale_ones(node_and_peers):
    node, obs_pub, chunks = node_and_peers(RuntimeConfig(null_policy=True, replan_every_ticks=1, max_obs_age_ms=300.0))
    for seq in range(3):  # three at once: latest-only, the first two are superseded
        send(obs_pub, _obs(seq))
    time.sleep(0.1)  # all three queued before the step receives
    chunk = _step_until_chunk(node, chunks)
    assert (chunk.obs_seq, chunk.rung) == (2, "full")
    send(obs_pub, _obs(3, t_ns=now_ns() - 500_000_000))  # 0.5 s old: older than max_obs_age_ms (past 1 s: implausible)
    send(obs_pub, _obs(4, t_ns=now_ns() - 500_000_000))
    time.sleep(0.1)
    assert _step_until_chunk(node, chunks) is None
    send(obs_pub, _obs(5))
    assert _step_until_chunk(node, chunks).obs_seq == 5
    send(obs_pub, Stop("done"))
    while node.step():
        pass
    assert node.finish() == 2
    final = None
    while (stats := _next(chunks, Stats, 300)) is not None:  # the beacon's periodic Stats, then the final one
        final = stats
    counters = final.counters
    assert (counters["obs_superseded"], counters["obs_stale"], counters["chunks_sent"]) == (3, 1, 2)
    assert counters["rung.full"] == 2


def test_node_never_publishes_a_non_finite_chunk(node_and_peers):
    cfg = RuntimeConfig(null_policy=True, replan_every_ticks=1, faults=FaultConfig(fault_nonfinite_every=1))
    node, obs_pub, chunks = node_and_peers(cfg)
    send(obs_pub, _obs(0))
    chunk = _step_until_chunk(node, chunks)
    assert (chunk.obs_seq, chunk.rung, len(chunk.steps_rad)) == (0, "continue", 1)  # the anchor only
    assert np.all(np.isfinite(chunk.steps_rad))
    assert node.telemetry.telemetry.counters["error.nonfinite_action"] == 1


def test_the_runtime_replans_every_chunk_step_unless_told():
    # a policy trained at 30 Hz with one tick per chunk step must replan every tick, not every 5 (the Schunk
    # policy's stride at 250 Hz): its chunks would stop covering the ticks between replans
    assert NullRuntime(RuntimeConfig(null_policy=True), stride_ticks=1).chunk_timing(33_333_333) == (1, 33_333_333)
    assert NullRuntime(RuntimeConfig(null_policy=True), stride_ticks=5).chunk_timing(4_000_000) == (5, 20_000_000)
    told = RuntimeConfig(null_policy=True, replan_every_ticks=2)
    assert NullRuntime(told, stride_ticks=5).chunk_timing(4_000_000) == (2, 20_000_000)


def test_an_observation_of_another_joint_count_is_refused_not_fatal():
    # a 6-joint policy fed 5 joints raised a numpy broadcast error inside the drafter, which ended the serve node;
    # ObservationMismatch is counted (error.obs_mismatch) and skipped by RuntimeNode.step
    from edgeinfer.core.wire import ObservationMismatch
    from edgeinfer.node.runtime import PolicyRuntime

    runtime = PolicyRuntime(RuntimeConfig())
    five = np.zeros(5)
    with pytest.raises(ObservationMismatch, match="5 joints, the policy has 6"):
        runtime.step(Observation(seq=0, t_ns=0, q_rad=five, qd_rad_s=five, q_prev_rad=five), budget=False)
