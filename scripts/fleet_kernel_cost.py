"""Kernel cost of a 48-token chunk per robot on the batched fused engine at batch 1, 8 and 16 (a prefill pass, then
one greedy_runs call per row of D tokens, as the fleet scheduler runs target-only chunks), and of the single
FusedEngine's whole-chunk greedy_chunk, in one process (docs/fleet.md, "The batched kernel").

    .venv/bin/python scripts/fleet_kernel_cost.py       # ~20 s; median of 25 chunks after 5 warm-up ones
"""
import time

import numpy as np

from edgeinfer.core.protocols import Pass
from edgeinfer.engines.backends.fused_batched import BatchedFusedEngine
from edgeinfer.engines.backends.fused_engine import FusedEngine
from edgeinfer.engines.models.paths import DEFAULT_POLICY
from edgeinfer.engines.models.policy import load_policy

REPEATS, WARMUP = 30, 5


def batched_chunk_s(engine: BatchedFusedEngine, obs: np.ndarray, batch: int, n: int, d: int) -> float:
    """Seconds for `batch` sequences' whole chunks: one prefill pass, then a greedy run to the end of each row."""
    t0 = time.perf_counter()
    last = [int(out[-1].argmax()) for out in engine.forward_batch([Pass(s, obs[s], (), 0) for s in range(batch)])]
    start = 1
    while start < n:
        m = min(d - start % d if start % d else d, n - start)
        last = [t[-1] for t in engine.greedy_runs([(s, start, last[s], m) for s in range(batch)])]
        start += m
    return time.perf_counter() - t0


def main() -> None:
    policy = load_policy(DEFAULT_POLICY)
    obs = policy.normalise(np.tile(policy.feat_mean, (16, 1))).astype(np.float32)
    n, d = policy.cfg.n_tokens, policy.cfg.n_joints
    for batch in (1, 8, 16):
        engine = BatchedFusedEngine(policy.model, 16)
        times = [batched_chunk_s(engine, obs, batch, n, d) for _ in range(REPEATS)][WARMUP:]
        print(f"batch {batch:2d}: {np.median(times) * 1e3 / batch:.3f} ms per robot-chunk "
              f"({np.median(times) * 1e3:.2f} ms a batch)")
    single, times = FusedEngine(policy.model), []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        single.greedy_chunk(obs[0])
        times.append(time.perf_counter() - t0)
    print(f"FusedEngine alone: {np.median(times[WARMUP:]) * 1e3:.3f} ms per chunk")


if __name__ == "__main__":
    main()
