"""Chunk boundaries: the raw jump is measured, a cross-fade keeps the command continuous, and the rest of a
chunk published early replaces its first step without counting as a boundary."""
import numpy as np
import pytest

from edgeinfer.control.buffer import ChunkBuffer, target_at
from edgeinfer.core.wire import ActionChunk

MS = 1_000_000
T = 5_000 * MS
STEP = 10 * MS


def chunk(t_obs, rows, obs_seq=0):
    return ActionChunk(seq=obs_seq, obs_seq=obs_seq, t_obs_ns=t_obs, t_ready_ns=t_obs, step_ns=STEP,
                       steps_rad=np.asarray(rows, dtype=np.float64), rung="full", tokens=0, target_passes=0,
                       drafted=0, accepted=0)


OLD = [[0.0], [1.0], [2.0], [3.0], [4.0]]       # 100 rad/s along [T, T + 40 ms]
NEW = [[1.5], [2.5], [3.5], [4.5], [5.5]]       # anchored at T + 10 ms, 0.5 rad above OLD there


def test_the_raw_boundary_jump_is_recorded():
    buf = ChunkBuffer()
    buf.push(chunk(T, OLD))
    buf.sample(T + 5 * MS)
    buf.push(chunk(T + STEP, NEW, obs_seq=1))
    q, _, seq = buf.sample(T + STEP)
    assert seq == 1 and q[0] == 1.5  # no blending: the new chunk's target at once
    assert buf.boundaries == 1 and buf.jump_last_rad == buf.jump_max_rad == 0.5


def test_a_cross_fade_makes_the_command_continuous():
    buf = ChunkBuffer(blend_ns=STEP)
    buf.push(chunk(T, OLD))
    buf.sample(T + 5 * MS)
    buf.push(chunk(T + STEP, NEW, obs_seq=1))
    ts = [T + STEP + i * 2 * MS for i in range(8)]
    q = np.array([buf.sample(t)[0][0] for t in ts])
    old = np.interp(ts, [T + i * STEP for i in range(5)], [r[0] for r in OLD])
    new = old + 0.5
    np.testing.assert_allclose(q[:6], old[:6] + 0.5 * np.arange(6) * 2 / 10)  # w = 0, 0.2, ... 1.0
    np.testing.assert_allclose(q[6:], new[6:])  # past the fade: the new chunk alone
    assert q[0] == old[0] and buf.boundaries == 1 and buf.jump_last_rad == 0.5  # the raw jump is still reported


def test_the_rest_of_an_early_first_step_replaces_it_without_a_boundary():
    buf = ChunkBuffer(blend_ns=STEP)
    buf.push(chunk(T, OLD[:2]))  # the first verified step, published early
    assert buf.sample(T + 5 * MS)[0][0] == 0.5
    assert buf.push(chunk(T, OLD))  # the whole chunk of the same observation
    assert buf.sample(T + 25 * MS)[0][0] == 2.5  # covered beyond the first step now
    assert buf.boundaries == 0
    assert not buf.push(chunk(T, OLD[:3]))  # a shorter copy of the same observation is ignored


def test_a_replay_reports_the_raw_jump_and_the_commanded_step_at_boundaries():
    from types import SimpleNamespace

    from edgeinfer.core.wire import JointCommand
    from edgeinfer.sim.boundaries import boundary_section
    from edgeinfer.sim.received import Commands

    period = 2 * MS
    old, new = chunk(T, OLD, obs_seq=0), chunk(T + STEP, NEW, obs_seq=5)
    commands = Commands(11, 1)
    for n in range(10):  # ticks 0..4 from the old chunk, 5..9 from the new one, unstitched
        c = old if n < 5 else new
        t = T + n * period
        commands.put(t, JointCommand(n, 0, c.obs_seq, t, target_at(c, t), "full"))
    commands.put(0, JointCommand(10, 0, -1, 0, commands.q_rad[9], "hold"))
    rec = SimpleNamespace(commands=commands, t0_ns=T, period_ns=period)
    out = boundary_section(rec, {0: old, 5: new}.get)
    assert out["raw_jump_rad"]["count"] == 1 and out["raw_jump_rad"]["max"] == pytest.approx(0.5)
    assert out["step_at_boundary_rad"]["max"] == pytest.approx(0.5 + 0.2)  # the jump plus one tick of motion
    assert out["step_elsewhere_rad"]["count"] == 8 and out["step_elsewhere_rad"]["max"] == pytest.approx(0.2)
