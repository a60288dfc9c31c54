"""In-process rulers of one decode mode, through the runtime's own step (PolicyRuntime, budget off so every
chunk is complete and every mode produces the same output length, H x D tokens):

    ttfa_ms              time to first action: step() called with the observation -> the chunk's first action
                         step (n_joints tokens) verified by the target (see time_to_first_action_ns)
    chunk_ms             step() called -> chunk ready
    ms_per_token         chunk wall time / tokens produced
    passes_per_token     target forward passes / tokens produced (1.0 for target-only)
    chunks_per_s         Offline: chunks decoded back to back, as fast as possible, over wall time
    tokens               (N, H*D) int64 tokens of every chunk (read back from its steps: the tokenizer's
                         decode is a cumulative sum of bin centres), for agreement with target-only
    action_rmse_rad      every chunk's steps against the recorded future of the arm
"""
from __future__ import annotations

import inspect

import numpy as np

from edgeinfer.core.clock import now_ns
from edgeinfer.core.wire import Observation
from edgeinfer.engines.models.tokenizer import encode_chunk
from edgeinfer.node.runtime import PolicyRuntime, RuntimeConfig


class FirstActionProbe:
    """Wraps a runtime's planner and notes when the first action step is verified.

    speculative_decode asks the planner before every target pass how much to verify, passing the number
    of tokens committed so far; the first call that sees >= n_joints committed tokens comes right after
    the pass that verified the first step. Everything else is forwarded to the wrapped planner.
    """

    def __init__(self, inner, n_joints: int):
        self.inner, self.n_joints = inner, n_joints
        self.t_first_ns: int | None = None

    def plan(self, committed: int, remaining: int):
        if self.t_first_ns is None and committed >= self.n_joints:
            self.t_first_ns = now_ns()
        return self.inner.plan(committed, remaining)

    def __getattr__(self, name):  # start, unlimited, record, latency, ...
        return getattr(self.inner, name)


def time_to_first_action_ns(runtime: PolicyRuntime, obs: Observation) -> tuple[int, object]:
    """(ns from the call to the first verified action step, the ActionChunk) for one unbudgeted step.

    The one place TTFA is defined for the bench. A runtime whose step takes `on_first_step` hands the first
    verified step out early as a one-step chunk: its ready time counts. Otherwise a FirstActionProbe on the
    planner notes when the first step was verified. A chunk completed by the pass that verified its first
    step (no early hand-out) gives its own ready time.
    """
    first: list = []
    t0 = now_ns()
    if _STREAMS_FIRST_STEP:
        chunk = runtime.step(obs, budget=False, on_first_step=first.append)
        return (first[0].t_ready_ns if first else chunk.t_ready_ns) - t0, chunk
    probe = runtime.planner if isinstance(runtime.planner, FirstActionProbe) else None
    if probe is None:
        probe = runtime.planner = FirstActionProbe(runtime.planner, runtime.policy.cfg.n_joints)
    probe.t_first_ns = None
    t0 = now_ns()
    chunk = runtime.step(obs, budget=False)
    return (probe.t_first_ns or chunk.t_ready_ns) - t0, chunk


_STREAMS_FIRST_STEP = "on_first_step" in inspect.signature(PolicyRuntime.step).parameters


def observations(feats: np.ndarray, n_joints: int) -> list[Observation]:
    """Observations from raw features (N, 3D): q, qd, q - q_prev (engines.policy.observation_features)."""
    d = n_joints
    return [Observation(i, 0, f[:d].copy(), f[d:2 * d].copy(), f[:d] - f[2 * d:3 * d]) for i, f in enumerate(feats)]


def chunk_tokens(runtime: PolicyRuntime, steps_rad: np.ndarray, increment_rad: np.ndarray) -> np.ndarray:
    """(H*D,) int64 tokens behind a chunk's steps (H+1, D), row 0 the observed q: the tokenizer's encoding of its
    offsets, which gives back the decoded tokens of a full chunk of either kind (decoded values are bin centres).
    A step chunk cut short gives its verified steps' tokens. increment_rad (D,): the observation's q - q_prev."""
    return encode_chunk(runtime.policy.tokenizer, steps_rad[1:] - steps_rad[0], increment_rad).reshape(-1)


def open_runtime(cfg: RuntimeConfig, warmup_obs: list[Observation]) -> PolicyRuntime:
    """A runtime for cfg, warmed up untimed: cfg.warmup_chunks decodes of the first of warmup_obs (the
    runtime's own warm-up, which also fills the scheduler's cost estimates), then one of each."""
    runtime = PolicyRuntime(cfg)
    if cfg.warmup_chunks:
        runtime.warmup(warmup_obs[0])
        for obs in warmup_obs:
            runtime.step(obs, budget=False)
    return runtime


def single_stream(runtime: PolicyRuntime, obs: list[Observation], offsets_rad: np.ndarray) -> dict:
    """One SingleStream repeat over obs (offsets_rad (N, H, D): each window's recorded future). Returns
    {ttfa_ms, chunk_ms, ms_per_token, passes_per_token: (N,) float64, tokens (N, H*D), action_rmse_rad,
    incomplete}. incomplete counts chunks that were not full (never expected: there is no budget)."""
    n = len(obs)
    out = {k: np.zeros(n) for k in ("ttfa_ms", "chunk_ms", "ms_per_token", "passes_per_token")}
    tokens, errs, incomplete = [], [], 0
    for i, o in enumerate(obs):
        t0 = now_ns()
        ttfa_ns, chunk = time_to_first_action_ns(runtime, o)
        chunk_ns = chunk.t_ready_ns - t0
        out["ttfa_ms"][i], out["chunk_ms"][i] = ttfa_ns / 1e6, chunk_ns / 1e6
        out["ms_per_token"][i] = chunk_ns / 1e6 / max(chunk.tokens, 1)
        out["passes_per_token"][i] = chunk.target_passes / max(chunk.tokens, 1)
        incomplete += chunk.rung != "full"
        tokens.append(chunk_tokens(runtime, chunk.steps_rad, o.q_rad - o.q_prev_rad))
        errs.append(chunk.steps_rad[1:] - o.q_rad - offsets_rad[i])
    out["tokens"] = np.array(tokens)
    out["action_rmse_rad"] = float(np.sqrt(np.mean(np.square(errs))))
    out["incomplete"] = incomplete
    return out


def offline(runtime: PolicyRuntime, obs: list[Observation]) -> dict:
    """One Offline repeat: every observation decoded back to back. {chunks, seconds, chunks_per_s}."""
    t0 = now_ns()
    for o in obs:
        runtime.step(o, budget=False)
    seconds = (now_ns() - t0) / 1e9
    return {"chunks": len(obs), "seconds": seconds, "chunks_per_s": len(obs) / seconds}
