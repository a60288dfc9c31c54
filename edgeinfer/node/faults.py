"""Fault injection for the runtime node: a slowed engine and a policy that returns non-finite actions.

Off by default, and then nothing is wrapped: the hot path is the plain engine and runtime. Turned on by
RuntimeConfig.faults (CLI `--fault-pass-delay-ms`, `--fault-nonfinite-every`), so a drill runs the real
node, processes and sockets with one fault added.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from edgeinfer.core.clock import now_ns, sleep_until
from edgeinfer.core.protocols import Engine, Runtime
from edgeinfer.core.wire import ActionChunk, Observation


@dataclass
class FaultConfig:
    """Fault injection inside the runtime (off by default)."""

    # Every target pass (prefill included) takes this much longer, ms (a slowed engine).
    fault_pass_delay_ms: float = 0.0
    # Every Nth chunk the policy's actions are NaN (odd N-th) or +inf (even); 0 = off.
    fault_nonfinite_every: int = 0

    def __post_init__(self):
        if not 0 <= self.fault_pass_delay_ms <= 10_000:
            raise ValueError(f"FaultConfig.fault_pass_delay_ms must be in [0, 10000], got {self.fault_pass_delay_ms}")
        if self.fault_nonfinite_every < 0:
            raise ValueError(f"FaultConfig.fault_nonfinite_every must be >= 0, got {self.fault_nonfinite_every}")

    @property
    def active(self) -> bool:
        return self.fault_pass_delay_ms > 0 or self.fault_nonfinite_every > 0


class SlowEngine:
    """An Engine (edgeinfer.engines.backends.engine) whose every forward pass takes `delay_ns` longer (busy-waits the
    added time, so the wall time is exact); a run of m greedy passes in one call (greedy_run, where the engine
    has one) m * delay_ns longer. The scheduler sees, and plans with, the slowed costs."""

    def __init__(self, engine, delay_ns: int):
        self.inner, self.delay_ns = engine, delay_ns

    def forward(self, obs, tokens, start: int) -> np.ndarray:
        out = self.inner.forward(obs, tokens, start)
        sleep_until(now_ns() + self.delay_ns)
        return out

    def __getattr__(self, name):  # backend, precision, device, cfg, rollback, greedy_run (slowed), ...
        attr = getattr(self.inner, name)
        if name != "greedy_run":
            return attr

        def greedy_run(committed, m: int) -> list[int]:
            out = attr(committed, m)
            sleep_until(now_ns() + m * self.delay_ns)
            return out

        return greedy_run


class NonFiniteRuntime(Runtime):
    """Wraps a Runtime (core/protocols.py: PolicyRuntime, ByoRuntime, NullRuntime): every `every`-th chunk's actions
    are replaced by NaN (odd occurrences) or +inf (even), as a diverged policy would return them. The rest of the
    protocol is the wrapped runtime's."""

    def __init__(self, runtime: Runtime, every: int):
        self.inner, self.every, self.calls, self.injected = runtime, every, 0, 0

    def step(self, obs: Observation, t_start_ns: int | None, step_ns: int, *,
             on_first_step: Callable[[ActionChunk], None] | None = None) -> ActionChunk:
        """The wrapped runtime's chunk, corrupted every `every`-th call. Nothing streams ahead of it
        (on_first_step unused): a first step sent early would be finite, and the drill is of a diverged chunk."""
        chunk = self.inner.step(obs, t_start_ns, step_ns)
        self.calls += 1
        if self.calls % self.every == 0 and len(chunk.steps_rad) > 1:
            self.injected += 1
            chunk.steps_rad = chunk.steps_rad.copy()
            chunk.steps_rad[1:, :] = np.nan if self.injected % 2 else np.inf
        return chunk

    @property
    def n_joints(self) -> int | None:
        return self.inner.n_joints

    @property
    def n_chunks(self) -> int:
        return self.inner.n_chunks

    @property
    def engine_choice(self) -> dict | None:
        return self.inner.engine_choice

    @property
    def engine(self) -> Engine | None:
        return self.inner.engine

    def warmup_observation(self) -> Observation | None:
        return self.inner.warmup_observation()

    def warmup(self, obs: Observation | None) -> None:
        self.inner.warmup(obs)

    def chunk_timing(self, period_ns: int) -> tuple[int, int]:
        return self.inner.chunk_timing(period_ns)

    def set_budget_ms(self, budget_ms: float) -> None:
        self.inner.set_budget_ms(budget_ms)

    def reset(self) -> None:
        self.inner.reset()

    def observe_costs(self, observer: Callable[[str, int], None]) -> None:
        self.inner.observe_costs(observer)


def inject(runtime: Runtime, cfg: FaultConfig) -> Runtime:
    """`runtime` with the faults of `cfg` applied (unchanged when none is on). Raises ValueError for a pass delay
    on a runtime with no target engine (Runtime.engine None: the null policy, a bring-your-own spec)."""
    if cfg.fault_pass_delay_ms > 0:
        if runtime.engine is None:
            raise ValueError("FaultConfig.fault_pass_delay_ms: this runtime has no target engine to slow")
        runtime.engine = SlowEngine(runtime.engine, int(cfg.fault_pass_delay_ms * 1e6))
    if cfg.fault_nonfinite_every > 0:
        runtime = NonFiniteRuntime(runtime, cfg.fault_nonfinite_every)
    return runtime
