"""The control loop node: fixed rate on absolute deadlines, chunk buffer -> interpolate -> clamp -> command.

Each tick n runs at t0 + n * period + phase (t0 and period come from the Start message, on the host's
shared monotonic clock). Per tick it takes every pending chunk and the newest observation, interpolates
the newest chunk that covers the tick, clamps it to the safety limits and sends a JointCommand. When no
chunk covers the tick the watchdog holds the last command (rung "hold"): the robot always gets a command.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import zmq
from edgeinfer.control.buffer import ChunkBuffer
from edgeinfer.control.safety import SafetyLimits

from edgeinfer import transport
from edgeinfer.clock import Ticker, enter_realtime, now_ns
from edgeinfer.lifecycle import ParentWatch
from edgeinfer.wire import ActionChunk, JointCommand, Observation, Start, Stop


@dataclass
class ControlConfig:
    """phase_ms: delay of tick n after observation n's scheduled time (lets the observation arrive).
    spin_us: busy-wait tail before each tick."""

    phase_ms: float = 1.0
    spin_us: float = 200.0
    realtime_priority: int = 60  # SCHED_FIFO priority, best effort (0 = off), as ros2_control does
    control_cpus: list[int] | None = None  # CPUs the control loop may use (None: any)
    limits: SafetyLimits = field(default_factory=SafetyLimits)

    def __post_init__(self):
        if not 0 <= self.phase_ms < 1000 or not 0 <= self.spin_us <= 10_000:
            raise ValueError("ControlConfig.phase_ms must be in [0, 1000) and spin_us in [0, 10000]")
        if not 0 <= self.realtime_priority <= 99:
            raise ValueError(f"ControlConfig.realtime_priority must be in 0..99, got {self.realtime_priority}")


@dataclass
class ControlStats:
    ticks: int = 0
    holds: int = 0
    clamped: int = 0
    overruns: int = 0
    malformed: int = 0


class ControlLoop:
    """Lifecycle: open() -> handshake() -> run() -> close(); or use as a context manager."""

    def __init__(self, cfg: ControlConfig, endpoints: transport.Endpoints):
        self.cfg, self.endpoints = cfg, endpoints
        self.buffer = ChunkBuffer()
        self.stats = ControlStats()
        self.last_q: np.ndarray | None = None
        self.last_obs: Observation | None = None

    def open(self) -> "ControlLoop":
        self.parent = ParentWatch()
        # real-time priority before the context exists, so that its I/O thread inherits it too
        self.rt_warning = enter_realtime(self.cfg.control_cpus, self.cfg.realtime_priority)
        self.ctx = zmq.Context()
        self.obs = transport.Receiver(transport.sub(self.ctx, self.endpoints.obs))
        self.chunks = transport.Receiver(transport.sub(self.ctx, self.endpoints.chunks))
        self.commands = transport.push(self.ctx, self.endpoints.commands)
        self.ready = transport.push(self.ctx, self.endpoints.ready)
        return self

    def handshake(self, timeout_s: float = 300.0) -> Start:
        """Report ready once both SUBs hear Hellos, then wait for Start. Raises TimeoutError, or RuntimeError
        when stopped or orphaned first."""
        transport.wait_for_hello([self.obs, self.chunks], timeout_s, check=self.parent.check)
        transport.announce_ready(self.ready, "control")
        deadline = now_ns() + int(timeout_s * 1e9)
        while now_ns() < deadline:
            self.parent.check()
            msg = self.obs.recv(100)
            if isinstance(msg, Start):
                return msg
            if isinstance(msg, Stop):
                raise RuntimeError(f"stopped before start: {msg.reason}")
        raise TimeoutError("control: no Start message")

    def run(self, start: Start) -> ControlStats:
        if self.rt_warning:
            print(f"control: {self.rt_warning}", flush=True)
        ticker = Ticker(start.t0_ns + int(self.cfg.phase_ms * 1e6), start.period_ns, int(self.cfg.spin_us * 1e3))
        period_s = start.period_ns / 1e9
        while (n := ticker.wait()) < start.n_ticks:
            if not self._take_messages():
                break
            if n % 250 == 0 and self.parent.parent_gone():
                print("control: parent process exited; stopping", flush=True)
                break
            self._command(n, start.t0_ns + n * start.period_ns, period_s)
        self.stats.overruns = ticker.overruns
        self.stats.malformed = self.obs.malformed + self.chunks.malformed
        return self.stats

    def _take_messages(self) -> bool:
        """Absorb pending chunks and observations; False when the run was stopped."""
        for msg in self.chunks.drain():
            if isinstance(msg, ActionChunk):
                self.buffer.push(msg)
        for msg in self.obs.drain():
            if isinstance(msg, Observation):
                self.last_obs = msg
            elif isinstance(msg, Stop):
                return False
        return True

    def _command(self, n: int, t_tick_ns: int, period_s: float) -> None:
        sample = self.buffer.sample(t_tick_ns)
        if sample is None:  # watchdog: nothing valid covers this tick
            q, rung, chunk_seq = self.last_q, "hold", -1
            if q is None and self.last_obs is not None:
                q = self.last_obs.q_rad
            if q is None:
                return  # no state at all yet: nothing safe to command; the replayer counts it lost
            self.stats.holds += 1
        else:
            q, rung, chunk_seq = sample
        # the first command is rate-limited from the measured position, every later one from the last command
        reference = self.last_q if self.last_q is not None else (self.last_obs.q_rad if self.last_obs else None)
        q, clamped = self.cfg.limits.clamp(q, reference, period_s)
        self.stats.clamped += clamped
        self.stats.ticks += 1
        self.last_q = q
        obs_seq = self.last_obs.seq if self.last_obs is not None else -1
        transport.send(self.commands, JointCommand(n, obs_seq, chunk_seq, now_ns(), q, rung))

    def close(self) -> None:
        self.ctx.destroy(linger=0)

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()
