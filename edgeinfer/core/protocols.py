"""The seams between the parts: what the speculative decoder needs from its target engine and its drafter, and
what the runtime node needs from a runtime.

An engine is the target policy compiled for one backend, precision and device, decoding one sequence
(batch 1) with a static KV cache. The speculative decoder (edgeinfer.core.speculative) calls only this:

    engine.forward(obs, tokens, start) -> logits (T, n_bins) float32
        One target pass over sequence positions start .. start+T-1.
        start == 0 (prefill): obs (obs_dim,) float32 fills position 0 and tokens fill positions 1..;
        for a token-prefix model (engines/models/model_protocol.py, prefix kind "tokens") obs is the prompt (P,)
        int, which plays position 0's role: the prefill's row 0 predicts the first generated token;
        start >= 1: obs is None and tokens (T of them) fill positions start.. .
        Logits row i predicts action token start + i (position p predicts token p).
    engine.rollback(n)
        Forget positions >= n (rejected drafts). Every backend here writes its cache by position, so a
        later pass overwrites those entries before any query can see them (a query at position p attends
        to positions <= p only) and rollback costs nothing; an engine whose cache grows by appending must
        truncate it here.

A drafter proposes k tokens after `tokens` (greedy: `propose`; sampling: `propose_dist`, which also returns
the (k, n_bins) proposal distribution q that the acceptance rule needs); `reset` gives it the observation the
chunk starts from (q_rad (D,), qd_rad_s (D,), q_prev_rad (D,) float64). Implementations live in
edgeinfer.engines (engines/models/drafters.py, engines/*_engine.py).

A runtime turns one observation into one ActionChunk within a budget (`Runtime`); the runtime node
(edgeinfer/node/serve.py) drives it through that protocol only, whichever it is: the action-token policy
(node/runtime.PolicyRuntime), the null policy (node/runtime.NullRuntime), a bring-your-own spec
(engines/byo.ByoRuntime) or a fault drill's wrapper (node/faults.NonFiniteRuntime).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Protocol, Sequence, runtime_checkable

import numpy as np

from edgeinfer.core.wire import ActionChunk, Observation


class Engine(Protocol):
    backend: str
    precision: str
    device: str
    cfg: Any  # the model's config (PolicyConfig for the action policy): the decoder never reads it

    def forward(self, obs: np.ndarray | None, tokens: Sequence[int], start: int) -> np.ndarray: ...

    def rollback(self, n: int) -> None: ...


class Pass(NamedTuple):
    """One sequence's share of a batched target pass (BatchedEngine.forward_batch)."""

    slot: int  # its KV-cache slot, 0..n_slots-1
    obs: np.ndarray | None  # (obs_dim,) float32 when start == 0 (the prefill), else None
    tokens: tuple[int, ...]  # as Engine.forward: start == 0: positions 1..; else positions start..
    start: int


class BatchedEngine(Protocol):
    """The target over several sequences at once (a fleet, core/fleet_batching.py), each in its own KV-cache slot.

    forward_batch(passes) -> logits per pass, (T_i, n_bins) float32, in order, exactly what Engine.forward would
    return for that slot alone: the logits of a pass never depend on which other passes share the call (batch
    invariance, so a robot's greedy tokens are the same whoever else is served). At most one pass per slot per
    call; slots are written by position, so rollback is a no-op, as in every engine here."""

    backend: str
    precision: str
    device: str
    cfg: Any
    n_slots: int

    def forward_batch(self, passes: Sequence[Pass]) -> list[np.ndarray]: ...


class Drafter(Protocol):
    name: str

    def reset(self, q_rad: np.ndarray, qd_rad_s: np.ndarray, q_prev_rad: np.ndarray) -> None: ...

    def propose(self, tokens: Sequence[int], k: int) -> list[int]: ...

    def propose_dist(self, tokens: Sequence[int], k: int, warp: Callable[[np.ndarray], np.ndarray],
                     rng: np.random.Generator) -> tuple[list[int], np.ndarray]: ...


@runtime_checkable
class Runtime(Protocol):
    """One ActionChunk per observation, within the budget the node sets: everything the runtime node
    (edgeinfer/node/serve.py) and its handshake (node/handshake.py) call on a runtime, and nothing else.

    The node's order: warmup(warmup_observation()) before the Start; chunk_timing(period_ns) and
    set_budget_ms(budget_ms) once the Start names the control period (again at each new Start); then step() per
    observation decoded, reset() when the observation source restarts. Times are monotonic ns (core/clock.now_ns),
    joint values rad as on the wire (core/wire.py)."""

    # D, the joints of the observations it takes (the node's receiver refuses others); None: any D
    n_joints: int | None
    n_chunks: int  # chunks made since the warm-up ended (the node's chunks_sent, and what serve() returns)
    # backend auto's choice (engines/backends/auto.py open_auto: "chosen", "why", "excluded", "candidates", ...), named
    # in the node's start line and counted in its Stats; None: no engine was chosen at start-up
    engine_choice: dict | None = None
    # the target engine (Engine above), what a fault drill slows (node/faults.py); None: no separate target engine
    engine: Engine | None = None

    def warmup_observation(self) -> Observation | None:
        """The observation to warm up on (the policy's rest or mean state); None: one that needs none."""
        ...

    def warmup(self, obs: Observation | None) -> None:
        """Decode unbudgeted chunks of obs (warmup_observation()), so that first-call costs are paid and cost
        estimates exist before the Start; n_chunks is 0 after it."""
        ...

    def chunk_timing(self, period_ns: int) -> tuple[int, int]:
        """(replan_every: control ticks between chunk starts >= 1, step_ns: the chunk step in ns) for a control
        period of period_ns (> 0, checked by the node). Raises ValueError for a period it cannot serve (the node
        then refuses that Start)."""
        ...

    def set_budget_ms(self, budget_ms: float) -> None:
        """Decode each chunk within budget_ms from its t_start_ns (SchedulerConfig.resolved_budget_ms, once the
        period is known). A runtime with nothing to cut short ignores it."""
        ...

    def reset(self) -> None:
        """A new episode (the observation source restarted): a stateful policy's state back to its start. Chunk
        numbering (n_chunks) continues."""
        ...

    def observe_costs(self, observer: Callable[[str, int], None]) -> None:
        """Hand every decode-cost sample its planner takes to observer(name, duration_ns) too (core/scheduler.py
        LatencyModel.observer: the node's histograms). A runtime with no planner has none to hand."""
        ...

    def step(self, obs: Observation, t_start_ns: int | None, step_ns: int, *,
             on_first_step: Callable[[ActionChunk], None] | None = None) -> ActionChunk:
        """The chunk for obs: steps_rad (1 + rows, D) float64 rad, the anchor obs.q_rad then one row per chunk
        step, step_ns apart; the budget runs from t_start_ns (None: now). on_first_step(chunk), when given, may
        receive the chunk's first verified step before the rest is decoded (time to first action); a runtime
        whose chunk is ready at once never calls it. A chunk may hold non-finite actions (a diverged policy): the
        node never publishes those. Raises core.wire.ObservationMismatch for an observation it cannot read (its
        joint count, a channel it lacks): the node counts it and goes on."""
        ...
