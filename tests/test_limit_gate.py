"""The limit gate (control/gate.py): every command inside the position box and within the speed limit of the last
command, whatever the targets, measurements, limits and tick times; stated as hypothesis properties, then through
the command path and a real replay."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from edgeinfer.control.buffer import ChunkBuffer
from edgeinfer.control.command import CommandCounters, command
from edgeinfer.control.gate import LimitGate
from edgeinfer.control.safety import SafetyLimits
from edgeinfer.core.wire import ActionChunk

MS = 1_000_000
T = 10**12


def _gate(**kw) -> tuple[LimitGate, CommandCounters]:
    kw = {"q_min_rad": [-1.0, -2.0], "q_max_rad": [1.0, 2.0], "qd_max_rad_s": 0.5, **kw}
    return LimitGate(SafetyLimits(**kw)), CommandCounters()


def test_the_first_command_is_boxed_and_rate_limited_from_the_measured_position():
    gate, c = _gate()
    np.testing.assert_array_equal(gate.admit(np.array([1.5, -3.0]), T, None, 0.1, c), [1.0, -2.0])  # no reference
    gate, c = _gate()
    # 0.5 rad/s over one configured period (0.1 s) from the measured position
    np.testing.assert_allclose(gate.admit(np.array([0.2, -0.01]), T, np.zeros(2), 0.1, c), [0.05, -0.01])
    assert (c.clamped, c.clamped_velocity, c.clamped_position) == (1, 1, 0)


def test_the_speed_limit_is_spread_over_the_measured_time_since_the_last_command():
    gate, c = _gate()
    gate.last_q_rad, gate.last_t_ns = np.array([0.5, 1.9]), T
    # 100 ms later: at most 0.05 rad from the last command, then the box
    np.testing.assert_allclose(gate.admit(np.array([-1.0, 2.5]), T + 100 * MS, None, 0.004, c), [0.45, 1.95])
    np.testing.assert_allclose(gate.admit(np.array([0.0, 1.95]), T + 1100 * MS, None, 0.004, c), [0.4, 1.95])
    assert c.dt_capped == 1  # 1 s since the last command: spread over dt_max_s (0.1 s) only


@pytest.mark.parametrize("measured", [1e6, 5.0])
def test_a_measurement_outside_the_box_never_becomes_the_reference(measured):
    # the red team's case: q0 = 1e6 (or 5) rad observed, then normal targets. Before, the first command was
    # 999999.99 and every later one stayed outside, rate-limited around it.
    gate, c = _gate(q_min_rad=[-2.967] * 2, q_max_rad=[2.967] * 2, qd_max_rad_s=2.0)
    first = gate.admit(np.array([measured, 0.0]), T, np.array([measured, 0.0]), 0.004, c)
    np.testing.assert_allclose(first, [2.967, 0.0])
    assert c.reference_outside_box == 1 and c.clamped_position == 1
    for k in range(1, 400):
        q = gate.admit(np.array([0.1, 0.0]), T + k * 4 * MS, np.array([measured, 0.0]), 0.004, c)
        assert np.all(np.abs(q) <= 2.967)
    np.testing.assert_allclose(q, [0.1, 0.0])  # 2.867 rad at 2 rad/s: 1.43 s, 359 ticks of 4 ms


def test_a_target_of_another_joint_count_is_held_never_broadcast():
    gate, c = _gate()
    gate.last_q_rad, gate.last_t_ns = np.array([0.3, -0.3]), T
    for bad in (np.array([0.9]), np.zeros(3), np.zeros((2, 1))):
        np.testing.assert_array_equal(gate.admit(bad, T + 4 * MS, None, 0.004, c), [0.3, -0.3])
        assert gate.held
    assert c.joints_refused == 3


def test_a_nonfinite_target_is_replaced_by_the_reference_or_the_box_centre():
    gate, c = _gate(q_min_rad=[-1.0, -np.inf], q_max_rad=[3.0, np.inf])
    np.testing.assert_array_equal(gate.admit(np.array([np.nan, 1.0]), T, None, 0.004, c), [1.0, 0.0])
    np.testing.assert_array_equal(gate.admit(np.array([np.inf, 1.0]), T + 4 * MS, None, 0.004, c), [1.0, 0.0])


def test_the_acceleration_limit_ramps_the_speed_up_and_down():
    gate, c = _gate(q_min_rad=[-10.0], q_max_rad=[10.0], qd_max_rad_s=1.0, qdd_max_rad_s2=10.0)
    gate.last_q_rad, gate.last_t_ns = np.zeros(1), T
    speeds, q_last = [], 0.0
    for k in range(1, 21):  # a step to 5 rad: 10 ms ticks, the speed grows 0.1 rad/s per tick up to 1 rad/s
        q = gate.admit(np.array([5.0]), T + k * 10 * MS, None, 0.01, c)[0]
        speeds.append((q - q_last) / 0.01)
        q_last = q
    np.testing.assert_allclose(speeds[:10], np.arange(1, 11) * 0.1, atol=1e-9)
    np.testing.assert_allclose(speeds[10:], 1.0, atol=1e-9)
    q = gate.admit(np.array([q_last]), T + 21 * 10 * MS, None, 0.01, c)[0]  # asked to stop: brakes at 10 rad/s^2
    assert (q - q_last) / 0.01 == pytest.approx(0.9)
    assert c.clamped_acceleration == 10


@pytest.mark.parametrize("kw, match", [(dict(dt_max_s=float("inf")), "dt_max_s"), (dict(dt_max_s=0.0), "dt_max_s"),
                                       (dict(qdd_max_rad_s2=0.0), "qdd_max_rad_s2"),
                                       (dict(qdd_max_rad_s2=[1.0, 2.0, 3.0]), "qdd_max_rad_s2 has 3 entries")])
def test_limits_that_would_let_a_stall_jump_or_never_move_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        _gate(**kw)


# ---- properties ----------------------------------------------------------------------------------------------

values = st.one_of(st.floats(-10.0, 10.0), st.sampled_from([1e6, -1e6, 5.0, -5.0, 1e308, np.nan, np.inf, -np.inf]))


@st.composite
def limits(draw):
    d = draw(st.integers(1, 4))
    lo = [draw(st.floats(-4.0, 0.0, exclude_max=True)) for _ in range(d)]
    hi = [draw(st.floats(0.0, 4.0, exclude_min=True)) for _ in range(d)]
    qd = draw(st.floats(0.01, 10.0))
    qdd = draw(st.one_of(st.none(), st.floats(0.1, 1000.0)))
    return SafetyLimits(q_min_rad=lo, q_max_rad=hi, qd_max_rad_s=qd, qdd_max_rad_s2=qdd, dt_max_s=0.1)


@st.composite
def ticks(draw, d: int):
    """(target or None, measured or None, dt since the last tick in ns, which may be 0 or negative)."""
    n = draw(st.integers(1, 40))
    out = []
    for _ in range(n):
        shape = draw(st.sampled_from([d, d, d, d + 1, 1]))
        target = draw(st.one_of(st.none(), st.lists(values, min_size=shape, max_size=shape)))
        measured = draw(st.one_of(st.none(), st.lists(values, min_size=d, max_size=d)))
        dt_ns = draw(st.one_of(st.integers(-5 * MS, 50 * MS), st.sampled_from([4 * MS, 10**12])))
        out.append((target, measured, dt_ns))
    return out


@pytest.mark.background  # pure code: no real-time bound (tests/cpu_share.py)
@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_no_command_leaves_the_box_or_the_speed_limit(data):
    lim = data.draw(limits())
    lo, hi, qd = np.array(lim.q_min_rad), np.array(lim.q_max_rad), lim.qd_max_rad_s
    gate, c, period_s = LimitGate(lim), CommandCounters(), 0.004
    t, last, last_t = T, None, None
    for target, measured, dt_ns in data.draw(ticks(len(lo))):
        t += dt_ns
        q = gate.admit(None if target is None else np.array(target), t, None if measured is None else
                       np.array(measured), period_s, c)
        if q is None:
            assert last is None  # nothing to command only before the first command
            continue
        assert q.shape == lo.shape and np.all(np.isfinite(q))
        assert np.all((lo <= q) & (q <= hi))
        if last is not None:
            dt_s = min(max((t - last_t) / 1e9, 0.0), max(lim.dt_max_s, period_s))
            assert np.all(np.abs(q - last) <= qd * dt_s * (1 + 1e-12) + 1e-12)
        last, last_t = q, t


@pytest.mark.background  # pure code: no real-time bound (tests/cpu_share.py)
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_the_acceleration_limit_holds_wherever_the_box_does_not_intervene(data):
    lim = data.draw(limits())
    lim.qdd_max_rad_s2 = data.draw(st.floats(0.1, 1000.0))
    gate, c = LimitGate(lim), CommandCounters()
    gate.last_q_rad, gate.last_t_ns = np.zeros(len(lim.q_min_rad)), T
    t, v_last = T, np.zeros(len(lim.q_min_rad))
    for target, _, dt_ns in data.draw(ticks(len(lim.q_min_rad))):
        dt_ns = max(dt_ns, MS)  # a positive step of at most 50 ms (< dt_max_s): the measured dt is the step
        dt_ns = min(dt_ns, 50 * MS)
        boxed_before, ref = c.clamped_position, gate.last_q_rad
        t += dt_ns
        q = gate.admit(None if target is None else np.array(target), t, None, 0.004, c)
        v = (q - ref) / (dt_ns / 1e9)
        if c.clamped_position == boxed_before:
            assert np.all(np.abs(v - v_last) <= lim.qdd_max_rad_s2 * dt_ns / 1e9 * (1 + 1e-9) + 1e-9)
        v_last = v


# ---- through the command path and a real replay ---------------------------------------------------------------

def _chunk(t_obs_ns: int, rows, obs_seq: int, step_ns: int = 20 * MS) -> ActionChunk:
    return ActionChunk(obs_seq, obs_seq, t_obs_ns, t_obs_ns, step_ns, np.array(rows, dtype=np.float64), "full",
                       len(rows) - 1, 1, 0, 0)


def test_the_command_path_stays_in_the_box_after_an_observation_at_1e6():
    lim = SafetyLimits(q_min_rad=[-2.967] * 6, q_max_rad=[2.967] * 6, qd_max_rad_s=2.0)
    gate, c, buffer = LimitGate(lim), CommandCounters(), ChunkBuffer()
    bad = np.zeros(6)
    bad[0] = 1e6
    buffer.push(_chunk(T, [bad, bad + 0.01], 0))  # the runtime's chunk planned from it, anchored at 1e6
    outside = 0
    for n in range(287):
        t = T + n * 4 * MS
        if n == 5:  # normal traffic after it
            buffer.push(_chunk(t, [np.zeros(6), np.full(6, 0.01)], 1, step_ns=10**12))
        cmd = command(buffer, t, gate, bad if n < 5 else np.zeros(6), 0.004, c)
        outside += bool(np.any(np.abs(cmd.q_rad) > 2.967))
    assert outside == 0 and c.reference_outside_box == 1
    assert cmd.rung == "full" and cmd.q_rad[0] < 2.967  # following the normal chunk back from the box edge


@pytest.mark.slow
def test_a_replay_with_limits_the_log_leaves_commands_inside_them(tmp_path):
    # the red team's replay: --q-max-rad 1.0 3 3 3 3 3 on a log whose joint 0 passes 1 rad reported 7 commands
    # outside the limits and exited 0
    from edgeinfer.logs.arm_log import synthetic_log, write_schunk
    from edgeinfer.sim.replay import replay
    from edgeinfer.sim.run_config import ReplayConfig

    log = synthetic_log(seconds=2.0)
    log.q_rad[:, 0] += 1.0 - log.q_rad[0, 0] + 0.2  # joint 0 starts (and stays a while) outside [-3, 1]
    write_schunk(log, tmp_path / "log")
    cfg = ReplayConfig(log=tmp_path / "log", out=tmp_path / "out", fork_nodes=True)
    cfg.control.limits = SafetyLimits(q_min_rad=[-3.0] * 6, q_max_rad=[1.0, 3, 3, 3, 3, 3], qd_max_rad_s=2.0)
    report = replay(cfg, Console(quiet=True))
    safety = report["safety"]
    assert safety["commands_checked"] > 400
    assert (safety["outside_position_limits"], safety["over_velocity_limit"], safety["nonfinite"]) == (0, 0, 0)
    counters = report["node_stats"]["control"]["counters"]
    assert counters["reference_outside_box"] == 1 and counters["clamped_position"] > 0
