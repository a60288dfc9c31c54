"""The runtime node: observation -> tokens -> verified chunk under the tick's budget -> ActionChunk.

Fallback ladder when the budget cannot hold the full plan, best first (every chunk names its rung):
    full      every action token verified by the target
    partial   the steps fully verified so far (a shorter horizon)
    draft     no complete verified step: the verified prefix plus the drafter's tokens, unverified
    continue  nothing new: the control loop keeps the previous chunk
(the last rung, hold, is the control loop's watchdog.)
"""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

import numpy as np
import zmq

from edgeinfer.core import transport
from edgeinfer.core.acceptance import Greedy, Relaxed, Sampling
from edgeinfer.core.clock import now_ns, pin_to_cpus
from edgeinfer.core.lifecycle import ParentWatch
from edgeinfer.core.liveliness import Beacon, Lease
from edgeinfer.core.scheduler import SchedulerConfig, TickPlanner
from edgeinfer.core.speculative import speculative_decode
from edgeinfer.core.telemetry import Telemetry
from edgeinfer.core.wire import ActionChunk, Heartbeat, Hello, Observation, Start, Stop, WireError
from edgeinfer.engines.drafters import DRAFTERS, make_drafter
from edgeinfer.engines.paths import DEFAULT_POLICY
from edgeinfer.node import faults
from edgeinfer.node.faults import FaultConfig

DECODES = ("speculative", "target-only")


@dataclass
class RuntimeConfig:
    """policy: manifest JSON. backend/precision/device: the engine the target runs on (see edgeinfer.engines.engine).
    decode: speculative | target-only. threads: intra-op threads of the engine.
    replan_every_ticks: start a new chunk at most every this many observations (5 = one chunk step,
    20 ms at 250 Hz); the chunk horizon covers the gap, and the idle time is left to the control loop."""

    policy: Path = DEFAULT_POLICY
    backend: Literal["torch", "onnxruntime", "tensorrt"] = "torch"
    precision: Literal["fp32", "bf16", "fp8"] = "fp32"
    device: str = "cpu"
    decode: Literal["speculative", "target-only"] = "speculative"
    # a drafter by name, or "auto": every registered drafter, the scheduler choosing one per chunk
    drafter: str = "kinematic"
    # greedy: exact; sampling: exact in distribution (temperature, top_p, seed); relaxed: LOSSY, drafts kept
    # within relax_bins bins of the target's choice (edgeinfer.core.acceptance)
    acceptance: Literal["greedy", "sampling", "relaxed"] = "greedy"
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    relax_bins: int = 1
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    warmup_chunks: int = 30
    threads: int = 1
    replan_every_ticks: int = 5
    idle_timeout_s: float = 5.0  # after the start, exit when no message arrives for this long
    runtime_cpus: list[int] | None = None  # CPUs the runtime may use (None: any)
    byo_spec: Path | None = None  # bring your own policy: a spec TOML (engines/byo.py) served instead of `policy`
    byo_model: Path | None = None  # the spec's model file replaced by this one (e.g. its TorchScript twin)
    # publish each chunk's first verified action step as soon as it exists, then the whole chunk
    stream_first_step: bool = True
    null_policy: bool = False  # serve NullRuntime (a chunk holding the observed position, at once): benchmarks
    # observations older than this when they arrive are dropped and counted (obs_stale); None: off (another
    # host's clock)
    max_obs_age_ms: float | None = 50.0
    # Heartbeat period on the chunk PUB, and the liveliness lease: the control loop deems the runtime dead after
    # this long unheard. A killed process closes its sockets only after the kernel has torn down its memory
    # (tens of ms for torch), so the lease is what detects death within two control periods (8 ms at 250 Hz).
    runtime_heartbeat_ms: float = 2.0
    runtime_lease_ms: float = 6.0
    runtime_stats_ms: float = 200.0  # Stats period on the chunk PUB
    faults: FaultConfig = field(default_factory=FaultConfig)  # fault injection (edgeinfer.node.faults); off by default
    # bind a round-trip echo here (start_echo), for `edgeinfer hil` to measure the bare network; None: off
    echo_endpoint: str | None = None

    def __post_init__(self):
        self.policy = Path(self.policy)
        if self.decode not in DECODES:
            raise ValueError(f"RuntimeConfig.decode must be one of {DECODES}, got {self.decode!r}")
        if self.drafter != "auto" and self.drafter not in DRAFTERS:
            raise ValueError(f"RuntimeConfig.drafter must be 'auto' or one of {sorted(DRAFTERS)}, "
                             f"got {self.drafter!r}")
        self.rule()  # validates temperature, top_p, relax_bins
        if self.threads < 1:
            raise ValueError(f"RuntimeConfig.threads must be >= 1, got {self.threads}")
        if not self.idle_timeout_s > 0:
            raise ValueError(f"RuntimeConfig.idle_timeout_s must be > 0, got {self.idle_timeout_s}")
        if self.replan_every_ticks < 1:
            raise ValueError(f"RuntimeConfig.replan_every_ticks must be >= 1, got {self.replan_every_ticks}")
        if self.max_obs_age_ms is not None and not self.max_obs_age_ms > 0:
            raise ValueError(f"RuntimeConfig.max_obs_age_ms must be > 0 (or None), got {self.max_obs_age_ms}")
        if not 0 < self.runtime_heartbeat_ms < self.runtime_lease_ms:
            raise ValueError(f"RuntimeConfig: need 0 < runtime_heartbeat_ms < runtime_lease_ms, got "
                             f"{self.runtime_heartbeat_ms}, {self.runtime_lease_ms}")
        if not self.runtime_stats_ms > 0:
            raise ValueError(f"RuntimeConfig.runtime_stats_ms must be > 0, got {self.runtime_stats_ms}")

    def rule(self) -> Greedy | Relaxed | Sampling:
        """The acceptance rule this configuration asks for (a fresh one: Sampling carries its own rng)."""
        if self.acceptance == "sampling":
            return Sampling(self.temperature, self.top_p, self.seed)
        return Relaxed(self.relax_bins) if self.acceptance == "relaxed" else Greedy()


class PolicyRuntime:
    """In-process API: build one ActionChunk per observation within the scheduler's budget."""

    def __init__(self, cfg: RuntimeConfig):
        from edgeinfer.engines.build import load_engine  # torch: only a node that runs the policy loads it
        from edgeinfer.engines.policy import load_policy

        self.cfg = cfg
        self.policy = load_policy(cfg.policy)
        self.engine = load_engine(self.policy, cfg.backend, cfg.precision, cfg.device, threads=cfg.threads)
        names = list(DRAFTERS) if cfg.drafter == "auto" else [cfg.drafter]
        self.drafters = {n: make_drafter(n, self.policy) for n in names} if cfg.decode == "speculative" else {}
        self.fallback = self.drafters.get("kinematic") or next(iter(self.drafters.values()), None)
        self.rule = cfg.rule()
        k_max = cfg.scheduler.k_max if cfg.decode == "speculative" else 0
        self.planner = TickPlanner(dataclasses.replace(cfg.scheduler, k_max=k_max), list(self.drafters))
        self.n_chunks = 0

    def chunk_timing(self, period_ns: int) -> tuple[int, int]:
        """(control ticks between chunk starts, chunk step in ns) for a control period of period_ns."""
        return self.cfg.replan_every_ticks, period_ns * self.policy.cfg.stride_ticks

    def warmup_observation(self) -> Observation:
        """An observation at the training data's mean, for warm-up before the start."""
        d, mean = self.policy.cfg.n_joints, self.policy.feat_mean
        return Observation(0, now_ns(), mean[:d], mean[d:2 * d], mean[:d] - mean[2 * d:3 * d])

    def warmup(self, obs: Observation) -> None:
        """Run unbudgeted decodes so that the cost estimates (and the engine's caches) are populated."""
        for i in range(self.cfg.warmup_chunks):
            if i == self.cfg.warmup_chunks // 3:
                self.planner.forget_costs()  # drop the one-off costs of the first calls
            self.step(obs, budget=False)
        self.n_chunks = 0

    def step(self, obs: Observation, t_start_ns: int | None = None, step_ns: int = 20_000_000,
             budget: bool = True, on_first_step: Callable[[ActionChunk], None] | None = None) -> ActionChunk:
        """Decode a chunk for `obs`; the budget runs from t_start_ns (default now). step_ns: chunk step.

        on_first_step(chunk), when given, receives the chunk's first verified action step as soon as the target
        has verified it (a `partial` chunk of one step, same observation), before the rest is decoded: the
        control loop can act on the new observation one chunk earlier (time to first action)."""
        p, d = self.policy, self.policy.cfg.n_joints
        self.planner.start(t_start_ns) if budget else self.planner.unlimited()
        chosen = self.planner.choose()  # this chunk's drafter (None: target-only)
        drafter = self.drafters[chosen] if chosen is not None else None
        for dr in {drafter, self.fallback} - {None}:  # model drafters defer their prefill to their first proposal
            dr.reset(obs.q_rad, obs.qd_rad_s, obs.q_prev_rad)
        first_sent = on_first_step is None

        def publish_first_step(tokens: list[int]) -> None:
            nonlocal first_sent
            if not first_sent and d <= len(tokens) < p.cfg.n_tokens:
                first_sent = True
                on_first_step(self._chunk(obs, tokens[:d], "partial", step_ns, None, count=False))

        res = speculative_decode(self.engine, p.features(obs.q_rad, obs.qd_rad_s, obs.q_prev_rad),
                                 p.cfg.n_tokens, drafter, self.planner, self.rule, publish_first_step)
        tokens = res.tokens
        if res.complete:
            rung = "full"
        elif len(tokens) >= d:
            rung, tokens = "partial", tokens[: len(tokens) // d * d]
        elif self.fallback is not None:
            rung, tokens = "draft", tokens + (drafter or self.fallback).propose(tokens, p.cfg.n_tokens - len(tokens))
        else:
            rung, tokens = "continue", []
        return self._chunk(obs, tokens, rung, step_ns, res)

    def _chunk(self, obs: Observation, tokens: list[int], rung: str, step_ns: int, res, count: bool = True
               ) -> ActionChunk:
        """The ActionChunk of `tokens` (anchor row obs.q_rad, then one row per action step); res: the
        DecodeResult behind it (None: an early first step, whose counts arrive with the rest)."""
        d = self.policy.cfg.n_joints
        steps = (obs.q_rad + self.policy.tokenizer.decode(np.array(tokens, dtype=np.int64)) if tokens
                 else np.zeros((0, d)))
        seq = self.n_chunks + 1  # an early first step carries the seq of the chunk it belongs to
        self.n_chunks += count
        return ActionChunk(
            seq=seq, obs_seq=obs.seq, t_obs_ns=obs.t_ns, t_ready_ns=now_ns(), step_ns=step_ns,
            steps_rad=np.vstack([obs.q_rad[None, :], steps]), rung=rung, tokens=len(res.tokens) if res else len(tokens),
            target_passes=res.target_passes if res else 0, drafted=res.drafted if res else 0,
            accepted=res.accepted if res else 0)


class NullRuntime:
    """A policy that costs nothing: each chunk holds the observed position for one chunk step. Serves transport
    benchmarks and drills (RuntimeConfig.null_policy), through the same node loop as the real policy."""

    def __init__(self, cfg: RuntimeConfig, stride_ticks: int = 5):
        self.cfg, self.stride_ticks, self.n_chunks = cfg, stride_ticks, 0

    def chunk_timing(self, period_ns: int) -> tuple[int, int]:
        return self.cfg.replan_every_ticks, period_ns * self.stride_ticks

    def warmup_observation(self) -> None:
        return None

    def warmup(self, obs) -> None:
        pass

    def step(self, obs: Observation, t_start_ns: int | None = None, step_ns: int = 20_000_000,
             budget: bool = True) -> ActionChunk:
        self.n_chunks += 1
        return ActionChunk(seq=self.n_chunks, obs_seq=obs.seq, t_obs_ns=obs.t_ns, t_ready_ns=now_ns(), step_ns=step_ns,
                           steps_rad=np.vstack([obs.q_rad, obs.q_rad]), rung="full", tokens=0, target_passes=0,
                           drafted=0, accepted=0)


def _make_runtime(cfg: RuntimeConfig):
    if cfg.null_policy:
        runtime = NullRuntime(cfg)
    elif cfg.byo_spec is not None:
        import torch

        from edgeinfer.engines.byo import ByoRuntime

        torch.set_num_threads(cfg.threads)
        runtime = ByoRuntime(cfg.byo_spec, cfg.byo_model)
    else:
        runtime = PolicyRuntime(cfg)
    return runtime


def start_echo(endpoint: str, keys: transport.CurveKeys | None) -> Callable[[], None]:
    """A ROUTER bound at `endpoint` that sends every message straight back to its sender (the network round-trip
    probe of sim/hil.py), CURVE server when `keys` are given. libzmq's proxy (frontend = backend) runs it in C with
    the GIL released, on a context of its own, so a decode on the main thread never delays a reply. Returns
    stop(). Raises zmq.ZMQError when the endpoint cannot be bound."""
    ctx = zmq.Context()
    auth = transport.start_authenticator(ctx, keys)
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, 4096)  # probes are a few bytes
    if keys is not None:
        sock.curve_server = True
        sock.curve_publickey, sock.curve_secretkey = keys.server_public, keys.server_secret
    sock.bind(endpoint)

    def run() -> None:
        try:
            zmq.proxy(sock, sock)
        except zmq.ContextTerminated:  # stop(): ctx.term() ends the proxy
            pass
        finally:
            sock.close(linger=0)
    thread = threading.Thread(target=run, name="echo", daemon=True)
    thread.start()

    def stop() -> None:
        if auth is not None:
            auth.stop()
        ctx.term()  # returns once run() has closed the socket
        thread.join()
    return stop


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
    parent = ParentWatch()
    warning = pin_to_cpus(cfg.runtime_cpus)  # before the engine starts its threads
    if warning:
        print(f"runtime: {warning}", flush=True)
    runtime = _make_runtime(cfg)
    # The beacon thread must get the GIL within a fraction of the lease while the main thread decodes
    # (CPython's default switch interval is 5 ms).
    sys.setswitchinterval(min(sys.getswitchinterval(), cfg.runtime_heartbeat_ms / 2000))
    stop = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
    ctx = zmq.Context()
    keys = endpoints.curve_keys()
    auth = transport.start_authenticator(ctx, keys)
    tel = Telemetry("runtime", cfg.runtime_stats_ms)
    beacon = None
    stop_echo = start_echo(cfg.echo_endpoint, keys) if cfg.echo_endpoint else None
    try:
        out = transport.LockedSender(transport.pub(ctx, endpoints.chunks, bind=True, curve=keys))

        def report(kind: str, text: str) -> None:  # count it, and publish an ErrorEvent unless rate-limited
            if (event := tel.error(kind, text)) is not None:
                out.send(event)

        def on_error(e: WireError) -> None:
            report(e.kind, str(e))

        obs_rx = transport.Receiver(transport.sub(ctx, endpoints.obs, curve=keys), on_error=on_error)
        status_rx = (transport.Receiver(transport.sub(ctx, endpoints.status, curve=keys), on_error=on_error)
                     if endpoints.status else None)
        ready = transport.push(ctx, endpoints.ready, curve=keys)
        control = Lease("control", int(cfg.runtime_lease_ms * 1e6))

        def refresh():  # receiver counters into the stats snapshot (beacon thread)
            tel.counters.update(obs_received=obs_rx.received, obs_superseded=obs_rx.stale_dropped,
                                chunks_sent=runtime.n_chunks, control_lost=control.lost,
                                control_restarts=control.restarts)
            for kind, n in list(obs_rx.malformed_by_kind.items()):
                tel.counters[f"malformed.{kind}"] = n

        beacon = Beacon(out, "runtime", cfg.runtime_heartbeat_ms, cfg.runtime_lease_ms, control, tel, refresh)
        beacon.start()
        start, mid_run = _handshake(runtime, obs_rx, out, ready, handshake_timeout_s, parent, lambda: stop["flag"])
        if start is None:  # a Stop or SIGTERM before the run began (a restart the run ended before): a clean exit
            print("runtime: stopped before start", flush=True)
            return 0
        if cfg.faults.active:  # after the warm-up: the engine slows down (or diverges) mid-run, not before
            runtime = faults.inject(runtime, cfg.faults)
        beacon.schedule = start
        if mid_run and status_rx is not None and not _await_control(status_rx, obs_rx, control, handshake_timeout_s,
                                                                    parent, lambda: stop["flag"]):
            print("runtime: stopped before serving", flush=True)
            return 0
        replan_every, step_ns = runtime.chunk_timing(start.period_ns)
        policy_runtime = runtime if isinstance(runtime, PolicyRuntime) else None  # not a drill's wrapper
        if policy_runtime is not None:  # after the warm-up: the plan's cost samples, as histograms
            policy_runtime.planner.latency.observer = tel.observe_ns

        def send_first_step(first: ActionChunk) -> None:  # the first verified step, ahead of its chunk
            if np.all(np.isfinite(first.steps_rad)):
                out.send(first)
                tel.observe_ns("time_to_first_action", first.t_ready_ns - msg.t_ns)
        what = ("null policy" if cfg.null_policy else f"bring-your-own {cfg.byo_spec}" if cfg.byo_spec
                else f"{cfg.decode} on {cfg.backend} {cfg.precision}")
        print(f"runtime: {'re' if mid_run else ''}started ({what}, budget {cfg.scheduler.budget_ms} ms)", flush=True)
        next_seq, last_msg_ns = 0, now_ns()
        budget_ns = int(cfg.scheduler.budget_ms * 1e6)
        max_age_ns = int(cfg.max_obs_age_ms * 1e6) if cfg.max_obs_age_ms is not None else None
        while not stop["flag"]:
            first = obs_rx.recv(100)
            t_recv = now_ns()
            if status_rx is not None:
                for msg in status_rx.drain():
                    if isinstance(msg, Heartbeat):
                        control.beat(msg, t_recv)
                control.check(t_recv)
            if first is None:
                if t_recv - last_msg_ns > cfg.idle_timeout_s * 1e9:
                    print(f"runtime: no message for {cfg.idle_timeout_s} s; exiting", flush=True)
                    break
                continue
            batch = [first, *obs_rx.drain()]
            last_msg_ns = t_recv = now_ns()  # after the drain: the newest observation may have just arrived
            # latest-only: a stale observation is worse than none (Heartbeats and Hellos are not observations)
            observations = [m for m in batch if isinstance(m, Observation)]
            tel.count("observations", len(observations))
            if any(isinstance(m, Stop) for m in batch):
                break
            obs_rx.stale_dropped += max(0, len(observations) - 1)
            msg = observations[-1] if observations else None
            if msg is None or msg.seq < next_seq:
                continue
            age_ns = t_recv - msg.t_ns
            if max_age_ns is not None and age_ns > max_age_ns:
                tel.count("obs_stale")
                continue
            next_seq = msg.seq + replan_every
            # The budget runs from when the observation was taken (same-host monotonic clock), so time
            # spent in transport counts; a timestamp from another clock falls back to receipt time.
            t_start = msg.t_ns if 0 <= age_ns < budget_ns else t_recv
            if age_ns >= 0:
                tel.observe_ns("obs_age_at_runtime", age_ns)
            if policy_runtime is not None and cfg.stream_first_step:
                chunk = policy_runtime.step(msg, t_start, step_ns, on_first_step=send_first_step)
            else:
                chunk = runtime.step(msg, t_start, step_ns)
            if not np.all(np.isfinite(chunk.steps_rad)):  # never publish a non-finite action
                report("nonfinite_action", f"chunk {chunk.seq} for observation {msg.seq}: non-finite action "
                                           "from the policy; sent the continue rung instead")
                chunk.steps_rad, chunk.rung = chunk.steps_rad[:1], "continue"
            tel.count(f"rung.{chunk.rung}")
            tel.observe_ns("time_to_chunk", chunk.t_ready_ns - msg.t_ns)
            out.send(chunk)
        beacon.stop()  # before the socket it shares closes
        refresh()
        out.send(tel.snapshot())  # the final Stats, for the replayer's report
        out.sock.close(linger=200)  # LINGER 0 elsewhere: give that last message a moment to leave
        print(f"runtime: {runtime.n_chunks} chunks sent; counters {dict(sorted(tel.counters.items()))} "
              f"(last error: {tel.last_error or '-'})", flush=True)
        return runtime.n_chunks
    finally:
        if beacon is not None:
            beacon.stop()
        if stop_echo is not None:
            stop_echo()
        if auth is not None:
            auth.stop()
        ctx.destroy(linger=0)


def _handshake(runtime, obs_rx, out, ready, timeout_s: float, parent: ParentWatch,
               stopped: Callable[[], bool] = lambda: False) -> tuple[Start | None, bool]:
    """Warm up, then publish Hellos on the chunk PUB (for its subscribers) until Start arrives.

    Returns (start, mid_run). A runtime (re)started after the run began never sees the Start: the
    replayer's Heartbeat carries the same schedule, and mid_run is then True. (None, False) when a Stop
    arrives or stopped() (SIGTERM) turns true first."""
    runtime.warmup(runtime.warmup_observation())
    announced, i = False, 0
    deadline = now_ns() + int(timeout_s * 1e9)
    while now_ns() < deadline and not stopped():
        parent.check()
        out.send(Hello("runtime", i, now_ns()))
        i += 1
        msg = obs_rx.recv(transport.HELLO_PERIOD_MS)
        if isinstance(msg, Hello) and not announced:
            announced = transport.announce_ready(ready, "runtime")
        elif isinstance(msg, Start):
            return msg, False
        elif isinstance(msg, Heartbeat) and msg.sender == "replayer" and msg.t0_ns >= 0:
            return Start(msg.t0_ns, msg.period_ns, msg.n_ticks), True
        elif isinstance(msg, Stop):
            return None, False
    if stopped():
        return None, False
    raise TimeoutError("runtime: no Start message")


def _await_control(status_rx, obs_rx, control: Lease, timeout_s: float, parent: ParentWatch,
                   stopped: Callable[[], bool] = lambda: False) -> bool:
    """Re-handshake of a runtime that joined mid-run: until the control loop's Heartbeat names this process as
    the runtime it hears (so its chunk SUB is subscribed here and no chunk is lost to the slow joiner).
    Observations meanwhile are stale and dropped. Gives up with a warning after timeout_s (True). False
    when a Stop arrives or stopped() (SIGTERM) turns true first: the run ended before this runtime served."""
    deadline = now_ns() + int(timeout_s * 1e9)
    me = os.getpid()
    while now_ns() < deadline:
        parent.check()
        msg = status_rx.recv(transport.HELLO_PERIOD_MS)
        if stopped() or any(isinstance(m, Stop) for m in obs_rx.drain()):
            return False
        if isinstance(msg, Heartbeat):
            control.beat(msg, now_ns())
            if msg.peer_instance == me:
                return True
    print(f"runtime: the control loop did not acknowledge this runtime within {timeout_s} s; serving anyway",
          flush=True)
    return True
