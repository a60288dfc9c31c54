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
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import zmq

from edgeinfer import transport
from edgeinfer.acceptance import Greedy, Relaxed, Sampling
from edgeinfer.clock import now_ns, pin_to_cpus
from edgeinfer.engines.build import load_engine
from edgeinfer.engines.drafters import DRAFTERS, make_drafter
from edgeinfer.engines.policy import DEFAULT_POLICY, load_policy
from edgeinfer.lifecycle import ParentWatch
from edgeinfer.scheduler import SchedulerConfig, TickPlanner
from edgeinfer.speculative import speculative_decode
from edgeinfer.wire import ActionChunk, Hello, Observation, Start, Stop

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
    drafter: str = "kinematic"
    # greedy: exact; sampling: exact in distribution (temperature, top_p, seed); relaxed: LOSSY, drafts kept
    # within relax_bins bins of the target's choice (edgeinfer.acceptance)
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

    def __post_init__(self):
        self.policy = Path(self.policy)
        if self.decode not in DECODES:
            raise ValueError(f"RuntimeConfig.decode must be one of {DECODES}, got {self.decode!r}")
        if self.drafter not in DRAFTERS:
            raise ValueError(f"RuntimeConfig.drafter must be one of {sorted(DRAFTERS)}, got {self.drafter!r}")
        self.rule()  # validates temperature, top_p, relax_bins
        if self.threads < 1:
            raise ValueError(f"RuntimeConfig.threads must be >= 1, got {self.threads}")
        if not self.idle_timeout_s > 0:
            raise ValueError(f"RuntimeConfig.idle_timeout_s must be > 0, got {self.idle_timeout_s}")
        if self.replan_every_ticks < 1:
            raise ValueError(f"RuntimeConfig.replan_every_ticks must be >= 1, got {self.replan_every_ticks}")

    def rule(self) -> Greedy | Relaxed | Sampling:
        """The acceptance rule this configuration asks for (a fresh one: Sampling carries its own rng)."""
        if self.acceptance == "sampling":
            return Sampling(self.temperature, self.top_p, self.seed)
        return Relaxed(self.relax_bins) if self.acceptance == "relaxed" else Greedy()


class PolicyRuntime:
    """In-process API: build one ActionChunk per observation within the scheduler's budget."""

    def __init__(self, cfg: RuntimeConfig):
        self.cfg = cfg
        self.policy = load_policy(cfg.policy)
        self.engine = load_engine(self.policy, cfg.backend, cfg.precision, cfg.device, threads=cfg.threads)
        self.drafter = make_drafter(cfg.drafter, self.policy)
        self.rule = cfg.rule()
        k_max = cfg.scheduler.k_max if cfg.decode == "speculative" else 0
        self.planner = TickPlanner(dataclasses.replace(cfg.scheduler, k_max=k_max))
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
                self.planner.latency.clear()  # drop the one-off costs of the first calls
            self.step(obs, budget=False)
        self.n_chunks = 0

    def step(self, obs: Observation, t_start_ns: int | None = None, step_ns: int = 20_000_000,
             budget: bool = True) -> ActionChunk:
        """Decode a chunk for `obs`; the budget runs from t_start_ns (default now). step_ns: chunk step."""
        p, d = self.policy, self.policy.cfg.n_joints
        self.planner.start(t_start_ns) if budget else self.planner.unlimited()
        drafter = self.drafter if self.cfg.decode == "speculative" else None
        if drafter is not None:
            drafter.reset(obs.q_rad, obs.qd_rad_s, obs.q_prev_rad)
        res = speculative_decode(self.engine, p.features(obs.q_rad, obs.qd_rad_s, obs.q_prev_rad),
                                 p.cfg.n_tokens, drafter, self.planner, self.rule)
        tokens = res.tokens
        if res.complete:
            rung = "full"
        elif len(tokens) >= d:
            rung, tokens = "partial", tokens[: len(tokens) // d * d]
        elif drafter is not None:
            rung, tokens = "draft", tokens + drafter.propose(tokens, p.cfg.n_tokens - len(tokens))
        else:
            rung, tokens = "continue", []
        steps = obs.q_rad + p.tokenizer.decode(np.array(tokens, dtype=np.int64)) if tokens else np.zeros((0, d))
        self.n_chunks += 1
        return ActionChunk(
            seq=self.n_chunks, obs_seq=obs.seq, t_obs_ns=obs.t_ns, t_ready_ns=now_ns(), step_ns=step_ns,
            steps_rad=np.vstack([obs.q_rad[None, :], steps]), rung=rung, tokens=len(res.tokens),
            target_passes=res.target_passes, drafted=res.drafted, accepted=res.accepted)


def serve(cfg: RuntimeConfig, endpoints: transport.Endpoints, handshake_timeout_s: float = 300.0) -> int:
    """Run the runtime node until a Stop message (or SIGTERM). Returns the number of chunks sent."""
    parent = ParentWatch()
    warning = pin_to_cpus(cfg.runtime_cpus)  # before the engine starts its threads
    if warning:
        print(f"runtime: {warning}", flush=True)
    if cfg.byo_spec is not None:
        import torch

        from edgeinfer.engines.byo import ByoRuntime

        torch.set_num_threads(cfg.threads)
        runtime = ByoRuntime(cfg.byo_spec, cfg.byo_model)
    else:
        runtime = PolicyRuntime(cfg)
    stop = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
    ctx = zmq.Context()
    try:
        obs_rx = transport.Receiver(transport.sub(ctx, endpoints.obs))
        chunk_pub = transport.pub(ctx, endpoints.chunks, bind=True)
        ready = transport.push(ctx, endpoints.ready)
        start = _handshake(runtime, obs_rx, chunk_pub, ready, handshake_timeout_s, parent)
        replan_every, step_ns = runtime.chunk_timing(start.period_ns)
        what = f"bring-your-own {cfg.byo_spec}" if cfg.byo_spec else f"{cfg.decode} on {cfg.backend} {cfg.precision}"
        print(f"runtime: started ({what}, budget {cfg.scheduler.budget_ms} ms)", flush=True)
        next_seq, last_msg_ns = 0, now_ns()
        budget_ns = int(cfg.scheduler.budget_ms * 1e6)
        while not stop["flag"]:
            msg = obs_rx.recv_latest(100)  # latest-only: a stale observation is worse than none
            if msg is None:
                if now_ns() - last_msg_ns > cfg.idle_timeout_s * 1e9:
                    print(f"runtime: no message for {cfg.idle_timeout_s} s; exiting", flush=True)
                    break
                continue
            last_msg_ns = now_ns()
            if isinstance(msg, Stop):
                break
            if isinstance(msg, Observation) and msg.seq >= next_seq:
                next_seq = msg.seq + replan_every
                # The budget runs from when the observation was taken (same-host monotonic clock), so time
                # spent in transport counts; a timestamp from another clock falls back to receipt time.
                age_ns = last_msg_ns - msg.t_ns
                t_start = msg.t_ns if 0 <= age_ns < budget_ns else last_msg_ns
                transport.send(chunk_pub, runtime.step(msg, t_start, step_ns))
        print(f"runtime: {runtime.n_chunks} chunks sent; observations skipped as stale {obs_rx.stale_dropped}; "
              f"malformed messages {obs_rx.malformed} (last: {obs_rx.last_error or '-'})", flush=True)
        return runtime.n_chunks
    finally:
        ctx.destroy(linger=0)


def _handshake(runtime, obs_rx, chunk_pub, ready, timeout_s: float, parent: ParentWatch) -> Start:
    """Warm up, then publish Hellos on the chunk PUB (for its subscribers) until Start arrives."""
    runtime.warmup(runtime.warmup_observation())
    announced, i = False, 0
    deadline = now_ns() + int(timeout_s * 1e9)
    while now_ns() < deadline:
        parent.check()
        transport.send(chunk_pub, Hello("runtime", i, now_ns()))
        i += 1
        msg = obs_rx.recv(transport.HELLO_PERIOD_MS)
        if isinstance(msg, Hello) and not announced:
            announced = transport.announce_ready(ready, "runtime")
        elif isinstance(msg, Start):
            return msg
        elif isinstance(msg, Stop):
            raise RuntimeError(f"stopped before start: {msg.reason}")
    raise TimeoutError("runtime: no Start message")
