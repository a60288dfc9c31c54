"""The control loop node: fixed rate on absolute deadlines, chunk buffer -> interpolate -> clamp -> command.

Each tick n runs at t0 + n * period + phase (t0 and period come from the Start message, on the host's
shared monotonic clock). Per tick it takes every pending chunk and the newest observation, interpolates
the newest chunk that covers the tick, clamps it to the safety limits and sends a JointCommand. When no
chunk covers the tick the watchdog holds the last command (rung "hold"): the robot always gets a command.

The runtime's liveliness (edgeinfer.core.liveliness): it is dead from the moment its connection drops (socket
monitor) or its Heartbeat lease expires, and the loop holds from the next tick on, its chunks forgotten.
A restarted runtime (a new process on the same endpoint) is reconnected by ZMQ and trusted again from its
first Heartbeat; no restart of this loop is needed. Chunks whose whole horizon has passed are discarded
(chunks_expired), as are chunks older than the newest (chunks_superseded); a non-finite target never
leaves (the clamp replaces it with the last command; nonfinite_targets). Heartbeats, Stats and
rate-limited ErrorEvents go out on the status PUB when Endpoints.status is set.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import zmq

from edgeinfer.control.buffer import ChunkBuffer
from edgeinfer.control.command import CommandCounters, command
from edgeinfer.control.safety import CommandConfig
from edgeinfer.core import transport
from edgeinfer.core.clock import Ticker, enter_realtime, now_ns
from edgeinfer.core.lifecycle import ParentWatch
from edgeinfer.core.liveliness import Lease, LinkMonitor
from edgeinfer.core.telemetry import Telemetry
from edgeinfer.core.wire import ActionChunk, Heartbeat, JointCommand, Observation, Start, Stop, WireError


@dataclass
class ControlConfig(CommandConfig):
    """The control loop node: its tick timing, real-time settings and status messages; blend_ms and the safety
    limits (CommandConfig) are those of every controller."""

    # Delay of tick n after observation n's scheduled time, ms (lets the observation arrive).
    phase_ms: float = 1.0
    spin_us: float = 200.0  # busy-wait tail before each tick, us
    realtime_priority: int = 60  # SCHED_FIFO priority, best effort (0 = off), as ros2_control does
    control_cpus: list[int] | None = None  # CPUs the control loop may use (None: any)
    control_heartbeat_ms: float = 10.0  # Heartbeat period on the status PUB, ms
    control_lease_ms: float = 50.0  # liveliness lease the control loop announces, ms
    control_stats_ms: float = 200.0  # Stats period on the status PUB, ms

    def __post_init__(self):
        super().__post_init__()
        if not 0 < self.control_heartbeat_ms < self.control_lease_ms or not self.control_stats_ms > 0:
            raise ValueError("ControlConfig: need 0 < control_heartbeat_ms < control_lease_ms and "
                             f"control_stats_ms > 0, got {self.control_heartbeat_ms}, {self.control_lease_ms}, "
                             f"{self.control_stats_ms}")
        if not 0 <= self.phase_ms < 1000 or not 0 <= self.spin_us <= 10_000:
            raise ValueError("ControlConfig.phase_ms must be in [0, 1000) and spin_us in [0, 10000]")
        if not 0 <= self.realtime_priority <= 99:
            raise ValueError(f"ControlConfig.realtime_priority must be in 0..99, got {self.realtime_priority}")


@dataclass
class ControlStats(CommandCounters):
    """The command path's counters (control/command.py: ticks, holds, no_state, clamped, nonfinite_targets,
    rungs) and the node's own."""

    observations: int = 0  # Observation messages received
    overruns: int = 0
    malformed: int = 0
    malformed_by_kind: dict = field(default_factory=dict)
    runtime_lost: int = 0  # times the runtime was declared dead (connection dropped or lease expired)
    runtime_restarts: int = 0  # Heartbeats from a new runtime process
    holds_runtime_dead: int = 0  # holds while the runtime was dead
    chunks_expired: int = 0  # chunks whose whole horizon had passed on arrival: discarded
    chunks_superseded: int = 0  # chunks older than the newest, or anchor-only (the runtime's continue rung)


class ControlLoop:
    """Lifecycle: open() -> handshake() -> run() -> close(); or use as a context manager."""

    def __init__(self, cfg: ControlConfig, endpoints: transport.Endpoints):
        self.cfg, self.endpoints = cfg, endpoints
        self.buffer = ChunkBuffer(blend_ns=int(cfg.blend_ms * 1e6))
        self.stats = ControlStats()
        self.last_q: np.ndarray | None = None
        self.last_obs: Observation | None = None
        self.telemetry = Telemetry("control", cfg.control_stats_ms)
        self.runtime = Lease("runtime", int(50e6))  # until the runtime announces its own lease
        self.status = None
        self.link = None
        self._next_beat_ns = 0
        self._beat_seq = 0
        self._start: Start | None = None

    def open(self) -> "ControlLoop":
        self.parent = ParentWatch()
        # real-time priority before the context exists, so that its I/O thread inherits it too
        self.rt_warning = enter_realtime(self.cfg.control_cpus, self.cfg.realtime_priority)
        self.ctx = zmq.Context()
        keys = self.endpoints.curve_keys()
        self.auth = transport.start_authenticator(self.ctx, keys)
        self.obs = transport.Receiver(transport.sub(self.ctx, self.endpoints.obs, curve=keys),
                                      on_error=self._wire_error)
        self.chunks = transport.Receiver(transport.sub(self.ctx, self.endpoints.chunks, curve=keys),
                                         on_error=self._wire_error)
        self.link = LinkMonitor(self.chunks.sock)
        self.commands = transport.push(self.ctx, self.endpoints.commands, curve=keys)
        self.ready = transport.push(self.ctx, self.endpoints.ready, curve=keys)
        if self.endpoints.status:
            self.status = transport.pub(self.ctx, self.endpoints.status, bind=True, curve=keys)
        return self

    def _wire_error(self, e: WireError) -> None:
        self._report(e.kind, str(e))

    def _report(self, kind: str, text: str) -> None:
        """Count an error and publish it as a rate-limited ErrorEvent on the status PUB."""
        event = self.telemetry.error(kind, text)
        if event is not None and self.status is not None:
            transport.send(self.status, event)

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
        self._start = start
        while (n := ticker.wait()) < start.n_ticks:
            t_tick = start.t0_ns + n * start.period_ns
            if not self._take_messages(t_tick):
                break
            if n % 250 == 0 and self.parent.parent_gone():
                print("control: parent process exited; stopping", flush=True)
                break
            self._command(n, t_tick, period_s)
            self._publish_status()
        self.stats.overruns = ticker.overruns
        self._take_messages(now_ns())  # count what arrived for the last tick
        self._refresh_stats()
        if self.status is not None:  # the final Stats, for the replayer's report
            transport.send(self.status, self.telemetry.snapshot())
            self.status.close(linger=200)  # LINGER 0 elsewhere: give that last message a moment to leave
            self.status = None
        return self.stats

    def _take_messages(self, t_tick_ns: int) -> bool:
        """Absorb pending chunks and observations, and the runtime's liveliness; False when the run was stopped."""
        t = now_ns()
        if self.link is not None and self.link.poll()[1]:  # its connection dropped: the process is gone
            self._runtime_lost(t, "connection dropped")
        for msg in self.chunks.drain():
            if isinstance(msg, ActionChunk):
                if not self.runtime.alive:  # sent before it was declared dead, or before its re-handshake
                    self.stats.chunks_superseded += 1
                elif msg.t_obs_ns + (len(msg.steps_rad) - 1) * msg.step_ns < t_tick_ns:
                    self.stats.chunks_expired += 1  # its whole horizon has passed: nothing in it is still due
                elif not self.buffer.push(msg):
                    self.stats.chunks_superseded += 1
            elif isinstance(msg, Heartbeat):
                was = (self.runtime.alive, self.runtime.restarts)
                self.runtime.beat(msg, t)
                if self.runtime.restarts != was[1]:  # a new process: nothing the old one planned is trusted
                    self.buffer.clear()
                if (self.runtime.alive, self.runtime.restarts) != was:
                    print(f"control: runtime {msg.instance} alive", flush=True)
        if self.runtime.alive and not self.runtime.check(t):
            self._runtime_lost(t, f"no heartbeat for {self.runtime.lease_ns / 1e6:.0f} ms (lease expired)")
        for msg in self.obs.drain():
            if isinstance(msg, Observation):
                self.last_obs = msg
                self.stats.observations += 1
            elif isinstance(msg, Stop):
                return False
        return True

    def _runtime_lost(self, t_ns: int, why: str) -> None:
        if self.runtime.alive:
            self.runtime.drop(t_ns)
            # nothing a dead runtime planned is trusted (a Heartbeat still queued from it could revive it):
            # hold until a live one plans again
            self.buffer.clear()
            self._report("runtime_lost", f"runtime {self.runtime.instance}: {why}; holding")

    def _publish_status(self) -> None:
        """Heartbeat (and Stats when due) on the status PUB, at most once per control_heartbeat_ms."""
        t = now_ns()
        if self.status is None or t < self._next_beat_ns:
            return
        self._next_beat_ns = t + int(self.cfg.control_heartbeat_ms * 1e6)
        self._beat_seq += 1
        s = self._start
        transport.send(self.status, Heartbeat("control", os.getpid(), self._beat_seq, t,
                                              int(self.cfg.control_lease_ms * 1e6),
                                              self.runtime.instance if self.runtime.alive else -1,
                                              s.t0_ns if s else -1, s.period_ns if s else -1, s.n_ticks if s else -1))
        if self.telemetry.stats_due(t):
            self._refresh_stats()
            transport.send(self.status, self.telemetry.snapshot())

    def _refresh_stats(self) -> None:
        st = self.stats
        st.malformed = self.obs.malformed + self.chunks.malformed
        st.malformed_by_kind = dict(self.obs.malformed_by_kind + self.chunks.malformed_by_kind)
        st.runtime_lost, st.runtime_restarts = self.runtime.lost, self.runtime.restarts
        counters = {k: v for k, v in vars(st).items() if isinstance(v, int)}
        counters.update({f"malformed.{k}": v for k, v in st.malformed_by_kind.items()})
        self.telemetry.counters.update(counters)

    def _command(self, n: int, t_tick_ns: int, period_s: float) -> None:
        # a dead runtime's chunks are not trusted: hold (control/command.py: the path the Controller shares)
        cmd = command(self.buffer if self.runtime.alive else None, t_tick_ns, self.last_q,
                      self.last_obs.q_rad if self.last_obs is not None else None, self.cfg.limits, period_s,
                      self.stats)
        if cmd is None:
            return  # no state at all yet: nothing safe to command; the replayer counts it lost
        self.stats.holds_runtime_dead += cmd.rung == "hold" and not self.runtime.alive
        self.last_q = cmd.q_rad
        obs_seq = self.last_obs.seq if self.last_obs is not None else -1
        t_send = now_ns()
        transport.send(self.commands, JointCommand(n, obs_seq, cmd.chunk_obs_seq, t_send, cmd.q_rad, cmd.rung))
        self.telemetry.observe_ns("tick_lateness", t_send - t_tick_ns)

    def close(self) -> None:
        if self.link is not None:
            self.link.close()
        if getattr(self, "auth", None) is not None:
            self.auth.stop()
        self.ctx.destroy(linger=0)

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()
