"""Control path: chunk buffer interpolation, safety limits, and the control loop's per-tick command."""
import numpy as np
import pytest
import zmq

from edgeinfer.control.buffer import ChunkBuffer
from edgeinfer.control.loop import ControlConfig, ControlLoop
from edgeinfer.control.safety import SafetyLimits
from edgeinfer.core.transport import Endpoints, Receiver, pull, push
from edgeinfer.core.wire import ActionChunk, JointCommand, Observation

MS = 1_000_000
T = 5_000 * MS  # anchor time of the first chunk
STEP = 10 * MS


def chunk(t_obs, rows, rung="full", obs_seq=0, step_ns=STEP):
    return ActionChunk(seq=obs_seq, obs_seq=obs_seq, t_obs_ns=t_obs, t_ready_ns=t_obs + 3 * MS, step_ns=step_ns,
                       steps_rad=np.asarray(rows, dtype=np.float64), rung=rung, tokens=0, target_passes=0,
                       drafted=0, accepted=0)


# Two joints, H = 2: anchor [0, 1] at T, targets [1, 3] at T+10ms and [3, 2] at T+20ms.
ROWS = [[0.0, 1.0], [1.0, 3.0], [3.0, 2.0]]


@pytest.mark.parametrize("dt_ns, expected", [
    (0, [0.0, 1.0]),                # the anchor itself
    (STEP, [1.0, 3.0]),             # exactly on step 1
    (2 * STEP, [3.0, 2.0]),         # exactly on the last step (closed end of the interval)
    (STEP // 2, [0.5, 2.0]),        # midpoint of rows 0, 1
    (3 * STEP // 2, [2.0, 2.5]),    # midpoint of rows 1, 2
    (STEP // 4, [0.25, 1.5]),       # a quarter of the way from row 0 to row 1
    (STEP + 3 * STEP // 4, [2.5, 2.25]),
])
def test_buffer_interpolates_linearly(dt_ns, expected):
    buf = ChunkBuffer()
    buf.push(chunk(T, ROWS, rung="partial", obs_seq=7))
    q, rung, obs_seq = buf.sample(T + dt_ns)
    np.testing.assert_allclose(q, expected, rtol=0, atol=1e-12)
    assert rung == "partial" and obs_seq == 7


def test_buffer_coverage_boundaries():
    buf = ChunkBuffer()
    assert buf.sample(T) is None  # empty
    buf.push(chunk(T, ROWS))
    assert buf.sample(T - 1) is None  # before the anchor
    assert buf.sample(T + 2 * STEP + 1) is None  # after the last step
    assert buf.sample(T) is not None and buf.sample(T + 2 * STEP) is not None


def test_anchor_only_chunk_is_ignored():
    buf = ChunkBuffer()
    buf.push(chunk(T, [[9.0, 9.0]]))
    assert buf.sample(T) is None
    buf.push(chunk(T, ROWS, obs_seq=1))
    buf.push(chunk(T + STEP, [[9.0, 9.0]], obs_seq=2))  # newer but anchor-only: must not shadow
    q, rung, obs_seq = buf.sample(T + STEP)
    np.testing.assert_allclose(q, [1.0, 3.0])
    assert (rung, obs_seq) == ("full", 1)


def test_newer_chunk_replaces_and_stale_chunk_is_ignored():
    buf = ChunkBuffer()
    buf.push(chunk(T, ROWS, rung="full", obs_seq=1))
    newer = [[10.0, 20.0], [12.0, 16.0], [14.0, 12.0]]  # anchored one step later
    buf.push(chunk(T + STEP, newer, rung="draft", obs_seq=2))
    q, rung, obs_seq = buf.sample(T + STEP + STEP // 2)  # both cover; the newest wins
    np.testing.assert_allclose(q, [11.0, 18.0])
    assert (rung, obs_seq) == ("draft", 2)
    # an older (or equally old) chunk arriving late does not displace the newest
    buf.push(chunk(T + STEP // 2, [[-5.0, -5.0], [-5.0, -5.0]], obs_seq=3))
    buf.push(chunk(T + STEP, [[-7.0, -7.0], [-7.0, -7.0]], obs_seq=4))
    q, rung, obs_seq = buf.sample(T + STEP + STEP // 2)
    np.testing.assert_allclose(q, [11.0, 18.0])
    assert obs_seq == 2


def test_fallback_to_older_chunk_is_continue():
    buf = ChunkBuffer()
    old = [[0.0, 0.0], [1.0, -1.0], [2.0, -2.0], [3.0, -3.0], [4.0, -4.0]]  # covers [T, T+40ms]
    buf.push(chunk(T, old, rung="full", obs_seq=1))
    buf.push(chunk(T + 25 * MS, [[5.0, 5.0], [7.0, 9.0], [9.0, 13.0]], rung="partial", obs_seq=2))  # [T+25, T+45]
    q, rung, obs_seq = buf.sample(T + 20 * MS)  # only the older chunk covers this
    np.testing.assert_allclose(q, [2.0, -2.0])
    assert (rung, obs_seq) == ("continue", 1)
    q, rung, obs_seq = buf.sample(T + 30 * MS)  # the newest covers it again
    np.testing.assert_allclose(q, [6.0, 7.0])
    assert (rung, obs_seq) == ("partial", 2)
    assert buf.sample(T + 45 * MS + 1) is None


def test_buffer_keeps_only_the_newest_chunks():
    buf = ChunkBuffer(keep=2)
    for i in range(3):
        buf.push(chunk(T + i * MS, [[float(i)] * 2] * 50, obs_seq=i))  # each covers 490 ms
    assert buf.sample(T + 1 * MS)[1:] == ("continue", 1)
    assert buf.sample(T + MS // 2) is None  # chunk 0, the only one covering this, was evicted


def test_a_chunk_anchored_far_ahead_never_becomes_the_newest():
    # The embedded Controller's way: push() with no time, judged on the last sample's. Anchored 2**40 ns (18 min)
    # ahead, more than its own 20 ms horizon: refused; the correct chunks after it are taken and followed.
    buf = ChunkBuffer()
    assert buf.sample(T) is None
    bad = chunk(T + 2**40, ROWS, obs_seq=1)
    assert not buf.push(bad)
    assert buf.offer(bad).kind == "implausible"
    assert buf.push(chunk(T, ROWS, obs_seq=2))
    assert buf.sample(T + STEP)[1:] == ("full", 2)
    assert buf.push(chunk(T + STEP, ROWS, obs_seq=3))
    assert buf.sample(T + STEP)[1:] == ("full", 3)
    # the bound: the chunk's horizon (2 steps) ahead of the clock, or max_lead_ns when given
    assert buf.offer(chunk(T + 3 * STEP, ROWS, obs_seq=4), T + STEP) is None
    assert buf.offer(chunk(T + 3 * STEP + 1, ROWS, obs_seq=5), T + STEP).kind == "implausible"
    strict = ChunkBuffer(max_lead_ns=MS)
    assert strict.offer(chunk(T + MS + 1, ROWS), T).kind == "implausible"
    assert strict.offer(chunk(T + MS, ROWS), T) is None


def test_a_chunk_with_a_nonpositive_step_is_refused_and_never_sampled():
    # step_ns 0 would divide by zero at the first sample that reaches it (before: ZeroDivisionError)
    buf = ChunkBuffer()
    for step_ns in (0, -STEP):
        refusal = buf.offer(chunk(T, ROWS, step_ns=step_ns))
        assert refusal.kind == "implausible" and f"step_ns {step_ns} is not > 0" in refusal.detail
    assert buf.sample(T) is None


def test_a_chunk_whose_horizon_has_passed_is_expired():
    buf = ChunkBuffer()
    assert buf.offer(chunk(T, ROWS), T + 2 * STEP + 1).kind == "expired"
    assert buf.offer(chunk(T, ROWS), T + 2 * STEP) is None  # its last step is still due


# ---- safety limits --------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, match", [
    (dict(q_min_rad=[-1.0, -1.0], q_max_rad=[1.0]), "same length"),
    (dict(q_min_rad=[-1.0, 1.0], q_max_rad=[1.0, 1.0]), "below"),
    (dict(q_min_rad=[2.0], q_max_rad=[1.0]), "below"),
    (dict(qd_max_rad_s=0.0), "qd_max_rad_s"),
    (dict(qd_max_rad_s=-1.0), "qd_max_rad_s"),
])
def test_safety_limits_reject_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SafetyLimits(**kwargs)


# ---- control loop command (no open(): only the commands socket is real) ----------------------


@pytest.fixture
def wired_loop():
    ep = Endpoints.free_loopback()
    ctx = zmq.Context()
    rx = Receiver(pull(ctx, ep.commands, bind=True))
    # 1000 rad/s: 10 rad per 10 ms tick, so only the position box can clamp unless a test lowers it
    limits = SafetyLimits(q_min_rad=[-3.0, -3.0], q_max_rad=[3.0, 3.0], qd_max_rad_s=1000.0)
    loop = ControlLoop(ControlConfig(limits=limits), ep)
    loop.commands = push(ctx, ep.commands)
    loop.runtime_lease.alive = True  # as after the runtime's first Heartbeat
    yield loop, rx
    ctx.destroy(linger=0)


def recv_command(rx) -> JointCommand:
    msg = rx.recv(2000)
    assert isinstance(msg, JointCommand)
    return msg


def test_command_holds_last_when_no_chunk_covers(wired_loop):
    loop, rx = wired_loop
    period_s = 0.01
    loop._command(0, T - STEP, period_s)  # no chunk, no observation: nothing safe to send
    assert rx.recv(100) is None
    assert loop.stats.ticks == 0 and loop.stats.holds == 0

    loop.last_obs = Observation(seq=4, t_ns=T - STEP, q_rad=np.array([0.5, -0.5]), qd_rad_s=np.zeros(2),
                                q_prev_rad=np.zeros(2))
    loop._command(1, T - STEP, period_s)  # hold at the observed position
    cmd = recv_command(rx)
    assert (cmd.seq, cmd.obs_seq, cmd.chunk_obs_seq, cmd.rung) == (1, 4, -1, "hold")
    np.testing.assert_array_equal(cmd.q_rad, [0.5, -0.5])

    loop.buffer.push(chunk(T, ROWS, rung="full", obs_seq=4))
    loop._command(2, T + STEP // 2, period_s)  # interpolated from the chunk
    cmd = recv_command(rx)
    assert (cmd.seq, cmd.obs_seq, cmd.chunk_obs_seq, cmd.rung) == (2, 4, 4, "full")
    np.testing.assert_allclose(cmd.q_rad, [0.5, 2.0])
    loop._command(3, T + 2 * STEP, period_s)  # last step of the chunk
    np.testing.assert_allclose(recv_command(rx).q_rad, [3.0, 2.0])

    loop._command(4, T + 2 * STEP + MS, period_s)  # past the chunk: watchdog holds the last command
    cmd = recv_command(rx)
    assert (cmd.seq, cmd.chunk_obs_seq, cmd.rung) == (4, -1, "hold")
    np.testing.assert_array_equal(cmd.q_rad, [3.0, 2.0])
    assert (loop.stats.ticks, loop.stats.holds, loop.stats.clamped) == (4, 2, 0)
    assert rx.recv(50) is None  # exactly one command per commanded tick


def test_command_is_clamped_to_the_limits(wired_loop):
    loop, rx = wired_loop
    loop.cfg.limits.qd_max_rad_s = 2.0  # 0.02 rad per 10 ms tick
    loop.buffer.push(chunk(T, [[0.0, 0.0], [5.0, -0.01]], obs_seq=9))
    loop._command(0, T + STEP, 0.01)  # first command: position box only
    np.testing.assert_allclose(recv_command(rx).q_rad, [3.0, -0.01])
    loop.buffer.push(chunk(T + STEP, [[3.0, -0.01], [0.0, -0.01]], obs_seq=10))
    loop._command(1, T + 2 * STEP, 0.01)  # wants 0.0 but may move only 0.02 from 3.0
    cmd = recv_command(rx)
    np.testing.assert_allclose(cmd.q_rad, [2.98, -0.01])
    assert cmd.chunk_obs_seq == 10
    assert loop.stats.clamped == 2 and loop.stats.holds == 0
    np.testing.assert_allclose(loop.gate.last_q_rad, [2.98, -0.01])
