"""The runtime node (`edgeinfer serve`): observations in, action chunks out, one loop iteration at a time.

    open()       the policy (warmed up in the handshake), the sockets, the echo; liveliness and telemetry start
    handshake()  Hellos until the Start (restarted mid-run: the replayer's schedule, then the control loop's ack)
    step()       receive -> the newest observation -> plan (due? stale? the budget's start) -> decode -> publish
    finish()     the final Stats out; close() the sockets

Beside the loop, not in it: RuntimeLiveliness (edgeinfer/node/liveliness.py: the Heartbeat thread, the control
loop's lease, the parent watch) and NodeTelemetry (edgeinfer/node/telemetry.py: counters, ErrorEvents, Stats).
"""
from __future__ import annotations

import signal
import threading

import numpy as np
import zmq

from edgeinfer.core import transport
from edgeinfer.core.clock import now_ns, pin_to_cpus
from edgeinfer.core.lifecycle import ParentWatch
from edgeinfer.core.wire import ActionChunk, Observation, Stop
from edgeinfer.node import faults
from edgeinfer.node.echo import start_echo
from edgeinfer.node.handshake import await_control, await_start
from edgeinfer.node.liveliness import RuntimeLiveliness
from edgeinfer.node.runtime import PolicyRuntime, RuntimeConfig, make_runtime
from edgeinfer.node.telemetry import NodeTelemetry


def serve(cfg: RuntimeConfig, endpoints: transport.Endpoints, handshake_timeout_s: float = 300.0) -> int:
    """Run the runtime node until a Stop message (or SIGTERM). Returns the number of chunks sent.

    Publishes on the chunk PUB: ActionChunks, and from a beacon thread its Heartbeat every
    runtime_heartbeat_ms and Stats every runtime_stats_ms; ErrorEvents (rate-limited) for malformed input
    and non-finite policy output. An observation older than max_obs_age_ms on arrival is dropped
    (counter obs_stale); a chunk with a non-finite action is never published: a `continue` chunk (the
    anchor only, so the control loop keeps its previous chunk or holds) goes out instead (counter
    error.nonfinite_action). Started mid-run (a restart), it learns the schedule from the replayer's
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
        self.ctx = self.auth = self.liveliness = self._stop_echo = None
        self._next_seq, self._last_msg_ns = 0, 0
        self._budget_ns = int(cfg.scheduler.budget_ms * 1e6)
        self._max_age_ns = int(cfg.max_obs_age_ms * 1e6) if cfg.max_obs_age_ms is not None else None

    def open(self) -> "RuntimeNode":
        cfg, ep = self.cfg, self.endpoints
        parent = ParentWatch()
        if warning := pin_to_cpus(cfg.runtime_cpus):  # before the engine starts its threads
            print(f"runtime: {warning}", flush=True)
        self.runtime = make_runtime(cfg)
        try:
            self.ctx = zmq.Context()
            keys = ep.curve_keys()
            self.auth = transport.start_authenticator(self.ctx, keys)
            self._stop_echo = start_echo(cfg.echo_endpoint, keys) if cfg.echo_endpoint else None
            self.out = transport.LockedSender(transport.pub(self.ctx, ep.chunks, bind=True, curve=keys))
            self.telemetry = NodeTelemetry("runtime", cfg.runtime_stats_ms, self.out, self._counters)
            on_error = self.telemetry.wire_error
            self.obs_rx = transport.Receiver(transport.sub(self.ctx, ep.obs, curve=keys), on_error=on_error)
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
        came first: the run ended before this runtime served. Raises TimeoutError, or RuntimeError when the
        parent process is gone."""
        live = self.liveliness
        start, mid_run = await_start(self.runtime, self.obs_rx, self.out, self.ready, timeout_s, live.parent, stopped)
        if start is None:
            print("runtime: stopped before start", flush=True)
            return False
        if self.cfg.faults.active:  # after the warm-up: the engine slows down (or diverges) mid-run, not before
            self.runtime = faults.inject(self.runtime, self.cfg.faults)
        live.schedule(start)
        if mid_run and live.status_rx is not None and not await_control(live.status_rx, self.obs_rx, live.control,
                                                                        timeout_s, live.parent, stopped):
            print("runtime: stopped before serving", flush=True)
            return False
        self.replan_every, self.step_ns = self.runtime.chunk_timing(start.period_ns)
        # the first verified step streams ahead of its chunk from the policy runtime only (not a drill's wrapper)
        policy = self.runtime if isinstance(self.runtime, PolicyRuntime) else None
        if policy is not None:  # after the warm-up: the plan's cost samples, as histograms
            policy.planner.latency.observer = self.telemetry.observe_ns
        self._streaming = policy if self.cfg.stream_first_step else None
        cfg = self.cfg
        what = ("null policy" if cfg.null_policy else f"bring-your-own {cfg.byo_spec}" if cfg.byo_spec
                else f"{cfg.decode} on {cfg.backend} {cfg.precision}")
        print(f"runtime: {'re' if mid_run else ''}started ({what}, budget {cfg.scheduler.budget_ms} ms)", flush=True)
        self._last_msg_ns = now_ns()
        return True

    def step(self) -> bool:
        """One loop iteration: receive -> the newest observation -> plan -> decode -> publish. Waits up to 100 ms
        for a message. False when the run is over: a Stop arrived, or no message came for idle_timeout_s."""
        first = self.obs_rx.recv(100)
        t_recv = now_ns()
        self.liveliness.poll(t_recv)
        if first is None:
            if t_recv - self._last_msg_ns > self.cfg.idle_timeout_s * 1e9:
                print(f"runtime: no message for {self.cfg.idle_timeout_s} s; exiting", flush=True)
                return False
            return True
        batch = [first, *self.obs_rx.drain()]
        self._last_msg_ns = t_recv = now_ns()  # after the drain: the newest observation may have just arrived
        observations = [m for m in batch if isinstance(m, Observation)]  # not Heartbeats or Hellos
        self.telemetry.count("observations", len(observations))
        if any(isinstance(m, Stop) for m in batch):
            return False
        # latest-only: a stale observation is worse than none
        self.obs_rx.stale_dropped += max(0, len(observations) - 1)
        obs = observations[-1] if observations else None
        t_start_ns = self._plan(obs, t_recv) if obs is not None else None
        if t_start_ns is not None:
            self._publish(self._decode(obs, t_start_ns), obs)
        return True

    def _plan(self, obs: Observation, t_recv_ns: int) -> int | None:
        """When obs's decode budget starts (monotonic ns); None when obs is not decoded: a replan is not due yet
        (replan_every_ticks), or it is older than max_obs_age_ms (counter obs_stale)."""
        if obs.seq < self._next_seq:
            return None
        age_ns = t_recv_ns - obs.t_ns
        if self._max_age_ns is not None and age_ns > self._max_age_ns:
            self.telemetry.count("obs_stale")
            return None
        self._next_seq = obs.seq + self.replan_every
        if age_ns >= 0:
            self.telemetry.observe_ns("obs_age_at_runtime", age_ns)
        # The budget runs from when the observation was taken (same-host monotonic clock), so time spent in
        # transport counts; a timestamp from another clock falls back to receipt time.
        return obs.t_ns if 0 <= age_ns < self._budget_ns else t_recv_ns

    def _decode(self, obs: Observation, t_start_ns: int) -> ActionChunk:
        if self._streaming is not None:
            return self._streaming.step(obs, t_start_ns, self.step_ns, on_first_step=self._publish_first_step)
        return self.runtime.step(obs, t_start_ns, self.step_ns)

    def _publish_first_step(self, first: ActionChunk) -> None:
        """The chunk's first verified step, ahead of the rest (time to first action); never a non-finite one."""
        if np.all(np.isfinite(first.steps_rad)):
            self.out.send(first)
            self.telemetry.observe_ns("time_to_first_action", first.t_ready_ns - first.t_obs_ns)

    def _publish(self, chunk: ActionChunk, obs: Observation) -> None:
        if not np.all(np.isfinite(chunk.steps_rad)):  # never publish a non-finite action
            self.telemetry.report("nonfinite_action", f"chunk {chunk.seq} for observation {obs.seq}: non-finite "
                                                      "action from the policy; sent the continue rung instead")
            chunk.steps_rad, chunk.rung = chunk.steps_rad[:1], "continue"
        self.telemetry.count(f"rung.{chunk.rung}")
        self.telemetry.observe_ns("time_to_chunk", chunk.t_ready_ns - obs.t_ns)
        self.out.send(chunk)

    def _counters(self) -> dict[str, int]:
        """Counters kept outside the telemetry (receivers, runtime, lease), for each Stats (beacon thread)."""
        rx, control = self.obs_rx, self.liveliness.control
        counters = dict(obs_received=rx.received, obs_superseded=rx.stale_dropped, chunks_sent=self.runtime.n_chunks,
                        control_lost=control.lost, control_restarts=control.restarts)
        counters.update({f"malformed.{kind}": n for kind, n in list(rx.malformed_by_kind.items())})
        return counters

    def finish(self) -> int:
        """End of the run: the final Stats (for the replayer's report) out. Returns the number of chunks sent."""
        self.liveliness.stop()  # before the socket it shares closes
        self.telemetry.publish_final()
        self.out.sock.close(linger=200)  # LINGER 0 elsewhere: give that last message a moment to leave
        print(f"runtime: {self.runtime.n_chunks} chunks sent; {self.telemetry.summary()}", flush=True)
        return self.runtime.n_chunks

    def close(self) -> None:
        if self.liveliness is not None:
            self.liveliness.stop()
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
