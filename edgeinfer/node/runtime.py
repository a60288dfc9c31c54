"""The runtime: the policy, its target engine, its drafters and the deadline planner, which turn one observation into
one ActionChunk: observation -> tokens -> verified chunk under the tick's budget -> ActionChunk. PolicyRuntime (the
action-token policy) and NullRuntime (a chunk that costs nothing) are Runtimes (core/protocols.py), as is
engines/byo.ByoRuntime; make_runtime picks the one a RuntimeConfig asks for.

Fallback ladder when the budget cannot hold the full plan, best first (every chunk names its rung):
    full      every action token verified by the target
    coarse    DCT tokens (engines/models/dct_tokenizer.py): the whole horizon from the coefficient rows verified so far
    partial   step tokens (engines/models/tokenizer.py): at least one whole step verified, the rest of the horizon the
              drafter's tokens after the verified prefix, unverified (ActionChunk.tokens: how many were verified)
    draft     no whole row verified: the verified prefix plus the drafter's tokens, unverified
    continue  nothing new: the control loop keeps the previous chunk
(the last rung, hold, is the control loop's watchdog.) Every rung covers at least the horizon of the rung below it:
a chunk of 1-2 verified steps covers 20-40 ms, which a slow policy or a caller at 25 Hz has passed before it uses
the chunk, so a partial chunk is completed as a draft is. A coarse chunk is cut at its last whole row of D tokens
(one coefficient of every joint), which already spans the horizon; a chunk cut short names the tokenizer's
prefix_rung.

The runtime node around it (sockets, handshake, the loop, liveliness, telemetry: `edgeinfer serve`) is
edgeinfer/node/serve.py; it drives a runtime through the Runtime protocol only.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

import numpy as np

from edgeinfer.core.acceptance import Greedy, Relaxed, Sampling
from edgeinfer.core.clock import now_ns
from edgeinfer.core.protocols import Drafter, Runtime
from edgeinfer.core.scheduler import SchedulerConfig, TickPlanner
from edgeinfer.core.speculative import DecodeResult, speculative_decode
from edgeinfer.core.wire import ActionChunk, Observation, ObservationMismatch
from edgeinfer.engines.models.drafters import DRAFTERS, applicable_drafters, make_drafter
from edgeinfer.engines.models.paths import DEFAULT_POLICY, MAX_WEIGHTS_MB, resolve_policy, serve_defaults
from edgeinfer.engines.models.tokenizer import decode_chunk
from edgeinfer.node.faults import FaultConfig

DECODES = ("speculative", "target-only")
Backend = Literal["auto", "torch", "onnxruntime", "tensorrt", "fused", "packed"]  # the engines a runtime may run on
MODES = ("ultrafast", "standard")
OBS_CLOCKS = ("auto", "host", "other")
# the exact preset of mode "ultrafast": the fastest exact engine, drafts that cost almost nothing, greedy acceptance
ULTRAFAST = {"backend": "auto", "precision": "fp32", "decode": "speculative", "drafter": "kinematic",
             "acceptance": "greedy"}


@dataclass
class RuntimeConfig:
    """The runtime node: the policy it serves, the engine the target runs on (edgeinfer.engines.backends.engine), how
    chunks are decoded and verified, and its liveliness and status messages."""

    # The policy's manifest JSON (the built-in policy, or a factory: engines/models/factory.py), or a shipped policy's
    # name: default, large (3.2 M parameters), dct. Its manifest's "serve" table may recommend a drafter and threads,
    # used where those are not given (the large policy: its learned drafter, on two threads).
    policy: Path = DEFAULT_POLICY
    # the preset: ultrafast (exact: backend auto, fp32, speculative, kinematic drafter, greedy acceptance, any of those
    # set otherwise refused) or standard (the fields as given)
    mode: Literal["ultrafast", "standard"] = "standard"
    # the engine the target runs on (auto: the fastest exact fp32 engine here, measured at start-up,
    # engines/backends/auto.py)
    backend: Backend = "auto"
    precision: Literal["fp32", "bf16", "fp8", "int8"] = "fp32"  # the engine's precision (bf16, fp8, int8: LOSSY)
    device: str = "cpu"  # the engine's device (cpu, cuda, cuda:1, ...)
    decode: Literal["speculative", "target-only"] = "speculative"  # draft and verify, or the target alone
    # a drafter by name, or "auto": every drafter that applies to the policy, the scheduler choosing one per chunk
    # (None: the one the policy's manifest recommends, else kinematic)
    drafter: str | None = None
    # the acceptance rule: greedy (exact), sampling (exact in distribution: temperature, top_p, seed) or relaxed
    # (LOSSY: drafts kept within relax_bins bins of the target's choice); edgeinfer.core.acceptance
    acceptance: Literal["greedy", "sampling", "relaxed"] = "greedy"
    temperature: float = 1.0  # sampling acceptance: the target's softmax temperature
    top_p: float = 1.0  # sampling acceptance: nucleus (top-p) mass kept
    seed: int = 0  # sampling acceptance: seed of its random generator
    relax_bins: int = 1  # relaxed acceptance: a draft within this many bins of the target's choice is kept
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)  # the deadline planner
    warmup_chunks: int = 30  # untimed decodes before the start (fills the planner's cost estimates)
    # CPU threads of the engine (intra-op for torch and onnxruntime; the packed engine uses at most 2: a pass shared by
    # two threads); None: what the policy's manifest recommends, else 1
    threads: int | None = None
    # Start a new chunk at most every this many observations; the chunk horizon covers the gap, and the idle time
    # is left to the control loop (None: one chunk step, the policy's stride_ticks: 5 ticks, 20 ms, for the Schunk
    # policy at 250 Hz; 1 tick for a policy trained at 30 Hz with one tick per step).
    replan_every_ticks: int | None = None
    # After the start, exit when the control loop has been gone this long (no Heartbeat on the status SUB), s; before
    # its first Heartbeat (or with no status endpoint), when no message of the observation source came for this long.
    # A gap in the observations while the control loop beats never ends the run.
    idle_timeout_s: float = 5.0
    runtime_cpus: list[int] | None = None  # CPUs the runtime may use (None: any)
    # bring your own policy: a spec TOML (engines/models/byo.py) served instead of `policy`
    byo_spec: Path | None = None
    byo_model: Path | None = None  # the spec's model file replaced by this one (e.g. its TorchScript twin)
    # Publish each chunk's first verified action step as soon as it exists, then the whole chunk.
    stream_first_step: bool = True
    null_policy: bool = False  # serve NullRuntime (a chunk holding the observed position, at once): benchmarks
    # Run a factory policy's code (engines/models/factory.py): a policy folder with a factory is code, loaded only when
    # asked.
    trust_policy_code: bool = False
    max_policy_weights_mb: float = MAX_WEIGHTS_MB  # the cap of one policy weights file, MB (checked while read)
    # Observations older than this when they arrive are dropped and counted (obs_stale), ms; None: off (another
    # host's clock).
    max_obs_age_ms: float | None = 50.0
    # The clock observation timestamps are on: "host" (this host's CLOCK_MONOTONIC: ages are true, a late stream is
    # stale, never an offset), "other" (another host's: an offset is estimated from the delay floor, and ages are
    # read against it; HIL, a robot's PC), or "auto" ("host" when the observation endpoint is on this host:
    # loopback, ipc, inproc; else "other"). edgeinfer/node/source.py.
    obs_clock: Literal["auto", "host", "other"] = "auto"
    # Sleep until this long before the next observation to decode is due, then spin until this long after it, us: it
    # arrives to a loop already awake (no wake-up cost); 0: sleep until it arrives. No spin when no stream is due.
    obs_spin_us: float = 300.0
    runtime_heartbeat_ms: float = 2.0  # Heartbeat period on the chunk PUB, ms
    # The liveliness lease, ms: the control loop deems the runtime dead after this long unheard. A killed process
    # closes its sockets only after the kernel has torn down its memory (tens of ms for torch), so the lease is
    # what detects death within two control periods (8 ms at 250 Hz).
    runtime_lease_ms: float = 6.0
    runtime_stats_ms: float = 200.0  # Stats period on the chunk PUB, ms
    faults: FaultConfig = field(default_factory=FaultConfig)  # fault injection (edgeinfer.node.faults); off by default
    # Bind a round-trip echo here (start_echo), for `edgeinfer hil` to measure the bare network; None: off.
    echo_endpoint: str | None = None

    def __post_init__(self):
        self.policy = resolve_policy(self.policy)
        recommended = serve_defaults(self.policy)  # what the policy's manifest recommends for itself
        if self.mode not in MODES:
            raise ValueError(f"RuntimeConfig.mode must be one of {MODES}, got {self.mode!r}")
        if self.mode == "ultrafast":  # the manifest's drafter (exact too) replaces the preset's
            self._apply_preset({**ULTRAFAST, **{k: v for k, v in recommended.items() if k in ULTRAFAST}})
        if self.drafter is None:
            self.drafter = recommended.get("drafter", "kinematic")
        if self.threads is None:
            self.threads = recommended.get("threads", 1)
        if self.backend == "auto" and self.precision != "fp32":
            raise ValueError(f"RuntimeConfig: backend 'auto' runs exact engines only (fp32); precision "
                             f"{self.precision!r} is lossy: name its backend (torch for bf16 or fp8, onnxruntime "
                             "for int8)")
        if self.decode not in DECODES:
            raise ValueError(f"RuntimeConfig.decode must be one of {DECODES}, got {self.decode!r}")
        if self.drafter != "auto" and self.drafter not in DRAFTERS:
            source = f" (the serve table of {self.policy})" if recommended.get("drafter") == self.drafter else ""
            raise ValueError(f"RuntimeConfig.drafter must be 'auto' or one of {sorted(DRAFTERS)}, "
                             f"got {self.drafter!r}{source}")
        self.rule()  # validates temperature, top_p, relax_bins
        if self.threads < 1:
            raise ValueError(f"RuntimeConfig.threads must be >= 1, got {self.threads}")
        if not self.idle_timeout_s > 0:
            raise ValueError(f"RuntimeConfig.idle_timeout_s must be > 0, got {self.idle_timeout_s}")
        if self.replan_every_ticks is not None and self.replan_every_ticks < 1:
            raise ValueError(f"RuntimeConfig.replan_every_ticks must be >= 1, got {self.replan_every_ticks}")
        if self.max_obs_age_ms is not None and not self.max_obs_age_ms > 0:
            raise ValueError(f"RuntimeConfig.max_obs_age_ms must be > 0 (or None), got {self.max_obs_age_ms}")
        if self.obs_clock not in OBS_CLOCKS:
            raise ValueError(f"RuntimeConfig.obs_clock must be one of {OBS_CLOCKS}, got {self.obs_clock!r}")
        if not 0 <= self.obs_spin_us <= 10_000:
            raise ValueError(f"RuntimeConfig.obs_spin_us must be in [0, 10000], got {self.obs_spin_us}")
        if not 0 < self.runtime_heartbeat_ms < self.runtime_lease_ms:
            raise ValueError(f"RuntimeConfig: need 0 < runtime_heartbeat_ms < runtime_lease_ms, got "
                             f"{self.runtime_heartbeat_ms}, {self.runtime_lease_ms}")
        if not self.runtime_stats_ms > 0:
            raise ValueError(f"RuntimeConfig.runtime_stats_ms must be > 0, got {self.runtime_stats_ms}")
        if not self.max_policy_weights_mb > 0:
            raise ValueError(f"RuntimeConfig.max_policy_weights_mb must be > 0, got {self.max_policy_weights_mb}")

    def _apply_preset(self, preset: dict) -> None:
        """Set the preset's fields; one set to neither its default nor the preset's value is refused (ValueError
        naming the fields): the preset is exact, an explicit lossy precision or acceptance contradicts it."""
        defaults = {f.name: f.default for f in dataclasses.fields(self) if f.name in preset}
        conflicts = {k: getattr(self, k) for k, v in preset.items() if getattr(self, k) not in (v, defaults[k])}
        if conflicts:
            raise ValueError(f"RuntimeConfig: mode {self.mode!r} sets {preset}; conflicting fields "
                             f"{conflicts} (use mode 'standard' to set them)")
        for k, v in preset.items():
            setattr(self, k, v)

    def rule(self) -> Greedy | Relaxed | Sampling:
        """The acceptance rule this configuration asks for (a fresh one: Sampling carries its own rng)."""
        if self.acceptance == "sampling":
            return Sampling(self.temperature, self.top_p, self.seed)
        return Relaxed(self.relax_bins) if self.acceptance == "relaxed" else Greedy()


class PolicyRuntime(Runtime):
    """The action-token policy as a Runtime (core/protocols.py): one ActionChunk per observation, speculatively decoded
    within the scheduler's budget; the fallback ladder (module docstring) when the budget cannot hold the full plan."""

    def __init__(self, cfg: RuntimeConfig):
        # torch: only a node that runs the policy loads it
        from edgeinfer.engines.models.served import load_served_policy, open_engine

        self.cfg = cfg
        # the built-in policy, or a factory policy (engines/models/factory.py: refused here if its load checks fail)
        self.policy = load_served_policy(cfg.policy, cfg.trust_policy_code, cfg.max_policy_weights_mb)
        self.n_joints = self.policy.cfg.n_joints  # D of the observations it takes (serve.py's receiver checks it)
        names = applicable_drafters(self.policy) if cfg.drafter == "auto" else [cfg.drafter]
        self.drafters = {n: make_drafter(n, self.policy) for n in names} if cfg.decode == "speculative" else {}
        self.fallback = self.drafters.get("kinematic") or next(iter(self.drafters.values()), None)
        self.engine_choice: dict | None = None  # backend auto: which engine and why (engines/backends/auto.py)
        if cfg.backend == "auto":  # measured with the drafter and k the chunks will use
            from edgeinfer.engines.backends.auto import PROBE_K, open_auto

            self.engine, self.engine_choice = open_auto(self.policy, cfg.device, cfg.threads, self.fallback,
                                                        min(cfg.scheduler.k_max, PROBE_K))
        else:
            self.engine = open_engine(self.policy, cfg.backend, cfg.precision, cfg.device, cfg.threads)
        self.rule = cfg.rule()
        k_max = cfg.scheduler.k_max if cfg.decode == "speculative" else 0
        self.planner = TickPlanner(dataclasses.replace(cfg.scheduler, k_max=k_max), list(self.drafters),
                                   row_tokens=self.policy.cfg.n_joints)  # a cut chunk ends on a row of D tokens
        self.n_chunks = 0

    def chunk_timing(self, period_ns: int) -> tuple[int, int]:
        """(control ticks between chunk starts, chunk step in ns) for a control period of period_ns."""
        return self.cfg.replan_every_ticks or self.policy.cfg.stride_ticks, period_ns * self.policy.cfg.stride_ticks

    def set_budget_ms(self, budget_ms: float) -> None:
        """Decode each chunk within budget_ms (SchedulerConfig.resolved_budget_ms, once the period is known)."""
        self.planner.set_budget_ms(budget_ms)

    def reset(self) -> None:
        """A new episode (the observation source restarted): nothing to do, each chunk decodes from its own
        observation."""

    def observe_costs(self, observer: Callable[[str, int], None]) -> None:
        """The planner's cost samples to observer(name, duration_ns) too (after the warm-up: the node's histograms)."""
        self.planner.latency.observer = observer

    def warmup_observation(self) -> Observation:
        """The policy's warm-up state (the training data's mean for the built-in policy), for warm-up before the
        start."""
        return Observation(0, now_ns(), *self.policy.warmup_state())

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

        on_first_step(chunk), when given, receives the chunk's first verified row of D tokens as soon as the target
        has verified it (same observation, rung tokenizer.prefix_rung: one step, `partial`, for step tokens; the
        whole horizon from coefficient 0, `coarse`, for DCT tokens), before the rest is decoded: the control loop
        can act on the new observation one chunk earlier (time to first action)."""
        p, d = self.policy, self.policy.cfg.n_joints
        if obs.q_rad.shape != (d,):
            raise ObservationMismatch(f"{obs.q_rad.shape[0]} joints, the policy has {d}")
        self.planner.start(t_start_ns) if budget else self.planner.unlimited()
        chosen = self.planner.choose()  # this chunk's drafter (None: target-only)
        drafter = self.drafters[chosen] if chosen is not None else None
        for dr in {drafter, self.fallback} - {None}:  # model drafters defer their prefill to their first proposal
            dr.reset(obs.q_rad, obs.qd_rad_s, obs.q_prev_rad)
        first_sent = on_first_step is None
        # the rung of a chunk cut at a row boundary; a factory's tokenizer without one decodes step-major (its
        # contract, engines/models/factory.py)
        prefix_rung = getattr(p.tokenizer, "prefix_rung", "partial")

        def publish_first_step(tokens: list[int]) -> None:
            nonlocal first_sent
            if not first_sent and d <= len(tokens) < p.cfg.n_tokens:
                first_sent = True
                on_first_step(self._chunk(obs, tokens[:d], prefix_rung, step_ns, None, count=False))

        res = speculative_decode(self.engine, p.features(obs.q_rad, obs.qd_rad_s, obs.q_prev_rad),
                                 p.cfg.n_tokens, drafter, self.planner, self.rule, publish_first_step)
        rung, tokens = chunk_rung(res, p.cfg.n_tokens, d, prefix_rung, drafter or self.fallback)
        return self._chunk(obs, tokens, rung, step_ns, res)

    def _chunk(self, obs: Observation, tokens: list[int], rung: str, step_ns: int, res, count: bool = True
               ) -> ActionChunk:
        """The ActionChunk of `tokens` (build_chunk); res: the DecodeResult behind it (None: an early first step,
        whose counts arrive with the rest)."""
        seq = self.n_chunks + 1  # an early first step carries the seq of the chunk it belongs to
        self.n_chunks += count
        return build_chunk(self.policy, obs, tokens, rung, step_ns, seq, res)


def chunk_rung(res: DecodeResult, n_tokens: int, row_tokens: int, prefix_rung: str, drafter: Drafter | None
               ) -> tuple[str, list[int]]:
    """The fallback ladder (module docstring) for a decode that ended: (rung, tokens), every rung covering at least
    the horizon of the rung below it. Every token verified: full. Step tokens: the verified prefix completed to
    n_tokens by `drafter` (its proposal after the verified tokens, unverified), rung partial with at least one
    whole row of row_tokens verified, else draft; with no drafter (target-only), a partial chunk repeats its last
    verified row (the kinematic drafter's rule: a step token is an increment, so constant velocity) and a
    draft is continue, no tokens. The verified tokens come first and unchanged (exactness); res.tokens counts them.
    A tokenizer that completes any prefix of whole rows (prefix_rung "coarse": DCT tokens, a departure from the
    constant-velocity chunk) is cut at its last whole row, and drafts with no token at all: no row decodes to the
    constant-velocity chunk itself, the kinematic drafter's chunk, which a part of coefficient 0 beside another
    drafter's higher coefficients would shift at every step (build_chunk decodes it)."""
    tokens = res.tokens
    if res.complete:
        return "full", tokens
    whole = len(tokens) // row_tokens * row_tokens
    if prefix_rung == "coarse":
        if whole:
            return prefix_rung, tokens[:whole]
        return ("draft", []) if drafter is not None else ("continue", [])
    rung = prefix_rung if whole else "draft"
    if drafter is not None:
        return rung, tokens + drafter.propose(tokens, n_tokens - len(tokens))
    if whole:
        return rung, tokens[:whole] + tokens[whole - row_tokens:whole] * ((n_tokens - whole) // row_tokens)
    return "continue", []


def build_chunk(policy, obs: Observation, tokens: list[int], rung: str, step_ns: int, seq: int,
                res: DecodeResult | None) -> ActionChunk:
    """The ActionChunk of `tokens` (a multiple of D) for `obs`: steps_rad (rows, D) float64 rad, the anchor row
    obs.q_rad then the rows the tokens decode to (one per whole row for step tokens, H for DCT tokens: decode_chunk);
    ready now. res: the DecodeResult behind it, for its counts (None: the tokens alone)."""
    d = policy.cfg.n_joints
    # DCT tokens are taken about the constant-velocity chunk of q - q_prev (engines/models/dct_tokenizer.py)
    steps = (obs.q_rad + decode_chunk(policy.tokenizer, np.array(tokens, dtype=np.int64), obs.q_rad - obs.q_prev_rad)
             if tokens or rung == "draft" else np.zeros((0, d)))
    return ActionChunk(
        seq=seq, obs_seq=obs.seq, t_obs_ns=obs.t_ns, t_ready_ns=now_ns(), step_ns=step_ns,
        steps_rad=np.vstack([obs.q_rad[None, :], steps]), rung=rung, tokens=len(res.tokens) if res else len(tokens),
        target_passes=res.target_passes if res else 0, drafted=res.drafted if res else 0,
        accepted=res.accepted if res else 0)


class NullRuntime(Runtime):
    """A policy that costs nothing: each chunk holds the observed position for one chunk step. Serves transport
    benchmarks and drills (RuntimeConfig.null_policy), through the same node loop as the real policy. A Runtime
    (core/protocols.py) with no engine and no planner."""

    n_joints = None  # any D: it holds whatever position it is sent

    def __init__(self, cfg: RuntimeConfig, stride_ticks: int = 5):
        self.cfg, self.stride_ticks, self.n_chunks = cfg, stride_ticks, 0

    def chunk_timing(self, period_ns: int) -> tuple[int, int]:
        return self.cfg.replan_every_ticks or self.stride_ticks, period_ns * self.stride_ticks

    def set_budget_ms(self, budget_ms: float) -> None:
        pass  # a chunk that costs nothing has no budget to keep

    def reset(self) -> None:
        pass  # stateless

    def warmup_observation(self) -> None:
        return None

    def warmup(self, obs) -> None:
        pass

    def observe_costs(self, observer: Callable[[str, int], None]) -> None:
        pass  # no planner, no costs

    def step(self, obs: Observation, t_start_ns: int | None = None, step_ns: int = 20_000_000,
             budget: bool = True, on_first_step: Callable[[ActionChunk], None] | None = None) -> ActionChunk:
        """steps_rad (2, D): obs.q_rad twice, step_ns apart; ready at once (on_first_step is never called)."""
        self.n_chunks += 1
        return ActionChunk(seq=self.n_chunks, obs_seq=obs.seq, t_obs_ns=obs.t_ns, t_ready_ns=now_ns(), step_ns=step_ns,
                           steps_rad=np.vstack([obs.q_rad, obs.q_rad]), rung="full", tokens=0, target_passes=0,
                           drafted=0, accepted=0)


def make_runtime(cfg: RuntimeConfig) -> Runtime:
    """The runtime `cfg` asks for: the null policy, a bring-your-own spec, or the action-token policy."""
    if cfg.null_policy:
        runtime = NullRuntime(cfg)
    elif cfg.byo_spec is not None:
        import torch

        from edgeinfer.engines.models.byo import ByoRuntime

        torch.set_num_threads(cfg.threads)
        runtime = ByoRuntime(cfg.byo_spec, cfg.byo_model)
    else:
        runtime = PolicyRuntime(cfg)
    return runtime

