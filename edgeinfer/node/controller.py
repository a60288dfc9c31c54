"""The embeddable controller: the runtime and the control logic inside a robot controller's own process.

No sockets and no second process: the arm controller calls `Controller.step(t_ns, observation)` at its own
rate and gets a JointCommand back at once. Decoding runs on a worker thread with the same runtime and
deadline planner as `edgeinfer serve` (its budget runs from the observation's time), so a tick never waits
for the policy:

    step(t_ns, obs)   every replan_every_ticks ticks, hand obs to the decoder (latest-only: an observation
                      still waiting when a newer one arrives is dropped and counted)
                      -> the newest chunk that covers t_ns, interpolated (control/buffer.py)
                      -> clamped to the safety limits from the last command (control/safety.py)
                      -> JointCommand; with no chunk covering t_ns, the last command is held (rung "hold")

Times are on the host's monotonic clock (edgeinfer.core.clock.now_ns); the observation's t_ns is when it was
taken. torch and onnxruntime release the GIL while they compute, so the caller's thread keeps its rate.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from edgeinfer.control.buffer import ChunkBuffer
from edgeinfer.control.safety import SafetyLimits
from edgeinfer.core.clock import now_ns
from edgeinfer.core.wire import ActionChunk, JointCommand, Observation
from edgeinfer.node.runtime import PolicyRuntime, RuntimeConfig


@dataclass
class ControllerConfig:
    """period_ms: the caller's control period (the policy's chunk step is stride_ticks of it: 4 ms x 5 for the
    Schunk policy at 250 Hz). warmup: decode warm-up chunks before the first step (time to first command).
    blend_ms: cross-fade from the previous chunk's targets to a new chunk's (control/buffer.py; 0: switch at once)."""

    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    limits: SafetyLimits = field(default_factory=SafetyLimits)
    period_ms: float = 4.0
    warmup: bool = True
    blend_ms: float = 10.0

    def __post_init__(self):
        if not 0.1 <= self.period_ms <= 1000:
            raise ValueError(f"ControllerConfig.period_ms must be in [0.1, 1000], got {self.period_ms}")
        if not 0 <= self.blend_ms <= 1000:
            raise ValueError(f"ControllerConfig.blend_ms must be in [0, 1000], got {self.blend_ms}")


@dataclass
class ControllerStats:
    """Counters since open(): ticks commanded, holds (no chunk covered the tick), clamped commands, chunks
    decoded, observations dropped (a newer one replaced them before the decoder was free), decoder errors."""

    ticks: int = 0
    holds: int = 0
    clamped: int = 0
    chunks: int = 0
    obs_dropped: int = 0
    decoder_errors: int = 0
    rungs: dict = field(default_factory=dict)


class Controller:
    """Lifecycle: open() -> step() per tick -> close(); or a context manager. Not thread-safe: one caller."""

    def __init__(self, cfg: ControllerConfig | None = None):
        self.cfg = cfg or ControllerConfig()
        self.stats = ControllerStats()
        self.buffer = ChunkBuffer(blend_ns=int(self.cfg.blend_ms * 1e6))
        self.last_q: np.ndarray | None = None
        self.last_error: str | None = None
        self._ticks = 0
        self._pending: Observation | None = None
        self._wake = threading.Condition()
        self._closing = False

    def open(self) -> "Controller":
        self.runtime = PolicyRuntime(self.cfg.runtime)
        if self.cfg.warmup:
            self.runtime.warmup(self.runtime.warmup_observation())
        period_ns = int(self.cfg.period_ms * 1e6)
        self.replan_every, self.step_ns = self.runtime.chunk_timing(period_ns)
        self._worker = threading.Thread(target=self._decode_loop, name="edgeinfer-decoder", daemon=True)
        self._worker.start()
        return self

    def step(self, t_ns: int, obs: Observation) -> JointCommand:
        """The command for the tick at t_ns (monotonic ns) given the newest observation `obs` (q_rad (D,)
        float64 rad). Returns at once; never raises for a late or failing policy (it holds instead).
        Raises ValueError when obs has the wrong number of joints."""
        if len(obs.q_rad) != self.runtime.policy.cfg.n_joints:
            raise ValueError(f"Controller.step: observation has {len(obs.q_rad)} joints, the policy expects "
                             f"{self.runtime.policy.cfg.n_joints}")
        if self._ticks % self.replan_every == 0:
            with self._wake:
                self.stats.obs_dropped += self._pending is not None
                self._pending = obs
                self._wake.notify()
        self._ticks += 1
        with self._wake:
            sample = self.buffer.sample(t_ns)
        if sample is None:  # nothing covers this tick: hold the last command (or the measured position)
            q, rung, chunk_seq = (self.last_q if self.last_q is not None else obs.q_rad), "hold", -1
            self.stats.holds += 1
        else:
            q, rung, chunk_seq = sample
        reference = self.last_q if self.last_q is not None else obs.q_rad
        q, clamped = self.cfg.limits.clamp(q, reference, self.cfg.period_ms / 1e3)
        self.stats.clamped += clamped
        self.stats.ticks += 1
        self.stats.rungs[rung] = self.stats.rungs.get(rung, 0) + 1
        self.last_q = q
        return JointCommand(self._ticks - 1, obs.seq, chunk_seq, now_ns(), q, rung)

    def _decode_loop(self) -> None:
        while True:
            with self._wake:
                while self._pending is None and not self._closing:
                    self._wake.wait()
                if self._closing:
                    return
                obs, self._pending = self._pending, None
            try:
                # the first verified step goes into the buffer at once, the rest of the chunk replaces it
                chunk = self.runtime.step(obs, obs.t_ns, self.step_ns, on_first_step=self._push)
            except Exception as e:  # a failing policy must not stop the arm's controller: it holds, and says why
                self.stats.decoder_errors += 1
                self.last_error = f"{type(e).__name__}: {e}"
                continue
            self.stats.chunks += self._push(chunk)

    def _push(self, chunk: ActionChunk) -> bool:
        with self._wake:
            return self.buffer.push(chunk)

    def close(self) -> None:
        with self._wake:
            self._closing = True
            self._wake.notify()
        if hasattr(self, "_worker"):
            self._worker.join(timeout=5)

    def __enter__(self) -> "Controller":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()
