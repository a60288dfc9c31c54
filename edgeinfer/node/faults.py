"""Fault injection for the runtime node: a slowed engine and a policy that returns non-finite actions.

Off by default, and then nothing is wrapped: the hot path is the plain engine and runtime. Turned on by
RuntimeConfig.faults (CLI `--fault-pass-delay-ms`, `--fault-nonfinite-every`), so a drill runs the real
node, processes and sockets with one fault added.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgeinfer.core.clock import now_ns, sleep_until
from edgeinfer.core.wire import ActionChunk


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
    """An Engine (edgeinfer.engines.engine) whose every forward pass takes `delay_ns` longer (busy-waits the
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


class NonFiniteRuntime:
    """Wraps a runtime (PolicyRuntime or ByoRuntime): every `every`-th chunk's actions are replaced by NaN
    (odd occurrences) or +inf (even), as a diverged policy would return them."""

    def __init__(self, runtime, every: int):
        self.inner, self.every, self.calls, self.injected = runtime, every, 0, 0

    def step(self, *args, **kwargs) -> ActionChunk:
        chunk = self.inner.step(*args, **kwargs)
        self.calls += 1
        if self.calls % self.every == 0 and len(chunk.steps_rad) > 1:
            self.injected += 1
            chunk.steps_rad = chunk.steps_rad.copy()
            chunk.steps_rad[1:, :] = np.nan if self.injected % 2 else np.inf
        return chunk

    def __getattr__(self, name):
        return getattr(self.inner, name)


def inject(runtime, cfg: FaultConfig):
    """`runtime` with the faults of `cfg` applied (unchanged when none is on)."""
    if cfg.fault_pass_delay_ms > 0:
        if not hasattr(runtime, "engine"):
            raise ValueError("FaultConfig.fault_pass_delay_ms: this runtime has no target engine to slow")
        runtime.engine = SlowEngine(runtime.engine, int(cfg.fault_pass_delay_ms * 1e6))
    if cfg.fault_nonfinite_every > 0:
        runtime = NonFiniteRuntime(runtime, cfg.fault_nonfinite_every)
    return runtime
