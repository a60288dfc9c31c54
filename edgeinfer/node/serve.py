"""The runtime node (`edgeinfer serve`): observations in, action chunks out, one loop iteration at a time.

    open()       the policy (warmed up in the handshake), the sockets, the echo; liveliness and telemetry start
    handshake()  Hellos until the Start (restarted mid-run: the replayer's schedule, then the control loop's ack)
    step()       wait for the next observation -> receive -> the newest observation -> plan (due? stale? the
                 budget's start) -> decode -> publish
    finish()     the final Stats out; close() the sockets

Beside the loop, not in it: RuntimeLiveliness (edgeinfer/node/node_liveliness.py: the Heartbeat thread, the control
loop's lease, the parent watch) and NodeTelemetry (edgeinfer/node/node_telemetry.py: counters, ErrorEvents, Stats).
The observation source's sessions (restarts), clock (an offset) and schedule (when the next observation is due) are
edgeinfer/node/source.py.
"""
from __future__ import annotations

import os
import select
import signal
import threading
from typing import Callable

import numpy as np
import zmq

from edgeinfer.core import transport
from edgeinfer.core.clock import check_period_ns, now_ns, pin_to_cpus, wait_until
from edgeinfer.core.lifecycle import ParentWatch
from edgeinfer.core.liveliness import LinkMonitor
from edgeinfer.core.logwriter import emit, print_last
from edgeinfer.core.protocols import Runtime
from edgeinfer.core.scheduler import UNRESOLVED_BUDGET_MS
from edgeinfer.core.wire import ActionChunk, Hello, Message, Observation, ObservationMismatch, Start, Stop
from edgeinfer.engines.backends.auto import choice_counters
from edgeinfer.node import faults
from edgeinfer.node.echo import start_echo
from edgeinfer.node.handshake import await_control, await_start
from edgeinfer.node.node_liveliness import RuntimeLiveliness
from edgeinfer.node.node_telemetry import NodeTelemetry
from edgeinfer.node.runtime import RuntimeConfig, make_runtime
from edgeinfer.node.source import NOT_TAKEN, DueWindow, ObservationSource


def serve(cfg: RuntimeConfig, endpoints: transport.Endpoints, handshake_timeout_s: float = 300.0) -> int:
    """Run the runtime node until a Stop message (or SIGTERM). Returns the number of chunks sent.

    Publishes on the chunk PUB: ActionChunks, and from a beacon thread its Heartbeat every
    runtime_heartbeat_ms and Stats every runtime_stats_ms; ErrorEvents (rate-limited) for malformed input
    and non-finite policy output, a Start whose schedule it cannot keep (error.start_refused: the schedule in force
    is kept), and once for an observation clock offset from this host's (error.clock_offset, a source declared on
    another host's clock: RuntimeConfig.obs_clock; edgeinfer/node/source.py), a stream late on this host's clock
    (error.obs_late), a timestamp ahead of it (error.clock_ahead) or a jump of the source's clock (error.clock_jump).
    It exits on a Stop, SIGTERM, its parent's exit, or the control loop gone for idle_timeout_s (never on a pause
    of the observations while the control loop beats: RuntimeLiveliness.gone). An observation whose timestamp is
    implausible (a corrupted one) is dropped (obs_implausible), and one older than max_obs_age_ms on arrival
    (obs_stale); a chunk with a non-finite action is never published: a `continue` chunk (the anchor only, so the
    control loop keeps its previous chunk or holds) goes out instead (counter error.nonfinite_action). A restarted
    observation source (a new Start, or its seq from 0 again) is served from its first observation, as a new
    episode (the runtime's reset(): a stateful policy's state back to its start; source_restarts); it may handshake
    again (its Hellos are answered). Started mid-run (a restart), it learns the schedule from the replayer's
    Heartbeat and waits for the control loop to acknowledge it before serving (re-handshake).
    """
    with RuntimeNode(cfg, endpoints) as node:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        if not node.handshake(handshake_timeout_s, stopped=stop.is_set):
            return 0  # a Stop or SIGTERM before it served (a restart the run ended before): a clean exit
        while not stop.is_set() and node.step():
            pass
        return node.finish()


class RuntimeNode:
    """Lifecycle: open() -> handshake() -> step() until False -> finish() -> close(); or a context manager."""

    def __init__(self, cfg: RuntimeConfig, endpoints: transport.Endpoints):
        self.cfg, self.endpoints = cfg, endpoints
        self.ctx = self.auth = self.liveliness = self._stop_echo = self.obs_link = None
        self._last_msg_ns = 0  # the observation source's last message (the idle exit before a control loop beats)
        self._serving = False  # the handshake is over (every peer hears the chunk PUB)
        # its timestamps on another host's clock (an offset estimated) or this host's (ages true): decided once
        other = cfg.obs_clock == "other" or (cfg.obs_clock == "auto" and not transport.is_loopback(endpoints.obs))
        self.source = ObservationSource(other_host=other)
        self._budget_ns = int(UNRESOLVED_BUDGET_MS * 1e6)  # until a Start gives the control period (_begin)
        self._max_age_ns = int(cfg.max_obs_age_ms * 1e6) if cfg.max_obs_age_ms is not None else None
        self._engine_choice, self._engine_counters = None, {}  # backend auto's choice (engines/backends/auto.py)

    def open(self) -> "RuntimeNode":
        cfg, ep = self.cfg, self.endpoints
        parent = ParentWatch()
        if warning := pin_to_cpus(cfg.runtime_cpus):  # before the engine starts its threads
            emit(f"runtime: {warning}")
        self.runtime: Runtime = make_runtime(cfg)  # driven through the Runtime protocol only (core/protocols.py)
        self._engine_choice = self.runtime.engine_choice  # backend auto: which engine, why
        self._engine_counters = choice_counters(self._engine_choice) if self._engine_choice else {}  # in each Stats
        try:
            self.ctx = zmq.Context()
            keys = ep.curve_keys()
            self.auth = transport.start_authenticator(self.ctx, keys)
            self._stop_echo = start_echo(cfg.echo_endpoint, keys) if cfg.echo_endpoint else None
            self.out = transport.LockedSender(transport.pub(self.ctx, ep.chunks, bind=True, curve=keys))
            self.telemetry = NodeTelemetry("runtime", cfg.runtime_stats_ms, self.out, self._counters)
            on_error = self.telemetry.wire_error
            self.obs_rx = transport.Receiver(transport.sub(self.ctx, ep.obs, hwm=transport.LATEST_HWM, curve=keys),
                                             on_error=on_error, latest=Observation, joints=self.runtime.n_joints)
            self._obs_ready = _readable(self.obs_rx.sock, self._woke)
            self.obs_link = LinkMonitor(self.obs_rx.sock, ep.obs)  # heals the link libzmq drops (a frame over 64 MiB)
            status_rx = (transport.Receiver(transport.sub(self.ctx, ep.status, curve=keys), on_error=on_error)
                         if ep.status else None)
            self.ready = transport.push(self.ctx, ep.ready, curve=keys)
            self.liveliness = RuntimeLiveliness(self.out, cfg.runtime_heartbeat_ms, cfg.runtime_lease_ms, status_rx,
                                                self.telemetry, parent)
            self.liveliness.start()
        except BaseException:
            self.close()
            raise
        return self

    def handshake(self, timeout_s: float = 300.0, stopped=lambda: False) -> bool:
        """Warm up and wait for the run to start (edgeinfer/node/handshake.py). False when a Stop or stopped()
        came first: the run ended before this runtime served. Raises TimeoutError, RuntimeError when the
        parent process is gone, transport.HandshakeError when a peer's handshake failed for good (CURVE on one
        side only)."""
        live = self.liveliness
        heard = lambda msg: self._heard(msg, now_ns())  # noqa: E731  (the source's clock, from the handshake on)
        watch = (self.out.sock, self.obs_rx.sock, self.ready, *((live.status_rx.sock,) if live.status_rx else ()))
        start, mid_run = await_start(self.runtime, self.obs_rx, self.out, self.ready, timeout_s, live.parent, stopped,
                                     heard, accept=lambda s: self._plan_of(s) is not None, watch=watch)
        if start is None:
            emit("runtime: stopped before start")
            return False
        if self.cfg.faults.active:  # after the warm-up: the engine slows down (or diverges) mid-run, not before
            self.runtime = faults.inject(self.runtime, self.cfg.faults)
        self._begin(start)
        if mid_run and live.status_rx is not None and not await_control(live.status_rx, self.obs_rx, live.control,
                                                                        timeout_s, live.parent, stopped, heard, watch):
            emit("runtime: stopped before serving")
            return False
        self.runtime.observe_costs(self.telemetry.observe_ns)  # after the warm-up: the plan's costs, as histograms
        # the first verified step streams ahead of its chunk (from a runtime that has one before the rest)
        self._on_first_step = self._publish_first_step if self.cfg.stream_first_step else None
        cfg = self.cfg
        c = self._engine_choice
        backend = f"{c['chosen']} (auto, {c['why']}; excluded {c['excluded']})" if c else cfg.backend
        what = ("null policy" if cfg.null_policy else f"bring-your-own {cfg.byo_spec}" if cfg.byo_spec
                else f"{cfg.decode} on {backend} {cfg.precision}")
        emit(f"runtime: {'re' if mid_run else ''}started ({what}, budget {self._budget_ns / 1e6:g} ms)")
        self._last_msg_ns = now_ns()
        self._serving = True
        if self.source.clock.offset:  # revealed in the handshake, before every peer could hear an ErrorEvent
            self._report_offset()
        return True

    def step(self) -> bool:
        """One loop iteration: wait -> receive -> the newest observation -> plan -> decode -> publish. Waits up to
        100 ms for a message (after the spin window of an observation due). False when the run is over: a Stop
        arrived, the parent process exited, or the control loop has been gone for idle_timeout_s (before it first
        beats: the source silent that long; RuntimeLiveliness.gone). A pause of the observations alone never ends
        it."""
        due_ns = self._await()
        got = self.obs_rx.recv_latest(100)  # latest-only: a stale observation is worse than none
        t_recv = now_ns()
        if self.obs_link.poll()[1]:
            self.telemetry.report("link_relinked", f"observation link dropped (a frame over "
                                  f"{transport.MAX_MESSAGE_BYTES >> 20} MiB, or its publisher restarted): reconnected")
        self.liveliness.poll(t_recv)
        if not got.count and not got.others:
            if why := self.liveliness.gone(t_recv, self._last_msg_ns, int(self.cfg.idle_timeout_s * 1e9)):
                emit(f"runtime: {why}; exiting")
                return False
            return True
        self._last_msg_ns = t_recv
        self.telemetry.count("observations", got.count)  # the newest and the ones it superseded
        for msg in got.others:  # Heartbeats, Hellos, a Start, a Stop
            self._heard(msg, t_recv)
            if isinstance(msg, Stop):
                return False
            if isinstance(msg, Start):
                self._begin(msg)
            elif isinstance(msg, Hello):  # a (restarted) source handshaking: say this runtime hears it
                transport.announce_ready(self.ready, "runtime")
        obs = got.msg
        t_start_ns = self._plan(obs, t_recv, due_ns) if obs is not None else None
        if t_start_ns is not None:
            try:
                chunk = self._decode(obs, t_start_ns)
            except ObservationMismatch as e:  # valid on the wire, not what the policy reads (joints, a channel)
                self.telemetry.report("obs_mismatch", f"observation {obs.seq}: {e}")
                return True
            self._publish(chunk, obs)
        return True

    def _await(self) -> int | None:
        """Sleep until the window of the next observation to decode opens, then spin on the socket until it closes
        (edgeinfer.core.clock.wait_until, the control loop's sleep-then-spin; the window: source.DueWindow): it
        arrives to a loop already awake. No spin when nothing is due or its window has passed (no stream): the
        loop then sleeps in the receive. Returns when it was due (monotonic ns; None: nothing was)."""
        due_ns, win = self.source.due_ns(), self._window
        if (end_ns := win.end_ns(due_ns, now_ns())) is not None:
            wait_until(end_ns, win.before.spin_ns + win.after.spin_ns, self._obs_ready)
        return due_ns

    def _woke(self, late_ns: int) -> None:
        """A sleep before an observation's window ended late_ns after it should have (sizes the window)."""
        self._window.before.woke(late_ns)

    def _plan_of(self, start: Start) -> tuple[int, int, float] | None:
        """(replan_every, step_ns, budget_ms) of the schedule `start` names; None when it names none this runtime
        can keep (period_ns not in (0, 10 s], or a budget outside the scheduler's range): refused, an ErrorEvent
        (error.start_refused) and the schedule in force kept."""
        try:
            check_period_ns(start.period_ns, "Start.period_ns")
            replan_every, step_ns = self.runtime.chunk_timing(start.period_ns)
            return replan_every, step_ns, self.cfg.scheduler.resolved_budget_ms(replan_every, start.period_ns)
        except ValueError as e:
            kept = (f"serving on the current schedule (period {self.source.period_ns} ns)" if self.source.start
                    else "waiting for a valid Start")
            self.telemetry.report("start_refused", f"Start refused: {e}; {kept}")
            return None

    def _begin(self, start: Start) -> None:
        """A session of the observation source: the first Start, or a restart (served from its first observation).
        A Start whose schedule cannot be kept is refused (_plan_of) and changes nothing."""
        restart = self.source.start is not None
        if (plan := self._plan_of(start)) is None or not self.source.begin(start):
            return  # refused, or the same Start again
        self.liveliness.schedule(start)
        self.replan_every, self.step_ns, budget_ms = plan
        self._budget_ns = int(budget_ms * 1e6)
        self.runtime.set_budget_ms(budget_ms)
        self._window = DueWindow(int(self.cfg.obs_spin_us * 1e3), start.period_ns)
        if restart:
            self.runtime.reset()  # a new episode: a stateful policy's state is the last session's
            self.telemetry.log.line("source_restart", "the observation source restarted (a new Start); serving it "
                                                      "from its first observation")

    def _heard(self, msg: Message, t_recv_ns: int) -> str | None:
        """A timestamped message of the source, for its clock: its verdict (source.VERDICTS). An offset revealed is
        reported (once; from the handshake, at its end), and so is a jump of the source's clock."""
        verdict = self.source.heard(msg, t_recv_ns)
        clock = self.source.clock
        if verdict == "offset" and self._serving:
            self._report_offset()
        elif verdict == "late":
            self.telemetry.report("obs_late", clock.describe_late(), every=True)
        elif verdict == "ahead":
            self.telemetry.report("clock_ahead", clock.describe_ahead())
        elif verdict == "jump":
            text = self.source.clock.describe_jump()
            self.telemetry.report("clock_jump", text)
            self.telemetry.log.line("clock_jump", text)
        return verdict

    def _report_offset(self) -> None:
        text = self.source.clock.describe()
        self.telemetry.report("clock_offset", text, every=True)
        self.telemetry.log.line("clock_offset", text)

    def _plan(self, obs: Observation, t_recv_ns: int, due_ns: int | None) -> int | None:
        """When obs's decode budget starts (monotonic ns); None when obs is not decoded: its timestamp is implausible
        (obs_implausible: a corrupted one; edgeinfer/node/source.py), it is not the newest of its session
        (obs_out_of_order), a replan is not due yet (replan_every_ticks), or it is stale: older than max_obs_age_ms
        or taken before its session's Start (obs_stale). Counts how it arrived (obs_arrival.*)."""
        src = self.source
        if self._heard(obs, t_recv_ns) in NOT_TAKEN:
            return None  # touches nothing: not the clock, not the session
        admitted = src.admit(obs)
        if admitted == "restart":
            self.runtime.reset()
            self.telemetry.log.line("source_restart", f"the observation source restarted (seq {obs.seq} after "
                                                      "a higher one, later in time); serving it from there")
        if admitted == "old" or obs.seq < src.next_seq:
            return None
        t_obs_ns = src.clock.local_ns(obs.t_ns)  # on this host's clock (shifted when the source's is offset)
        age_ns = t_recv_ns - t_obs_ns
        if admitted == "before_start" or (self._max_age_ns is not None and age_ns > self._max_age_ns):
            self.telemetry.count("obs_stale")
            return None
        src.next_seq = obs.seq + self.replan_every
        kind = self._window.arrived(t_recv_ns, due_ns, src.period_ns)
        self.telemetry.count(f"obs_arrival.{kind}")
        if age_ns >= 0:
            self.telemetry.observe_ns("obs_age_at_runtime", age_ns)
            if kind == "idle":  # the first after a pause: its age includes waking the loop up
                self.telemetry.observe_ns("obs_age_after_idle", age_ns)
        # The budget runs from when the observation was taken, so time spent in transport counts; a timestamp
        # that is still out of reach (negative, or past the budget) falls back to receipt time.
        return t_obs_ns if 0 <= age_ns < self._budget_ns else t_recv_ns

    def _decode(self, obs: Observation, t_start_ns: int) -> ActionChunk:
        return self.runtime.step(obs, t_start_ns, self.step_ns, on_first_step=self._on_first_step)

    def _publish_first_step(self, first: ActionChunk) -> None:
        """The chunk's first verified step, ahead of the rest (time to first action); never a non-finite one."""
        if np.all(np.isfinite(first.steps_rad)):
            self.out.send(first)
            t_obs_ns = self.source.clock.local_ns(first.t_obs_ns)
            self.telemetry.observe_ns("time_to_first_action", first.t_ready_ns - t_obs_ns)

    def _publish(self, chunk: ActionChunk, obs: Observation) -> None:
        if not np.all(np.isfinite(chunk.steps_rad)):  # never publish a non-finite action
            self.telemetry.report("nonfinite_action", f"chunk {chunk.seq} for observation {obs.seq}: non-finite "
                                                      "action from the policy; sent the continue rung instead")
            chunk.steps_rad, chunk.rung = chunk.steps_rad[:1], "continue"
        self.telemetry.count(f"rung.{chunk.rung}")
        self.telemetry.observe_ns("time_to_chunk", chunk.t_ready_ns - self.source.clock.local_ns(obs.t_ns))
        self.out.send(chunk)

    def _counters(self) -> dict[str, int]:
        """Counters kept outside the telemetry (receivers, runtime, lease), for each Stats (beacon thread)."""
        rx, control, src = self.obs_rx, self.liveliness.control, self.source
        counters = dict(obs_received=rx.received, obs_superseded=rx.stale_dropped, chunks_sent=self.runtime.n_chunks,
                        control_lost=control.lost, control_restarts=control.restarts, source_restarts=src.restarts,
                        obs_out_of_order=src.out_of_order, obs_implausible=src.clock.implausible,
                        links_relinked=self.obs_link.relinks)
        counters.update({f"malformed.{kind}": n for kind, n in list(rx.malformed_by_kind.items())})
        counters.update(self._engine_counters)
        return counters

    def finish(self) -> int:
        """End of the run: the final Stats (for the replayer's report) out. Returns the number of chunks sent."""
        self.liveliness.stop()  # before the socket it shares closes
        self.telemetry.publish_final()
        self.out.sock.close(linger=200)  # LINGER 0 elsewhere: give that last message a moment to leave
        print_last(f"runtime: {self.runtime.n_chunks} chunks sent; {self.telemetry.summary()}")
        return self.runtime.n_chunks

    def close(self) -> None:
        if self.liveliness is not None:
            self.liveliness.stop()
        if self.obs_link is not None:
            self.obs_link.close()
        if self._stop_echo is not None:
            self._stop_echo()
        if self.auth is not None:
            self.auth.stop()
        if self.ctx is not None:
            self.ctx.destroy(linger=0)

    def __enter__(self) -> "RuntimeNode":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()


def _readable(sock: zmq.Socket, woke: Callable[[int], None]) -> Callable[[int], bool]:
    """ready(timeout_ns) for edgeinfer.core.clock.wait_until: whether a message is queued on `sock`, after waiting up
    to timeout_ns (sub-ms, unlike zmq_poll's whole ms) for one; woke(late_ns) gets how late each wait that timed out
    ended. ZMQ_FD is edge-triggered: ZMQ_EVENTS is read before each wait (which re-arms it) and after it."""
    fd = sock.getsockopt(zmq.FD)

    def ready(timeout_ns: int) -> bool:
        if sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            return True
        if timeout_ns <= 0:  # spinning: let a thread waiting for this CPU run (ZeroMQ's I/O thread, which
            os.sched_yield()  # delivers the message: on a busy host a spin that keeps the CPU only delays it)
            return False
        wake_ns = now_ns() + timeout_ns
        if not select.select([fd], [], [], timeout_ns / 1e9)[0]:
            woke(now_ns() - wake_ns)
        return bool(sock.getsockopt(zmq.EVENTS) & zmq.POLLIN)
    return ready
