"""The embeddable Controller: on a real Schunk recording every tick gets a finite, limited command at once; on a
scripted buffer it commands and counts exactly as the control loop does (one command path, control/command.py)."""
import time
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import zmq

from edgeinfer.control.buffer import ChunkBuffer
from edgeinfer.control.command import CommandCounters, command
from edgeinfer.control.gate import LimitGate
from edgeinfer.control.loop import ControlConfig, ControlLoop
from edgeinfer.control.safety import SafetyLimits
from edgeinfer.core.clock import Ticker, now_ns
from edgeinfer.core.transport import Endpoints, Receiver, pull, push
from edgeinfer.core.wire import ActionChunk, Observation
from edgeinfer.logs.arm_log import read_schunk
from edgeinfer.node import controller as controller_module
from edgeinfer.node.controller import Controller, ControllerConfig
from edgeinfer.node.runtime import RuntimeConfig


def _run(log, n_ticks: int, cfg: ControllerConfig):
    """Drive the controller at the log's rate on absolute deadlines (a tick the loop overran is skipped, as on a
    robot); returns (tick numbers, commands, stats)."""
    ticks, commands = [], []
    with Controller(cfg) as ctl:
        ticker = Ticker(now_ns() + 5_000_000, log.period_ns, 200_000)
        while (n := ticker.wait()) < n_ticks:
            prev = max(0, n - 5)
            obs = Observation(n, ticker.tick_time_ns(n), log.q_rad[n], log.qd_rad_s[n], log.q_rad[prev])
            ticks.append(n)
            commands.append(ctl.step(ticker.tick_time_ns(n), obs))
        stats = ctl.stats
    return np.array(ticks), commands, stats


def test_controller_commands_every_tick_and_tracks_the_recording(schunk_dir):
    # On the real clock (the decoder thread runs in real time): the bounds hold through host stalls (two CPU
    # burners, or five 100 ms stalls: 380 ticks, 75 chunks, every tick after 100 served, RMSE 0.0005 rad).
    log = read_schunk(schunk_dir / "measurement_1")
    cfg = ControllerConfig(RuntimeConfig(warmup_chunks=10), period_ms=log.period_ns / 1e6)
    ticks, commands, stats = _run(log, 500, cfg)  # 2 s at 250 Hz
    assert stats.ticks == len(commands) >= 250  # every call got its command (a loaded machine skips some ticks)
    q = np.array([c.q_rad for c in commands])
    assert np.all(np.isfinite(q))
    assert np.all(q >= np.array(cfg.limits.q_min_rad)) and np.all(q <= np.array(cfg.limits.q_max_rad))
    # rate limit between consecutive commands, over the time between their ticks (skipped ticks included)
    dt_s = np.minimum(np.diff(ticks) * cfg.period_ms / 1e3, cfg.limits.dt_max_s)
    assert np.all(np.abs(np.diff(q, axis=0)) <= cfg.limits.qd_max_rad_s * dt_s[:, None] + 1e-12)
    assert stats.chunks >= 10 and stats.decoder_errors == 0  # one per 5 ticks asked for; a slow CPU decodes fewer
    served = np.array([c.rung != "hold" for c in commands])
    assert served[ticks >= 100].mean() > 0.5  # after the start, chunks cover most ticks (fewer on a slow CPU)
    err = q[served] - log.q_rad[ticks[served]]
    late = log.q_rad[ticks[served]] - log.q_rad[np.maximum(ticks[served] - 5, 0)]  # the recording a chunk step late
    # the policy's targets follow the recorded motion, at least twice as close as that late copy of it (measured:
    # 0.0003 rad against 0.0066; a command path sampling its chunks one chunk step late: 0.0067)
    assert np.sqrt(np.mean(err ** 2)) < 0.5 * np.sqrt(np.mean(late ** 2))
    assert sum(stats.rungs.values()) == len(commands) and stats.rungs.get("hold", 0) == stats.holds


def test_controller_rejects_an_observation_of_the_wrong_shape():
    z6 = np.zeros(6)
    with Controller(ControllerConfig(RuntimeConfig(warmup_chunks=1), warmup=False)) as ctl:
        with pytest.raises(ValueError, match=r"q_rad has shape \(3,\), the policy expects \(6,\)"):
            ctl.step(now_ns(), Observation(0, now_ns(), np.zeros(3), np.zeros(3), np.zeros(3)))
        # a (6, 1) column has 6 "joints" but would broadcast against the (6,) limits into (6, 6) commands
        with pytest.raises(ValueError, match=r"q_rad has shape \(6, 1\)"):
            ctl.step(now_ns(), Observation(0, now_ns(), np.zeros((6, 1)), z6, z6))
        with pytest.raises(ValueError, match=r"qd_rad_s has shape \(3,\)"):
            ctl.step(now_ns(), Observation(0, now_ns(), z6, np.zeros(3), z6))
        cmd = ctl.step(now_ns(), Observation(0, now_ns(), z6, z6, z6))  # the refused ones left no trace
        assert cmd is not None and cmd.q_rad.shape == (6,) and cmd.rung == "hold"


# ---- one command path: the Controller commands exactly as the control loop does ---------------------------

MS = 1_000_000
T = 5_000 * MS
STEP = 10 * MS
LIMITS = dict(q_min_rad=[-3.0, -3.0], q_max_rad=[3.0, 3.0], qd_max_rad_s=1000.0)  # only the box clamps


def _chunk(t_obs, rows, obs_seq, rung="full", step_ns=STEP):
    return ActionChunk(seq=obs_seq, obs_seq=obs_seq, t_obs_ns=t_obs, t_ready_ns=t_obs, step_ns=step_ns,
                       steps_rad=np.asarray(rows, dtype=np.float64), rung=rung, tokens=0, target_passes=0,
                       drafted=0, accepted=0)


def _obs(seq, q):
    q = np.asarray(q, dtype=np.float64)
    return Observation(seq, T, q, np.zeros(2), q.copy())


class _AnchorOnlyRuntime:
    """A two-joint policy that never plans (every chunk is its anchor, the continue rung, which no buffer keeps):
    the test alone decides what the buffer holds."""

    def __init__(self, cfg):
        # a manifest without "limits"
        self.policy = SimpleNamespace(cfg=SimpleNamespace(n_joints=2, horizon=8), manifest={})

    def chunk_timing(self, period_ns):
        return 5, period_ns * 5

    def set_budget_ms(self, budget_ms):
        self.budget_ms = budget_ms

    def step(self, obs, t_start_ns=None, step_ns=STEP, budget=True, on_first_step=None):
        return _chunk(obs.t_ns, [obs.q_rad], obs.seq, rung="continue")


@pytest.fixture
def controller(monkeypatch):
    monkeypatch.setattr(controller_module, "PolicyRuntime", _AnchorOnlyRuntime)
    cfg = ControllerConfig(limits=SafetyLimits(**LIMITS), period_ms=10.0, warmup=False, blend_ms=0.0)
    with Controller(cfg) as ctl:
        yield ctl


@pytest.fixture
def loop():
    ep = Endpoints.free_loopback()
    ctx = zmq.Context()
    rx = Receiver(pull(ctx, ep.commands, bind=True))
    loop = ControlLoop(ControlConfig(limits=SafetyLimits(**LIMITS), blend_ms=0.0), ep)
    loop.commands = push(ctx, ep.commands)
    loop.runtime_lease.alive = True  # as after the runtime's first Heartbeat
    yield loop, rx
    ctx.destroy(linger=0)


# (tick time, observation the caller has (None: none), chunk pushed before the tick); a non-finite
# observation never reaches the loop (its wire decoder refuses it), and the Controller refuses it too
SCRIPT = [
    (T - STEP, _obs(0, [np.nan, 0.0]), None),  # no state at all: nothing safe to command
    (T - STEP, _obs(1, [0.5, -0.5]), None),  # hold at the observed position
    (T - STEP // 2, _obs(2, [np.inf, 0.0]), None),  # hold at the last command, not at the refused observation
    (T + STEP // 2, None, _chunk(T, [[0.5, -0.5], [1.0, 7.5], [np.nan, 2.0]], 1)),  # interpolated, box-clamped
    (T + 2 * STEP, None, None),  # a non-finite target: replaced by the last command, counted
    (T + 3 * STEP, _obs(3, [1.0, 1.0]), None),  # past the chunk: hold the last command
]


def test_controller_commands_and_counts_like_the_control_loop(controller, loop):
    loop, rx = loop
    ctl_cmds, loop_cmds = [], []
    for n, (t, obs, new_chunk) in enumerate(SCRIPT):
        if new_chunk is not None:
            controller._push(new_chunk)
            loop.buffer.push(new_chunk)
        ctl_cmds.append(controller.step(t, obs))
        if obs is not None and np.all(np.isfinite(obs.q_rad)):
            loop.last_obs = obs
        loop._command(n, t, 0.01)
        loop_cmds.append(rx.recv(200) if n > 0 else rx.recv(50))
    assert ctl_cmds[0] is None and loop_cmds[0] is None  # no state: no command from either
    for c, lc in zip(ctl_cmds[1:], loop_cmds[1:]):
        assert (c.obs_seq, c.chunk_obs_seq, c.rung) == (lc.obs_seq, lc.chunk_obs_seq, lc.rung)
        np.testing.assert_array_equal(c.q_rad, lc.q_rad)
    assert [c.rung for c in ctl_cmds[1:]] == ["hold", "hold", "full", "full", "hold"]
    np.testing.assert_array_equal(ctl_cmds[2].q_rad, [0.5, -0.5])  # the last command, not inf
    np.testing.assert_allclose(ctl_cmds[3].q_rad, [0.75, 3.0])
    np.testing.assert_allclose(ctl_cmds[4].q_rad, [0.75, 3.0])  # the NaN target never leaves
    shared = ("ticks", "holds", "no_state", "clamped", "nonfinite_targets", "rungs")
    assert {k: getattr(controller.stats, k) for k in shared} == {k: getattr(loop.stats, k) for k in shared}
    assert (controller.stats.no_state, controller.stats.nonfinite_targets, controller.stats.clamped) == (1, 1, 2)
    assert controller.stats.obs_nonfinite == 2


def test_controller_holds_at_the_last_finite_observation_when_nothing_else_is_available(controller):
    assert controller.step(T, _obs(0, [np.nan, 0.0])) is None  # nothing safe to hold at yet
    assert controller.step(T, None) is None
    cmd = controller.step(T, _obs(1, [0.25, 0.5]))
    assert (cmd.rung, cmd.obs_seq) == ("hold", 1)
    np.testing.assert_array_equal(cmd.q_rad, [0.25, 0.5])
    assert (controller.stats.no_state, controller.stats.holds, controller.stats.ticks) == (2, 1, 1)


# ---- the caller's real rate: replanning and the clamp go by time; the rate is measured, and warned about -----

V = 0.5  # rad/s: every joint of the ramp policy and of its "arm"


class _RampRuntime(_AnchorOnlyRuntime):
    """A two-joint policy that decodes at once: every joint moving at V rad/s from the observed position, for
    H = 8 chunk steps of step_ns (replanning every 5 ticks; a chunk step of 5 ticks, 20 ms at 4 ms). Records when
    each observation it planned from was taken."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.t_obs = []

    def step(self, obs, t_start_ns=None, step_ns=STEP, budget=True, on_first_step=None):
        self.t_obs.append(obs.t_ns)
        rows = obs.q_rad + V * np.arange(9)[:, None] * step_ns / 1e9
        return _chunk(obs.t_ns, rows, obs.seq, step_ns=step_ns)


class _Clock:
    t_ns = T

    def __call__(self):
        return self.t_ns


@pytest.fixture
def ramp(monkeypatch):
    """A Controller configured for 4 ms (250 Hz) on a fake clock, following the ramp policy; the speed limit
    (1 rad/s) allows the ramp (V) only over the real time between calls, not over one 4 ms period."""
    monkeypatch.setattr(controller_module, "PolicyRuntime", _RampRuntime)
    cfg = ControllerConfig(limits=SafetyLimits(q_min_rad=[-3.0] * 2, q_max_rad=[3.0] * 2, qd_max_rad_s=1.0),
                           period_ms=4.0, warmup=False, blend_ms=0.0)
    clock = _Clock()
    with Controller(cfg, clock=clock) as ctl:
        yield ctl, clock


def _drive(ctl, clock, times_ns):
    """Call step at each time (fake clock) with the arm's position on the ramp; after each call, wait until the
    decoder has turned every observation it was handed into a chunk (it decodes at once)."""
    commands = []
    for t in times_ns:
        clock.t_ns = t
        q = np.full(2, V * (t - T) / 1e9)
        commands.append(ctl.step(t, Observation(len(commands), t, q, np.full(2, V), q)))
        deadline = time.monotonic() + 5
        while ctl.stats.chunks + ctl.stats.obs_dropped < ctl.stats.replans and time.monotonic() < deadline:
            time.sleep(1e-4)
    return commands


def test_controller_called_slower_than_configured_replans_by_time_and_clamps_over_the_measured_dt(ramp):
    ctl, clock = ramp
    times = [T + n * 40 * MS for n in range(60)]  # called every 40 ms (25 Hz), configured for 4 ms
    with warnings.catch_warnings(record=True):
        commands = _drive(ctl, clock, times)
    # one replan per chunk step (20 ms) of time: every call, as each is 40 ms after the last (not every 5 calls)
    assert ctl.runtime.t_obs == times and ctl.stats.replans == ctl.stats.chunks == 60
    # no holds while a chunk covers the time: only the first call may come before the first chunk
    assert [c.rung for c in commands[1:]] == ["full"] * 59 and ctl.stats.holds <= 1
    # clamped over the measured 40 ms (0.04 rad at 1 rad/s), not over 4 ms (0.004 rad): the arm is not held back
    assert ctl.stats.clamped == 0 and ctl.stats.dt_capped == ctl.stats.dt_nonpositive == 0
    np.testing.assert_allclose([c.q_rad for c in commands[1:]], [[V * (t - T) / 1e9] * 2 for t in times[1:]],
                               atol=1e-12)


def test_controller_measures_the_callers_rate_and_jitter_and_warns_once_per_departure(ramp):
    ctl, clock = ramp
    slow = [T + n * 40 * MS + (n % 2) * 5 * MS for n in range(60)]  # 45, 35, 45, ... ms: 25 Hz, jitter 5 ms
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # the controller rate-limits its warnings, not Python's filters
        _drive(ctl, clock, slow)
        assert ctl.stats.rate_hz == pytest.approx(25.0) and ctl.stats.jitter_ms == pytest.approx(5.0)
        assert len(caught) == 1 and ctl.stats.rate_departures == 1  # once, not once per call
        assert issubclass(caught[0].category, RuntimeWarning)
        assert "25.0 Hz (jitter 5.0 ms), not at the 250.0 Hz of ControllerConfig.period_ms=4.0" in \
            str(caught[0].message)
        fast = [slow[-1] + (n + 1) * 4 * MS for n in range(40)]  # back at the configured 250 Hz
        _drive(ctl, clock, fast)
        assert ctl.stats.rate_hz == pytest.approx(250.0) and ctl.stats.jitter_ms == pytest.approx(0.0)
        _drive(ctl, clock, [fast[-1] + (n + 1) * 40 * MS for n in range(40)])  # slow again, < 10 s later
        assert ctl.stats.rate_departures == 2 and len(caught) == 1  # counted, but not warned again so soon


def test_controller_called_faster_than_configured_replans_once_per_chunk_step(ramp):
    ctl, clock = ramp
    times = [T + n * MS for n in range(100)]  # every 1 ms (1 kHz), configured for 4 ms
    with warnings.catch_warnings(record=True):
        commands = _drive(ctl, clock, times)
    assert ctl.runtime.t_obs == [T + k * 20 * MS for k in range(5)]  # every 20 ms, not every 5 calls (5 ms)
    assert ctl.stats.replans == 5 and ctl.stats.rate_hz == pytest.approx(1000.0) and ctl.stats.rate_departures == 1
    assert ctl.stats.clamped == 0 and all(c.rung == "full" for c in commands[1:])


def test_the_command_path_clamps_over_the_measured_dt_capped_after_a_stall():
    limits = SafetyLimits(q_min_rad=[-3.0], q_max_rad=[3.0], qd_max_rad_s=1.0, dt_max_s=0.1)
    buffer = ChunkBuffer()
    buffer.push(_chunk(T, [[2.0], [2.0]], 1, step_ns=100_000 * MS))  # wants 2 rad from T on
    counters, zero = CommandCounters(), np.zeros(1)

    def q_at(t_ns, last_t_ns):
        gate = LimitGate(limits)
        gate.last_q_rad, gate.last_t_ns = (zero, last_t_ns) if last_t_ns is not None else (None, None)
        return command(buffer, t_ns, gate, zero, 0.004, counters).q_rad[0]

    assert q_at(T + 50 * MS, T) == pytest.approx(0.05)  # 50 ms measured: 0.05 rad at 1 rad/s
    assert q_at(T + 50 * MS, None) == pytest.approx(0.004)  # the first command: one configured period
    assert q_at(T + 5_000 * MS, T) == pytest.approx(0.1)  # a 5 s stall moves as far as dt_max_s allows
    assert q_at(T, T) == 0.0  # a tick that is not after the last: no motion
    assert (counters.dt_capped, counters.dt_nonpositive, counters.clamped) == (1, 1, 4)


def test_the_control_loop_clamps_over_the_ticks_since_its_last_command(loop):
    loop, rx = loop
    loop.cfg.limits.qd_max_rad_s = 1.0  # 0.01 rad per 10 ms tick
    loop.buffer.push(_chunk(T, [[2.0, 0.0], [2.0, 0.0]], 1, step_ns=100_000 * MS))  # wants 2 rad from T on
    loop.last_obs = _obs(0, [0.0, 0.0])
    loop._command(0, T, 0.01)  # the first command: one period from the measured position
    np.testing.assert_allclose(rx.recv(200).q_rad, [0.01, 0.0])
    loop._command(3, T + 30 * MS, 0.01)  # ticks 1 and 2 were overrun and skipped: 30 ms since the last command
    np.testing.assert_allclose(rx.recv(200).q_rad, [0.04, 0.0])  # not 0.02: a late loop is not held back
    assert loop.stats.clamped == 2


def test_a_bad_or_stepped_back_time_never_poisons_the_commands(monkeypatch):
    """A NaN t_ns is refused (it would make every later command NaN); a numpy integer is taken as the int it holds;
    a caller's clock that steps back restarts the replan deadlines from there (counted, warned once) instead of
    holding until time catches up."""
    import warnings

    from edgeinfer.node.controller import Controller, ControllerConfig

    ctl = Controller(ControllerConfig())
    with pytest.raises(ValueError, match="t_ns"):
        ctl.step(float("nan"), None)
    ctl.replan_ns = 20_000_000  # set by open(); the deadline bookkeeping alone here, no decoder
    ctl._replan_time(int(np.uint64(10**12)))
    assert ctl._replan_time(int(ctl._next_replan_ns)) is True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        back = ctl._next_replan_ns - 10**9  # one second back
        assert ctl._replan_time(back) is True and ctl.stats.clock_steps_back == 1
        ctl._replan_time(back - 10**9)
    assert ctl.stats.clock_steps_back == 2 and sum("went back" in str(w.message) for w in caught) == 1
