"""Replay Recordings built in memory (no processes), for the statistics, report, plot and compare tests.

A clean run has every command on time from a `full` chunk; degraded runs add what a fault would leave in a
real Recording: lost commands (drops), a stall (every tick in a window late by its length), or a runtime
killed at a tick (the control loop holds from then on).
"""
from __future__ import annotations

import numpy as np

from edgeinfer.core.wire import ActionChunk, JointCommand
from edgeinfer.logs.arm_log import synthetic_log
from edgeinfer.sim.metrics import summarize
from edgeinfer.sim.received import Chunks, Commands
from edgeinfer.sim.replay import Recording
from edgeinfer.sim.run_config import ReplayConfig

PERIOD_NS = 4_000_000  # 250 Hz
STRIDE = 5


def recording(seconds: float = 6.0, seed: int = 0, drop_rate: float = 0.0, stall_ms: float = 0.0,
              stall_at_s: float = 2.0, kill_at_tick: int | None = None):
    """(Recording, ArmLog) of a synthetic run. Latency of a command ~ 0.6 ms + Gamma(4, 0.15 ms); a chunk
    every STRIDE ticks, ready 2-3 ms after its observation was sent."""
    log = synthetic_log(seconds=seconds, seed=0)
    rng = np.random.default_rng(seed)
    n = len(log)
    ticks = np.arange(n)
    t0 = 1_000_000_000
    t_sched = t0 + ticks * PERIOD_NS
    t_sent = t_sched + rng.integers(5_000, 40_000, n)
    rec = Recording(t0, PERIOD_NS, n, ticks, t_sched, t_sent, Commands(n, log.n_joints), Chunks(n, 9, log.n_joints, n))
    stall = (stall_at_s * 1e9 <= ticks * PERIOD_NS) & (ticks * PERIOD_NS < stall_at_s * 1e9 + stall_ms * 1e6)
    held_q = None
    for i in range(n):
        killed = kill_at_tick is not None and i >= kill_at_tick
        if i % STRIDE == 0 and not killed:
            t_ready = int(t_sent[i] + rng.integers(2_000_000, 3_000_000))
            steps = log.q_rad[np.minimum(i + STRIDE * np.arange(9), n - 1)] + rng.normal(0, 1e-3, (9, log.n_joints))
            rec.add_chunk(t_ready + 80_000, ActionChunk(i // STRIDE, i, int(t_sched[i]), t_ready,
                                                       STRIDE * PERIOD_NS, steps, "full", 48, 12, 44, 36))
        if rng.random() < drop_rate:
            continue
        t_cmd = int(t_sched[i] + 500_000 + rng.integers(0, 50_000))
        latency = 600_000 + rng.gamma(4.0, 150_000)
        if stall[i]:
            latency += stall_ms * 1e6 - (i - np.argmax(stall)) * PERIOD_NS
        if killed:
            held_q = log.q_rad[i - 1] if held_q is None else held_q
            q, rung = held_q, "hold"
        else:
            q, rung = log.q_rad[i] + rng.normal(0, 1e-3, log.n_joints), "full"
        rec.add_command(int(t_sched[i] + latency), JointCommand(i, i, i - i % STRIDE, t_cmd, q, rung))
    return rec, log


def report(label: str = "clean", slo: str | None = None, **kwargs) -> tuple[dict, dict]:
    """summarize() of recording(**kwargs): (report dict, per-observation arrays), deadline one period."""
    rec, log = recording(**kwargs)
    cfg = ReplayConfig()
    cfg.slo = slo
    r, per_obs = summarize(rec, log, cfg, PERIOD_NS / 1e6, STRIDE)
    r["label"] = label
    return r, per_obs
