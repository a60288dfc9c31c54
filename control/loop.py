"""The control loop node: fixed rate on absolute deadlines, chunk buffer -> interpolate -> clamp -> command.

Each tick n runs at t0 + n * period + phase (t0 and period come from the Start message, on the host's
shared monotonic clock). Per tick it takes every pending chunk and the newest observation, interpolates
the newest chunk that covers the tick, clamps it to the safety limits and sends a JointCommand. When no
chunk covers the tick the watchdog holds the last command (rung "hold"): the robot always gets a command (one the
full commands queue refuses is counted: commands_dropped). Ticks skipped by a stall are counted (overruns), those
at the very end of the run too.

The runtime's liveliness (edgeinfer.core.liveliness): it is lost from the moment its connection drops (socket
monitor) or its Heartbeat lease expires. The lease follows the measured link (1.5 x the longest recent gap
between its Heartbeats, never shorter than the lease it announces, never longer than runtime_lease_max_periods
control periods), so a runtime that stops beating is declared lost within two periods. A lost runtime may
be only late (a stalled link: it beats again, `runtime_returned`) or dead; what the loop does meanwhile is
on_runtime_lost: "finish" follows the chunks already received while they cover the ticks, then holds;
"hold" forgets them and holds from the next tick. A restarted runtime (a new process on the same endpoint)
is reconnected by ZMQ and trusted again from its first Heartbeat, the old one's chunks forgotten; no restart
of this loop is needed. Chunks whose whole horizon has passed are discarded (chunks_expired), as are chunks
older than the newest (chunks_superseded) and chunks that cannot be a plan (chunks_implausible: anchored more
than a period plus the runtime's lease ceiling ahead of the loop's clock, as a bit flipped in an observation's
t_ns makes one, or step_ns <= 0), so that no decodable but corrupt chunk becomes the newest and turns the correct
ones away; a Heartbeat announcing a lease <= 0 is no beat (heartbeats_implausible). A non-finite target never
leaves (the clamp replaces it with the last command; nonfinite_targets). Heartbeats, Stats (live: overruns and
every counter as they happen) and ErrorEvents (every runtime loss; other kinds rate-limited) go out on the
status PUB when Endpoints.status is set; log lines are throttled per kind (edgeinfer.core.throttle).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Literal

import zmq

from edgeinfer.control.buffer import ChunkBuffer
from edgeinfer.control.command import CommandCounters, command
from edgeinfer.control.gate import LimitGate
from edgeinfer.control.limits import resolve_limits
from edgeinfer.control.safety import CommandConfig
from edgeinfer.core import transport
from edgeinfer.core.clock import Ticker, check_period_ns, enter_realtime, now_ns
from edgeinfer.core.lifecycle import ParentWatch
from edgeinfer.core.liveliness import Lease, LinkMonitor
from edgeinfer.core.logwriter import emit
from edgeinfer.core.telemetry import Telemetry
from edgeinfer.core.wire import ActionChunk, Heartbeat, JointCommand, Observation, Start, Stop, WireError

OBS_BATCH = 8  # observations read between two looks at the clock (~160 us at ~20 us each)


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
    # What the loop does once the runtime is lost (lease expired or connection dropped; it may be only late):
    # finish follows the chunks received while they cover the ticks, then holds; hold holds from the next tick.
    # A late runtime costs no hold under finish.
    on_runtime_lost: Literal["finish", "hold"] = "finish"
    # Longest lease granted the runtime, in control periods, so that one that stops beating is lost within two.
    # The lease is 1.5 x the longest recent gap between its heartbeats, at least the lease it announces.
    runtime_lease_max_periods: float = 1.75
    # Time a tick spends reading observations at most, us, and at most a quarter period (then it commands with the
    # newest it read): a flood costs superseded observations, not ticks. Reading one costs ~20 us (a 2-core VM).
    obs_read_budget_us: float = 500.0

    def __post_init__(self):
        super().__post_init__()
        if not 0 < self.control_heartbeat_ms < self.control_lease_ms or not self.control_stats_ms > 0:
            raise ValueError("ControlConfig: need 0 < control_heartbeat_ms < control_lease_ms and "
                             f"control_stats_ms > 0, got {self.control_heartbeat_ms}, {self.control_lease_ms}, "
                             f"{self.control_stats_ms}")
        if not 0 <= self.phase_ms < 1000:
            raise ValueError(f"ControlConfig.phase_ms must be in [0, 1000), got {self.phase_ms}")
        if not 0 <= self.spin_us <= 10_000:
            raise ValueError(f"ControlConfig.spin_us must be in [0, 10000], got {self.spin_us}")
        if not self.obs_read_budget_us > 0:
            raise ValueError(f"ControlConfig.obs_read_budget_us must be > 0, got {self.obs_read_budget_us}")
        if not self.runtime_lease_max_periods > 0:
            raise ValueError("ControlConfig.runtime_lease_max_periods must be > 0, got "
                             f"{self.runtime_lease_max_periods}")
        if not 0 <= self.realtime_priority <= 99:
            raise ValueError(f"ControlConfig.realtime_priority must be in 0..99, got {self.realtime_priority}")


@dataclass
class ControlStats(CommandCounters):
    """The command path's counters (control/command.py: ticks, holds, no_state, clamped, nonfinite_targets,
    rungs) and the node's own."""

    observations: int = 0  # Observation messages received
    obs_superseded: int = 0  # observations dropped unused: a newer one was queued (latest-only)
    obs_read_capped: int = 0  # ticks that stopped reading observations at their budget, more queued: a flood
    overruns: int = 0  # ticks skipped because the loop ran a whole period or more late (live)
    commands_dropped: int = 0  # commands made but not sent: the commands queue was full (HWM), nobody reading
    links_relinked: int = 0  # observation or chunk links reconnected after a drop (a frame over 64 MiB cuts one)
    malformed: int = 0
    malformed_by_kind: dict = field(default_factory=dict)
    runtime_lost: int = 0  # times the runtime was declared lost (connection dropped or lease expired)
    runtime_expired: int = 0  # of those, by lease expiry
    runtime_returned: int = 0  # losses after which the same runtime beat again: it was late, not dead
    runtime_restarts: int = 0  # Heartbeats from a new runtime process
    holds_runtime_dead: int = 0  # holds while the runtime was lost
    commands_after_loss: int = 0  # commands from a lost runtime's chunks (on_runtime_lost = "finish")
    runtime_lease_us: int = 0  # the lease in force (derived from the measured link), us
    runtime_gap_max_us: int = 0  # longest recent gap between the runtime's Heartbeats as taken in, us
    chunks_expired: int = 0  # chunks whose whole horizon had passed on arrival: discarded
    chunks_superseded: int = 0  # chunks older than the newest, or anchor-only (the runtime's continue rung)
    chunks_implausible: int = 0  # chunks anchored implausibly far ahead of the loop's clock, or step_ns <= 0
    heartbeats_implausible: int = 0  # runtime Heartbeats announcing a lease <= 0: ignored


class ControlLoop:
    """Lifecycle: open() -> handshake() -> run() -> close(); or use as a context manager. clock: monotonic ns
    (the tick timing itself is the Ticker's, on the real clock)."""

    def __init__(self, cfg: ControlConfig, endpoints: transport.Endpoints, clock: Callable[[], int] = now_ns):
        self.cfg, self.endpoints, self.clock = cfg, endpoints, clock
        # unset limits: from its URDF, else the defaults (control/limits.py; a replay passes every value)
        resolved = resolve_limits(cfg.limits)
        cfg.limits = resolved.limits
        for warning in resolved.warnings:
            emit(f"control: limits: {warning}")
        self.buffer = ChunkBuffer(blend_ns=int(cfg.blend_ms * 1e6))
        self.stats = ControlStats()
        self.gate = LimitGate(cfg.limits)  # the last command, and every command's limit check
        self.last_obs: Observation | None = None
        self.telemetry = Telemetry("control", cfg.control_stats_ms, clock=clock, publish=self._send_status)
        self.log = self.telemetry.log
        self.runtime_lease = Lease("runtime", int(50e6))  # until the runtime announces its own lease
        self.status = None
        self.link = self.obs_link = None
        self._next_beat_ns = 0
        self._beat_seq = 0
        self._start: Start | None = None
        self._obs_budget_ns = int(cfg.obs_read_budget_us * 1e3)  # begin() caps it at a quarter period

    def open(self) -> "ControlLoop":
        self.parent = ParentWatch()
        # real-time priority before the context exists, so that its I/O thread inherits it too
        self.rt_warning = enter_realtime(self.cfg.control_cpus, self.cfg.realtime_priority)
        self.ctx = zmq.Context()
        keys = self.endpoints.curve_keys()
        self.auth = transport.start_authenticator(self.ctx, keys)
        self.obs = transport.Receiver(transport.sub(self.ctx, self.endpoints.obs, hwm=transport.LATEST_HWM,
                                                    curve=keys), on_error=self._wire_error, latest=Observation,
                                     joints=len(self.cfg.limits.q_min_rad))  # a wrong D stops at the entry
        self.chunks = transport.Receiver(transport.sub(self.ctx, self.endpoints.chunks, curve=keys),
                                         on_error=self._wire_error, joints=len(self.cfg.limits.q_min_rad))
        self.link = LinkMonitor(self.chunks.sock, self.endpoints.chunks)  # both links healed when libzmq drops one
        self.obs_link = LinkMonitor(self.obs.sock, self.endpoints.obs)
        self.commands = transport.push(self.ctx, self.endpoints.commands, curve=keys)
        self.ready = transport.push(self.ctx, self.endpoints.ready, curve=keys)
        if self.endpoints.status:
            self.status = transport.pub(self.ctx, self.endpoints.status, bind=True, curve=keys)
        return self

    def _wire_error(self, e: WireError) -> None:
        self.telemetry.report(e.kind, str(e))

    def _send_status(self, msg) -> None:
        if self.status is not None:
            transport.send(self.status, msg)

    def handshake(self, timeout_s: float = 300.0) -> Start:
        """Report ready once both SUBs hear Hellos, then wait for Start (one whose period_ns is not in (0, 10 s] is
        refused: error.start_refused, and the wait goes on). Raises TimeoutError, or RuntimeError when stopped or
        orphaned first."""
        transport.wait_for_hello([self.obs, self.chunks], timeout_s, check=self.parent.check)
        transport.announce_ready(self.ready, "control")
        deadline = now_ns() + int(timeout_s * 1e9)
        while now_ns() < deadline:
            self.parent.check()
            msg = self.obs.recv(100)
            if isinstance(msg, Start):
                try:  # a period of 0 would never tick, one of 2**62 ns never end: refused by name, not the Ticker's
                    check_period_ns(msg.period_ns, "Start.period_ns")
                    return msg
                except ValueError as e:
                    self.telemetry.report("start_refused", f"Start refused: {e}; waiting for a valid Start")
            if isinstance(msg, Stop):
                raise RuntimeError(f"stopped before start: {msg.reason}")
        raise TimeoutError("control: no Start message")

    def run(self, start: Start) -> ControlStats:
        if self.rt_warning:
            emit(f"control: {self.rt_warning}")
        # a spin of at most a quarter period: a whole one (spin_us at --time-scale 20) starves the ZMQ I/O thread
        spin_ns = min(int(self.cfg.spin_us * 1e3), start.period_ns // 4)
        ticker = Ticker(start.t0_ns + int(self.cfg.phase_ms * 1e6), start.period_ns, spin_ns)
        period_s = start.period_ns / 1e9
        self.begin(start)
        while (n := ticker.wait()) < start.n_ticks:
            if ticker.overruns != self.stats.overruns:
                self._overran(n, ticker.overruns)
            t_tick = start.t0_ns + n * start.period_ns
            if not self._take_messages(t_tick):
                break
            if n % 250 == 0 and self.parent.parent_gone():
                emit("control: parent process exited; stopping")
                break
            self._command(n, t_tick, period_s)
            self._publish_status()
        # a stall at the very end skips ticks the loop never ran again to count; those past its last tick are not its
        end = min(n, start.n_ticks)
        if (overruns := ticker.overruns - (n - end)) != self.stats.overruns:
            self._overran(end, overruns)
        self._take_messages(self.clock(), final=True)  # count what arrived for the last tick: all of it
        self._refresh_stats()
        self.log.close()
        if self.status is not None:  # the final Stats, for the replayer's report
            transport.send(self.status, self.telemetry.snapshot())
            self.status.close(linger=200)  # LINGER 0 elsewhere: give that last message a moment to leave
            self.status = None
        return self.stats

    def begin(self, start: Start) -> None:
        """The run's schedule: the runtime's lease ceiling is runtime_lease_max_periods of its period; a chunk may be
        anchored at most a period plus that ceiling ahead of the loop's clock (slack for a source that stamps an
        observation with its tick's scheduled time; on one host an observation is taken before its chunk arrives)."""
        self._start = start
        self.runtime_lease.ceiling_ns = int(self.cfg.runtime_lease_max_periods * start.period_ns)
        self.buffer.max_lead_ns = start.period_ns + self.runtime_lease.ceiling_ns
        # reading observations takes at most a quarter period: a fast loop (--time-scale 20) has 50 us
        self._obs_budget_ns = min(int(self.cfg.obs_read_budget_us * 1e3), start.period_ns // 4)

    def _overran(self, n: int, overruns: int) -> None:
        skipped, self.stats.overruns = overruns - self.stats.overruns, overruns
        self.log.line("overrun", f"overrun: {skipped} tick(s) skipped before tick {n} ({overruns} in all)")

    def _take_messages(self, t_tick_ns: int, final: bool = False) -> bool:
        """Absorb pending chunks and observations, and the runtime's liveliness; False when the run was stopped."""
        t, lease = self.clock(), self.runtime_lease
        if self.obs_link is not None and self.obs_link.poll()[1]:
            self.telemetry.report("link_relinked", f"observation link {self.endpoints.obs} dropped (a frame over "
                                  f"{transport.MAX_MESSAGE_BYTES >> 20} MiB, or its publisher restarted): reconnected")
        if self.link is not None and self.link.poll()[1] and lease.alive:  # its connection dropped: it is gone
            lease.drop(t)
            self._runtime_lost(t, "connection dropped")
        for msg in self.chunks.drain():
            if isinstance(msg, ActionChunk):
                self._take_chunk(msg, t_tick_ns)
            elif isinstance(msg, Heartbeat) and msg.sender == "runtime":
                self._runtime_beat(msg, t)
        if lease.alive and not lease.check(t):
            self._runtime_lost(t, f"no heartbeat for {(t - lease.last_ns) / 1e6:.1f} ms "
                               f"(lease {lease.lease_ns / 1e6:.1f} ms expired)")
        return self._take_observations(None if final else self._obs_budget_ns)

    def _take_observations(self, budget_ns: int | None) -> bool:
        """The newest observation (latest-only: older ones are obs_superseded), read in batches of OBS_BATCH for at
        most budget_ns on the loop's clock (None: to the end of the queue, after the last tick), so that a flood
        costs superseded observations and capped reads (obs_read_capped), never the tick. The newest is known only
        once the queue is read to its end (Receiver.recv_latest): during a flood the loop takes the newest read
        when its budget runs out. A Stop queued behind a flood is read within (LATEST_HWM + the kernel's socket
        buffers) / (messages read per tick) ticks: at 20 us a message, about 400 ticks (1.6 s at 250 Hz) with the
        queue full; the run also ends at its last tick. False when a Stop was read."""
        stop_at = self.clock() + budget_ns if budget_ns is not None else None
        while True:
            got = self.obs.recv_latest(0, OBS_BATCH)
            self.stats.observations += got.count
            if got.msg is not None:
                self.last_obs = got.msg
            if any(isinstance(m, Stop) for m in got.others):
                return False
            if got.msg is not None or not (got.count or got.others):  # read to the end of the queue
                return True
            if stop_at is not None and self.clock() >= stop_at:  # budget spent, more queued: the newest read so far
                self.stats.obs_read_capped += 1
                self.last_obs = self.obs.take_newest() or self.last_obs
                return True

    def _take_chunk(self, chunk: ActionChunk, t_tick_ns: int) -> None:
        """Into the buffer, or counted: untrusted (sent before the runtime was declared lost under "hold", or before
        its re-handshake: superseded), implausible (logged), expired (its whole horizon ended before this tick) or
        superseded. Plausibility is judged on the loop's clock now, not the tick's time: after a stall the tick
        runs late, and chunks planned meanwhile are anchored after it."""
        if not self._trusted():
            self.stats.chunks_superseded += 1
            return
        refusal = self.buffer.offer(chunk, t_tick_ns, self.clock())
        if refusal is None:
            return
        st = self.stats
        st.chunks_implausible += refusal.kind == "implausible"
        st.chunks_expired += refusal.kind == "expired"
        st.chunks_superseded += refusal.kind == "superseded"
        if refusal.kind == "implausible":
            self.telemetry.report("chunk_implausible", refusal.detail)

    def _runtime_beat(self, hb: Heartbeat, t_ns: int) -> None:
        lease = self.runtime_lease
        joined, restarts = lease.joined, lease.restarts
        gap = lease.beat(hb, t_ns)
        if gap is not None:
            self.telemetry.observe_ns("runtime_heartbeat_gap", gap)
        if lease.restarts != restarts:  # a new process: nothing the old one planned is trusted
            self.buffer.clear()
        if lease.joined != joined:  # back: it was late, not dead
            how = lease.joined_as
            self.log.line(f"runtime_{how}", f"runtime {hb.instance} {how}; lease {lease.lease_ns / 1e6:.1f} ms")
            if lease.ceiling_ns is not None and lease.announced_ns > lease.ceiling_ns:
                self.log.line("lease_over_ceiling", f"runtime {hb.instance} announces a {hb.lease_ns / 1e6:g} ms "
                              f"lease, longer than runtime_lease_max_periods ({lease.ceiling_ns / 1e6:g} ms): "
                              "a dead runtime is found later; beat it faster (--runtime-heartbeat-ms, -lease-ms)")

    def _runtime_lost(self, t_ns: int, why: str) -> None:
        """The runtime was just declared lost: an ErrorEvent every time, and on_runtime_lost applied."""
        end = self.buffer.covered_until_ns()
        if self.cfg.on_runtime_lost == "hold" or end is None:  # "hold": nothing it planned is trusted any more
            self.buffer.clear()
            then = "holding"
        else:
            then = f"following its chunks while they cover the ticks ({max(0, end - t_ns) / 1e6:.0f} ms), then holding"
        self.telemetry.report("runtime_lost", f"runtime {self.runtime_lease.instance} lost: {why}; {then}", every=True)

    def _trusted(self) -> bool:
        """Whether the runtime's chunks are followed: while it is alive, and while lost unless on_runtime_lost is
        "hold" (a new process's chunks follow its first Heartbeat, which forgets the old one's)."""
        return self.runtime_lease.alive or self.cfg.on_runtime_lost == "finish"

    def _publish_status(self) -> None:
        """Heartbeat (and Stats when due) on the status PUB, at most once per control_heartbeat_ms."""
        t = self.clock()
        if self.status is None or t < self._next_beat_ns:
            return
        self._next_beat_ns = t + int(self.cfg.control_heartbeat_ms * 1e6)
        self._beat_seq += 1
        s = self._start
        transport.send(self.status, Heartbeat("control", os.getpid(), self._beat_seq, t,
                                              int(self.cfg.control_lease_ms * 1e6),
                                              self.runtime_lease.instance if self.runtime_lease.alive else -1,
                                              s.t0_ns if s else -1, s.period_ns if s else -1, s.n_ticks if s else -1))
        if self.telemetry.stats_due(t):
            self._refresh_stats()
            transport.send(self.status, self.telemetry.snapshot())

    def _refresh_stats(self) -> None:
        st = self.stats
        st.malformed = self.obs.malformed + self.chunks.malformed
        st.obs_superseded = self.obs.stale_dropped
        st.malformed_by_kind = dict(self.obs.malformed_by_kind + self.chunks.malformed_by_kind)
        lease = self.runtime_lease
        st.runtime_lost, st.runtime_expired, st.runtime_returned = lease.lost, lease.expired, lease.returned
        st.runtime_restarts, st.runtime_lease_us, st.runtime_gap_max_us = lease.restarts, lease.lease_ns // 1000, \
            lease.gaps.max() // 1000
        st.heartbeats_implausible = lease.implausible
        st.links_relinked = sum(link.relinks for link in (self.link, self.obs_link) if link is not None)
        counters = {k: v for k, v in vars(st).items() if isinstance(v, int)}
        counters.update({f"malformed.{k}": v for k, v in st.malformed_by_kind.items()})
        self.telemetry.counters.update(counters)

    def _command(self, n: int, t_tick_ns: int, period_s: float) -> None:
        # untrusted chunks (on_runtime_lost): hold (control/command.py: the path the Controller shares)
        cmd = command(self.buffer if self._trusted() else None, t_tick_ns, self.gate,
                      self.last_obs.q_rad if self.last_obs is not None else None, period_s, self.stats)
        if cmd is None:
            return  # no state at all yet: nothing safe to command; the replayer counts it lost
        if not self.runtime_lease.alive:
            self.stats.holds_runtime_dead += cmd.rung == "hold"
            self.stats.commands_after_loss += cmd.rung != "hold"
        obs_seq = self.last_obs.seq if self.last_obs is not None else -1
        t_send = self.clock()
        sent = transport.send(self.commands, JointCommand(n, obs_seq, cmd.chunk_obs_seq, t_send, cmd.q_rad, cmd.rung))
        self.stats.commands_dropped += not sent  # the queue to the robot is full: nobody is reading
        self.telemetry.observe_ns("tick_lateness", t_send - t_tick_ns)

    def close(self) -> None:
        for link in (self.link, self.obs_link):
            if link is not None:
                link.close()
        if getattr(self, "auth", None) is not None:
            self.auth.stop()
        self.ctx.destroy(linger=0)

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()
