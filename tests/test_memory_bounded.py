"""Memory stays flat through a long run (scripts/soak.py): the control loop's tick path keeps nothing per tick or per
chunk, and the replayer's recording takes all its memory when the run starts, not row by row."""
import gc
import tracemalloc
from pathlib import Path

import numpy as np
import psutil
import pytest
import zmq

from edgeinfer.control.loop import ControlConfig, ControlLoop
from edgeinfer.control.safety import SafetyLimits
from edgeinfer.core.transport import LATEST_HWM, Endpoints, Receiver, pub, push, sub
from edgeinfer.core.wire import ActionChunk, Heartbeat, Observation, Start
from edgeinfer.sim.replay import Recording

PERIOD = 4_000_000  # 250 Hz, as the Schunk logs
REPLAN = 5  # a chunk every 5 ticks (50 Hz), as the runtime's default
ROOT = str(Path(__file__).resolve().parents[1])


@pytest.fixture
def loop():
    """A ControlLoop without open(): real sockets with no peer (a command nobody reads is counted, not kept), a
    status PUB nobody hears, and an injected clock."""
    ctx, ep, now = zmq.Context(), Endpoints.free_loopback(), [0]
    limits = SafetyLimits(q_min_rad=[-3.0] * 6, q_max_rad=[3.0] * 6, qd_max_rad_s=1000.0)
    lp = ControlLoop(ControlConfig(limits=limits, blend_ms=8.0), ep, clock=lambda: now[0])
    lp.commands = push(ctx, ep.commands)
    lp.obs = Receiver(sub(ctx, ep.obs, hwm=LATEST_HWM), latest=Observation)
    lp.chunks = Receiver(sub(ctx, ep.chunks))
    lp.status = pub(ctx, "tcp://127.0.0.1:*", bind=True)
    lp.log.write = lambda text: None
    yield lp, now
    ctx.destroy(linger=0)


def run_ticks(lp: ControlLoop, now: list, start: Start, ticks: range, rng) -> None:
    """Ticks as run() does them (messages, command, status), with a runtime Heartbeat every tick, a new chunk
    (a boundary) every REPLAN ticks and a new observation every tick."""
    for n in ticks:
        t = start.t0_ns + n * PERIOD
        now[0] = t + 100_000
        lp._runtime_beat(Heartbeat("runtime", 1, n, now[0], 7_000_000, -1, start.t0_ns, PERIOD, start.n_ticks),
                         now[0])
        if n % REPLAN == 0:
            steps = rng.normal(scale=0.1, size=(11, 6))
            lp._take_chunk(ActionChunk(n, n, t, t, PERIOD, steps, "draft", 60, 3, 10, 8), t)
        lp._take_messages(t)
        lp.last_obs = Observation(n, t, np.zeros(6), np.zeros(6), np.zeros(6))
        lp._command(n, t, PERIOD / 1e9)
        lp._publish_status()


def test_the_control_loop_keeps_nothing_per_tick_or_per_chunk(loop):
    lp, now = loop
    warm, more = 300, 1500
    start = Start(PERIOD, PERIOD, warm + more)
    lp.begin(start)
    rng = np.random.default_rng(0)
    tracemalloc.start()
    try:
        run_ticks(lp, now, start, range(warm), rng)  # counters, histograms and leases take their shape
        gc.collect()
        before = tracemalloc.take_snapshot()
        run_ticks(lp, now, start, range(warm, warm + more), rng)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    assert lp.stats.ticks == warm + more and lp.buffer.boundaries == (warm + more) // REPLAN - 1
    ours = [tracemalloc.Filter(True, ROOT + "/*")]
    grown = [d for d in after.filter_traces(ours).compare_to(before.filter_traces(ours), "lineno") if d.size_diff > 0]
    # before the fix: a float per boundary in ChunkBuffer.jumps_rad, 32 B x 300 = 9.6 KB (3 MB in a 30 min soak)
    assert sum(d.size_diff for d in grown) < 2048, [str(d) for d in grown[:5]]


def test_a_recording_takes_its_memory_when_the_run_starts():
    """Every column of the recording is written at allocation, so filling it row by row (a run) adds no resident
    memory: np.zeros maps its pages lazily, and the RSS would then grow with every row sent."""
    n_rows = 400_000  # 27 minutes at 250 Hz
    rec = Recording.start(0, PERIOD, np.arange(n_rows, dtype=np.int64), n_joints=1, chunk_steps=2,
                          replan_every_ticks=REPLAN)
    columns = [v for o in (rec, rec.commands, rec.chunks) for v in vars(o).values() if isinstance(v, np.ndarray)]
    assert len(columns) >= 10 and all(len(c) >= n_rows // REPLAN for c in columns)
    proc = psutil.Process()
    rss = proc.memory_info().rss
    for c in columns:  # what a run writes into them, row by row
        c[...] = 1
    # before the fix: t_sent_ns and skipped, np.zeros: 9 B a row, 3.4 MB here
    assert proc.memory_info().rss - rss < 1 << 20
