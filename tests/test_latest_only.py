"""Latest-only readers after a backlog (the runtime's and the control loop's observation SUBs): the newest
observation is used, never an older one while it is queued, and the ones it superseded are counted."""
import time

import zmq
from test_serve import _obs, _step_until_chunk, node_and_peers  # noqa: F401 - node_and_peers is a fixture

from edgeinfer.control.loop import ControlConfig, ControlLoop
from edgeinfer.core.clock import now_ns
from edgeinfer.core.transport import LATEST_HWM, Endpoints, pub, send
from edgeinfer.core.wire import Hello
from edgeinfer.node.runtime import RuntimeConfig

BACKLOG = 1000  # about four READ_LIMITs: before, a read took the 257th


def test_runtime_builds_its_chunk_from_the_newest_observation_after_a_backlog(node_and_peers):  # noqa: F811
    cfg = RuntimeConfig(null_policy=True, replan_every_ticks=1, max_obs_age_ms=None)
    node, obs_pub, chunks = node_and_peers(cfg)
    obs_pub.setsockopt(zmq.SNDHWM, LATEST_HWM)  # the harness must not drop any of the backlog itself
    for seq in range(BACKLOG):
        send(obs_pub, _obs(seq))
    time.sleep(0.3)  # the whole backlog queued before the node reads
    chunk = _step_until_chunk(node, chunks)
    assert chunk.obs_seq == BACKLOG - 1
    node.telemetry.refresh()  # what the next Stats carries
    counters = node.telemetry.telemetry.counters
    assert (counters["observations"], counters["obs_superseded"]) == (BACKLOG, BACKLOG - 1)


def test_control_loop_takes_the_newest_observation_after_a_backlog():
    ep = Endpoints.free_loopback()
    ctx = zmq.Context()
    loop = ControlLoop(ControlConfig(realtime_priority=0), ep).open()
    try:
        tx = pub(ctx, ep.obs, hwm=LATEST_HWM)
        while not isinstance(loop.obs.recv(20), Hello):  # until the loop's subscription is live
            send(tx, Hello("replayer", 0, now_ns()))
        while loop.obs.recv(50) is not None:
            pass
        for seq in range(BACKLOG):
            send(tx, _obs(seq))
        time.sleep(0.3)
        seen = []
        for _ in range(10):  # one call a tick
            assert loop._take_messages(now_ns())
            if loop.last_obs is not None and loop.last_obs.seq not in seen:
                seen.append(loop.last_obs.seq)
        assert seen == [BACKLOG - 1]  # before: 255, then 511, ... one READ_LIMIT a tick
        loop._refresh_stats()
        assert (loop.stats.observations, loop.stats.obs_superseded) == (BACKLOG, BACKLOG - 1)
        assert loop.telemetry.counters["obs_superseded"] == BACKLOG - 1  # reaches the node's Stats
    finally:
        loop.close()
        ctx.destroy(linger=0)
