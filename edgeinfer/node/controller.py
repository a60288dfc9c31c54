"""The embeddable controller: the runtime and the control logic inside a robot controller's own process.

No sockets and no second process: the arm controller calls `Controller.step(t_ns, observation)` at its own
rate and gets a JointCommand back at once. Decoding runs on a worker thread with the same runtime and
deadline planner as `edgeinfer serve` (its budget runs from the observation's time), so a tick never waits
for the policy:

    step(t_ns, obs)   measure the caller's rate and jitter on the clock (control/rate.py); warn once when it is
                      more than rate_tolerance off period_ms (rate_departures)
                      -> t_ns against this host's clock (ClockMap): the offset obs.t_ns is mapped with, and the
                         measured drift (warned once beyond clock_rate_tolerance: clock_drifts)
                      -> when a replan is due by time (every replan_every_ticks configured periods: one chunk
                         step, on absolute deadlines), hand obs to the decoder with the time between chunk starts
                         as its budget (latest-only: an observation still waiting when a newer one arrives is
                         dropped and counted)
                      -> control/command.py, the control loop's own command path: the newest chunk that covers
                         t_ns, interpolated, or a hold at the last command (else the last finite observation);
                         clamped to the safety limits from the last command, over the measured time since it
                      -> JointCommand (None before there is any state to command: no_state)

The caller's real rate may differ from period_ms (a LeRobot loop at 12-30 Hz). period_ms is the policy's control
period (its chunk step is stride_ticks of it), not the caller's: the plan keeps its real timing, and replanning, each
chunk's budget and the clamp follow the measured time. At 25 Hz a chunk starts at every call, and its budget is the
measured time between calls (not the 20 ms chunk step), so the chunk in use is the one decoded since the last call;
every rung covers the whole horizon (edgeinfer/node/runtime.py), so a chunk cut by its budget has not expired by the
next call. Only the stats and one warning show the rate.

An observation with a NaN or inf in it is refused, as the control loop's wire decoder refuses it (obs_nonfinite):
it is neither decoded nor held at.

Times: t_ns and the observation's t_ns (when it was taken) are on the caller's clock, which may be the robot's own
(counting from its boot, running slow or fast: the loop paced by the robot's clock, ros2_control#2529). A chunk's
budget runs on this host's monotonic clock, from the observation's time mapped onto it (edgeinfer.core.clock.ClockMap:
the offset measured over the last 16 calls, which follows a clock that runs at another rate), so a robot's clock
never makes every chunk a late `draft`. The rate between the two clocks is measured over 2 s: beyond
clock_rate_tolerance it is warned once per departure (clock_drifts). torch and onnxruntime release the GIL while they
compute, so the caller's thread keeps its rate.
"""
from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from edgeinfer.control.buffer import ChunkBuffer
from edgeinfer.control.command import CommandCounters, command
from edgeinfer.control.gate import LimitGate
from edgeinfer.control.limits import resolve_limits
from edgeinfer.control.rate import RateMeter
from edgeinfer.control.safety import CommandConfig
from edgeinfer.core.clock import ClockMap, now_ns
from edgeinfer.core.wire import ActionChunk, JointCommand, Observation
from edgeinfer.node.runtime import PolicyRuntime, RuntimeConfig


@dataclass
class ControllerConfig(CommandConfig):
    """The embedded controller: the runtime it runs and the caller's tick; blend_ms and the safety limits
    (CommandConfig) are those of every controller."""

    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)  # the runtime run on the decoder thread
    # The policy's control period, ms: the tick it was trained at (its chunk step is stride_ticks of it: 4 ms x 5
    # for the Schunk policy at 250 Hz). The caller may call at another rate: that rate is measured and followed.
    period_ms: float = 4.0
    # Warn (once per departure) when the measured call rate is more than this fraction off 1 / period_ms.
    rate_tolerance: float = 0.2
    warmup: bool = True  # decode warm-up chunks in open(), before the first step (time to first command)
    # Warn (once per departure) when the clock of t_ns runs more than this fraction faster or slower than this
    # host's monotonic clock (measured over 2 s; crystals differ by ~5e-5). The budget follows the mapped time either
    # way; a clock this far off is a simulated or misconfigured one.
    clock_rate_tolerance: float = 1e-3

    def __post_init__(self):
        super().__post_init__()
        if not 0.1 <= self.period_ms <= 1000:
            raise ValueError(f"ControllerConfig.period_ms must be in [0.1, 1000], got {self.period_ms}")
        if not 0 < self.rate_tolerance <= 10:
            raise ValueError(f"ControllerConfig.rate_tolerance must be in (0, 10], got {self.rate_tolerance}")
        if not 0 < self.clock_rate_tolerance <= 1:
            raise ValueError(f"ControllerConfig.clock_rate_tolerance must be in (0, 1], got "
                             f"{self.clock_rate_tolerance}")


@dataclass
class ControllerStats(CommandCounters):
    """Counters since open(): the command path's, shared with the control loop (control/command.py: ticks,
    holds, no_state, clamped, nonfinite_targets, dt_capped, dt_nonpositive, rungs), then the controller's own; and
    the caller's measured rate."""

    replans: int = 0  # observations handed to the decoder (one per chunk step of time, at most)
    chunks: int = 0  # chunks decoded into the buffer
    obs_dropped: int = 0  # observations a newer one replaced before the decoder was free
    obs_nonfinite: int = 0  # observations refused for a NaN or inf
    decoder_errors: int = 0
    rate_hz: float = 0.0  # the caller's measured call rate, over its last 32 intervals (control/rate.py)
    jitter_ms: float = 0.0  # standard deviation of those intervals, ms
    rate_departures: int = 0  # times that rate left period_ms's rate by more than rate_tolerance (warned)
    clock_steps_back: int = 0  # calls whose t_ns went back: replan deadlines restart from it (warned once)
    clock_offset_ms: float = 0.0  # this host's clock minus the caller's (t_ns), as mapped (ClockMap), ms
    clock_drift_ppm: float = 0.0  # the caller's clock's measured rate against this host's, minus 1, ppm (0: unmeasured)
    clock_drifts: int = 0  # times that drift left clock_rate_tolerance (warned)


class Controller:
    """Lifecycle: open() -> step() per tick -> close(); or a context manager. Not thread-safe: one caller.

    clock: this host's monotonic clock (ns), the decoder's budget's (edgeinfer.core.clock.now_ns): the caller's rate
    is measured on it, the caller's times are mapped onto it, and commands are stamped with it (tests inject a fake
    one)."""

    def __init__(self, cfg: ControllerConfig | None = None, clock: Callable[[], int] = now_ns):
        self.cfg, self.clock = cfg or ControllerConfig(), clock
        self.stats = ControllerStats()
        self.buffer = ChunkBuffer(blend_ns=int(self.cfg.blend_ms * 1e6))
        self.period_ns = int(self.cfg.period_ms * 1e6)
        self.rate = RateMeter(self.period_ns, self.cfg.rate_tolerance)
        self.gate: LimitGate | None = None  # the last command and every command's limit check (set by open())
        self.last_obs: Observation | None = None  # the newest finite observation
        self.last_error: str | None = None
        self.limit_sources: dict[str, str] | None = None  # field -> where its limits came from (set by open())
        self._ticks = 0
        self._next_replan_ns: int | None = None  # None: the first finite observation is planned from
        self._prev_t_ns: int | None = None  # the last call's t_ns (a clock that steps back is counted)
        self._replan_due = True
        # the observation, its budget's start on this host's clock and the budget, ms
        self._pending: tuple[Observation, int, float] | None = None
        self.clock_map = ClockMap()  # t_ns -> this host's clock
        self._drifting = False
        self._wake = threading.Condition()
        self._closing = False

    def open(self) -> "Controller":
        self.runtime = PolicyRuntime(self.cfg.runtime)
        self._resolve_limits()
        if self.cfg.warmup:
            self.runtime.warmup(self.runtime.warmup_observation())
        replan_every, self.step_ns = self.runtime.chunk_timing(self.period_ns)
        self.replan_ns = replan_every * self.period_ns  # replanning goes by time, whatever the caller's rate
        self.budget_ms = self.cfg.runtime.scheduler.resolved_budget_ms(replan_every, self.period_ns)
        self.runtime.set_budget_ms(self.budget_ms)
        self._worker = threading.Thread(target=self._decode_loop, name="edgeinfer-decoder", daemon=True)
        self._worker.start()
        return self

    def _resolve_limits(self) -> None:
        """cfg.limits's unset fields from its URDF, the policy manifest's "limits", else the defaults
        (control/limits.py); their sources in self.limit_sources. Raises ValueError (JointCountError naming both
        counts) when they do not have the policy's joint count, or cannot be resolved."""
        manifest, where = self.runtime.policy.manifest, str(self.cfg.runtime.policy)
        resolved = resolve_limits(self.cfg.limits, (manifest.get("data") or {}).get("joint_names"),
                                  f"the policy {where}", manifest.get("limits"), where,
                                  counts={"the policy": (self.runtime.policy.cfg.n_joints, f"{where} config.n_joints")})
        for warning in resolved.warnings:
            warnings.warn(f"Controller limits: {warning}", RuntimeWarning, stacklevel=3)
        self.cfg.limits, self.limit_sources = resolved.limits, resolved.sources
        self.gate = LimitGate(self.cfg.limits)

    def step(self, t_ns: int, obs: Observation | None) -> JointCommand | None:
        """The command for the tick at t_ns (monotonic ns) given the newest observation `obs` (q_rad (D,)
        float64 rad; None: no new one this tick). Returns at once; never raises for a late or failing policy (it
        holds instead). Returns None when there is nothing safe to command yet (no chunk, no command and no
        finite observation so far; counted in no_state). Raises ValueError when q_rad, qd_rad_s or q_prev_rad is
        not a (D,) array for the policy's D joints (a (D, 1) column would broadcast into every later command),
        or when t_ns is not a finite number (a NaN time would make every later command NaN)."""
        if not np.isfinite(t_ns):
            raise ValueError(f"Controller.step: t_ns must be a finite monotonic time in ns, got {t_ns!r}")
        t_ns = int(t_ns)  # a numpy integer (uint64 wraps on subtraction) or a float, as the int it holds
        if obs is not None:
            d = self.runtime.policy.cfg.n_joints
            for name in ("q_rad", "qd_rad_s", "q_prev_rad"):
                if np.shape(getattr(obs, name)) != (d,):
                    raise ValueError(f"Controller.step: observation {name} has shape {np.shape(getattr(obs, name))}, "
                                     f"the policy expects ({d},)")
        t_host = self.clock()
        self._measure_rate(t_host)
        fresh = obs is not None and self._accept(obs)
        self._replan_due |= self._replan_time(t_ns)
        self._map_clock(t_ns, t_host)
        if fresh and self._replan_due:  # a refused observation is not planned from: the next finite one is
            self._replan_due = False
            self.stats.replans += 1
            with self._wake:
                self.stats.obs_dropped += self._pending is not None
                self._pending = obs, self.clock_map.host_ns(obs.t_ns), self._chunk_budget_ms()
                self._wake.notify()
        n, self._ticks = self._ticks, self._ticks + 1
        measured = self.last_obs.q_rad if self.last_obs is not None else None
        with self._wake:  # the decoder thread pushes into the buffer
            cmd = command(self.buffer, t_ns, self.gate, measured, self.period_ns / 1e9, self.stats)
        if cmd is None:
            return None
        obs_seq = self.last_obs.seq if self.last_obs is not None else -1
        return JointCommand(n, obs_seq, cmd.chunk_obs_seq, self.clock(), cmd.q_rad, cmd.rung)

    def _measure_rate(self, t_host: int) -> None:
        """The caller's rate and jitter into the stats; one warning when it departs from period_ms."""
        report = self.rate.tick(t_host)
        st, r = self.stats, self.rate
        st.rate_hz, st.jitter_ms, st.rate_departures = r.rate_hz, r.jitter_ms, r.departures
        if report:
            warnings.warn(f"Controller.step is called at {r.rate_hz:.1f} Hz (jitter {r.jitter_ms:.1f} ms), not at "
                          f"the {r.rate_cfg_hz:.1f} Hz of ControllerConfig.period_ms={self.cfg.period_ms}: "
                          "replanning, the chunk budget and the clamp follow the measured rate. Leave period_ms "
                          "at the policy's own period (its chunk step is stride_ticks of it; the loop's period "
                          "would stretch the plan in time)", RuntimeWarning, stacklevel=3)

    def _chunk_budget_ms(self) -> float:
        """The budget of a chunk started now, ms: the time between two chunk starts. Once a replan comes at every
        call (a caller slower than the chunk step), that is the measured call interval, not replan_every_ticks
        periods; an explicit SchedulerConfig.budget_ms is kept as set. Capped at the chunk's horizon: a budget
        longer than that would plan a chunk expired on arrival."""
        if self.cfg.runtime.scheduler.budget_ms is not None or not self.rate.rate_hz > 0:
            return self.budget_ms
        horizon_ms = self.runtime.policy.cfg.horizon * self.step_ns / 1e6
        return min(max(self.budget_ms, 1e3 / self.rate.rate_hz), horizon_ms)

    def _replan_time(self, t_ns: int) -> bool:
        """True when a replan is due at t_ns: every replan_ns on absolute deadlines from the first; deadlines the
        caller's ticks passed over are skipped, never caught up."""
        if self._next_replan_ns is None:
            self._next_replan_ns = t_ns
        if self._prev_t_ns is not None and t_ns < self._prev_t_ns:  # the caller's clock stepped back
            self.stats.clock_steps_back += 1
            if self.stats.clock_steps_back == 1:
                warnings.warn(f"Controller: t_ns went back {(self._prev_t_ns - t_ns) / 1e6:.1f} ms; replanning "
                              "from there (pass a monotonic clock: time.monotonic_ns())", RuntimeWarning, stacklevel=3)
            self._next_replan_ns = t_ns
            self.clock_map.reset()  # its times before the step map nothing after it
        self._prev_t_ns = t_ns
        if t_ns < self._next_replan_ns:
            return False
        self._next_replan_ns += ((t_ns - self._next_replan_ns) // self.replan_ns + 1) * self.replan_ns
        return True

    def _map_clock(self, t_ns: int, t_host: int) -> None:
        """One pair of the caller's clock and this host's into the map; the drift check (one warning and a count per
        departure beyond clock_rate_tolerance)."""
        m, st = self.clock_map, self.stats
        m.sample(t_ns, t_host)
        st.clock_offset_ms, st.clock_drift_ppm = m.offset_ns / 1e6, m.drift * 1e6
        drifting = m.measured and abs(m.drift) > self.cfg.clock_rate_tolerance
        if drifting and not self._drifting:
            st.clock_drifts += 1
            warnings.warn(f"Controller: the clock of t_ns runs {m.drift * 1e6:+.0f} ppm from this host's monotonic "
                          f"clock, beyond ControllerConfig.clock_rate_tolerance={self.cfg.clock_rate_tolerance}: "
                          "chunk budgets follow t_ns mapped onto this host's clock, but a robot clock this far off is "
                          "simulated or misconfigured", RuntimeWarning, stacklevel=3)
        self._drifting = drifting

    def _accept(self, obs: Observation) -> bool:
        """Keep obs as the newest observation unless a value in it is non-finite (the wire refuses those)."""
        if not all(np.all(np.isfinite(a)) for a in (obs.q_rad, obs.qd_rad_s, obs.q_prev_rad)):
            self.stats.obs_nonfinite += 1
            return False
        self.last_obs = obs
        return True

    def _decode_loop(self) -> None:
        while True:
            with self._wake:
                while self._pending is None and not self._closing:
                    self._wake.wait()
                if self._closing:
                    return
                (obs, t_start_ns, budget_ms), self._pending = self._pending, None
            try:
                self.runtime.set_budget_ms(budget_ms)
                # the first verified step goes into the buffer at once, the rest of the chunk replaces it
                chunk = self.runtime.step(obs, t_start_ns, self.step_ns, on_first_step=self._push)
            except Exception as e:  # a failing policy must not stop the arm's controller: it holds, and says why
                self.stats.decoder_errors += 1
                self.last_error = f"{type(e).__name__}: {e}"
                continue
            self.stats.chunks += self._push(chunk)

    def _push(self, chunk: ActionChunk) -> bool:
        with self._wake:
            return self.buffer.push(chunk)

    def close(self) -> None:
        with self._wake:
            self._closing = True
            self._wake.notify()
        if hasattr(self, "_worker"):
            self._worker.join(timeout=5)

    def __enter__(self) -> "Controller":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()
