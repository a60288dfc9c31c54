"""Latest-only readers after a backlog (the runtime's and the control loop's observation SUBs): the newest
observation is used, never an older one while it is queued, and the ones it superseded are counted. The backlog
goes over inproc in the node's own context, so it is whole in the node's queue before the node reads
(tests/delivery.py)."""
import threading

import pytest
from delivery import heard, inproc
from test_serve import _obs, _step_until_chunk

from edgeinfer.control.loop import ControlConfig, ControlLoop
from edgeinfer.core.clock import now_ns
from edgeinfer.core.transport import LATEST_HWM, Receiver, pub, pull, send, sub
from edgeinfer.core.wire import Start
from edgeinfer.node.runtime import RuntimeConfig
from edgeinfer.node.serve import RuntimeNode

BACKLOG = 1000  # about four READ_LIMITs: before, a read took the 257th


@pytest.fixture
def runtime():
    """A started null-policy RuntimeNode on inproc endpoints and the replayer's side of it in the node's context:
    (node, obs PUB, chunk SUB), the chunk SUB past the slow joiner."""
    ep = inproc("runtime")
    node = RuntimeNode(RuntimeConfig(null_policy=True, replan_every_ticks=1, max_obs_age_ms=None), ep).open()
    try:
        obs_pub = pub(node.ctx, ep.obs, hwm=LATEST_HWM)  # the harness must not drop any of the backlog itself
        ready, chunks = Receiver(pull(node.ctx, ep.ready)), Receiver(sub(node.ctx, ep.chunks))
        result = {}
        shaker = threading.Thread(target=lambda: result.update(ok=node.handshake(10.0)))
        shaker.start()
        heard(obs_pub, ready)  # until the runtime hears us and says it is ready
        assert chunks.recv(10_000) is not None  # its Hellos reach the chunk SUB: subscribed
        send(obs_pub, Start(now_ns(), 4_000_000, 1000))
        shaker.join(10)
        assert result == {"ok": True}
        yield node, obs_pub, chunks
    finally:
        node.close()  # its context, the test's sockets with it


def test_runtime_builds_its_chunk_from_the_newest_observation_after_a_backlog(runtime):
    node, obs_pub, chunks = runtime
    for seq in range(BACKLOG):
        assert send(obs_pub, _obs(seq))
    chunk = _step_until_chunk(node, chunks)
    assert chunk.obs_seq == BACKLOG - 1
    node.telemetry.refresh()  # what the next Stats carries
    counters = node.telemetry.telemetry.counters
    assert (counters["observations"], counters["obs_superseded"]) == (BACKLOG, BACKLOG - 1)


def test_control_loop_takes_the_newest_observation_after_a_backlog():
    ep = inproc("control")
    loop = ControlLoop(ControlConfig(realtime_priority=0), ep).open()
    try:
        tx = pub(loop.ctx, ep.obs, hwm=LATEST_HWM)
        heard(tx, loop.obs)  # until the loop's subscription is live
        while loop.obs.recv(50) is not None:
            pass
        for seq in range(BACKLOG):
            assert send(tx, _obs(seq))
        seen = []
        for _ in range(200):  # one call a tick, each reading for obs_read_budget_us (500 us) at most
            assert loop._take_messages(now_ns())
            if loop.last_obs is not None and loop.last_obs.seq not in seen:
                seen.append(loop.last_obs.seq)
        # a tick whose budget ran out takes the newest read so far (never an older one), then the newest
        assert seen == sorted(seen) and seen[-1] == BACKLOG - 1
        loop._refresh_stats()
        # every observation read is either taken (seen) or superseded
        assert (loop.stats.observations, loop.stats.obs_superseded) == (BACKLOG, BACKLOG - len(seen))
        assert loop.telemetry.counters["obs_superseded"] == BACKLOG - len(seen)  # reaches the node's Stats
    finally:
        loop.close()
