"""What the speculative decoder needs from its target engine and its drafter: two small protocols.

An engine is the target policy compiled for one backend, precision and device, decoding one sequence
(batch 1) with a static KV cache. The speculative decoder (edgeinfer.core.speculative) calls only this:

    engine.forward(obs, tokens, start) -> logits (T, n_bins) float32
        One target pass over sequence positions start .. start+T-1.
        start == 0 (prefill): obs (obs_dim,) float32 fills position 0 and tokens fill positions 1..;
        for a token-prefix model (engines/model_protocol.py, prefix kind "tokens") obs is the prompt (P,)
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
edgeinfer.engines (engines/drafters.py, engines/*_engine.py).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Protocol, Sequence

import numpy as np


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
    """The target over several sequences at once (a fleet, core/fleet.py), each in its own KV-cache slot.

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
