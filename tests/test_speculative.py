"""Speculative decoding is exact: token-for-token identical to target-only greedy decoding on real data."""
import numpy as np
import pytest
import torch

from edgeinfer.core.scheduler import SchedulerConfig, TickPlanner
from edgeinfer.core.speculative import speculative_decode
from edgeinfer.engines.backends.fused_engine import FusedEngine
from edgeinfer.engines.backends.torch_engine import TorchEngine
from edgeinfer.engines.models.drafters import KinematicDrafter
from edgeinfer.engines.training.evaluate import greedy_decode_batch

pytestmark = pytest.mark.background  # CPU-bound, no real-time bound (tests/conftest.py)


def _obs(policy, f):
    return torch.as_tensor(policy.normalise(f))


_ENGINES = {}


def _engine(policy, kind=TorchEngine):
    """One engine of `kind` per policy, reused across observations as the runtime does."""
    if (id(policy), kind) not in _ENGINES:
        _ENGINES[id(policy), kind] = kind(policy.model)
    return _ENGINES[id(policy), kind]


def _decode(policy, feats_row, drafter, k_max, planner=None, kind=TorchEngine):
    d = policy.cfg.n_joints
    q = np.zeros(d)
    drafter.reset(q, feats_row[d:2 * d], q - feats_row[2 * d:3 * d])
    if planner is None:
        planner = TickPlanner(SchedulerConfig(k_max=k_max, adaptive=False))
        planner.unlimited()
    return speculative_decode(_engine(policy, kind), policy.normalise(feats_row), policy.cfg.n_tokens, drafter, planner)


def test_speculative_equals_target_only_on_1000_real_observations(policy, held_out):
    """On the fused engine (the exact CPU engine, ~50x torch's passes): its speculative tokens against torch's batched
    greedy decoding. The torch engine's own: tests/test_drafters.py (every drafter and k, 64 observations)."""
    feats, _ = held_out
    idx = np.random.default_rng(0).choice(len(feats), 1000, replace=False)
    reference = greedy_decode_batch(policy.model, _obs(policy, feats[idx]))
    drafter = KinematicDrafter(policy.tokenizer)
    tokens = passes = accepted = drafted = 0
    for row, i in enumerate(idx):
        k = (1, 2, 4, 6, 8, 16)[row % 6]
        res = _decode(policy, feats[i], drafter, k, kind=FusedEngine)
        assert res.complete
        assert res.tokens == reference[row].tolist(), f"observation {i} with k={k}"
        tokens, passes = tokens + len(res.tokens), passes + res.target_passes
        accepted, drafted = accepted + res.accepted, drafted + res.drafted
    # the drafter must actually be doing the work the exactness claim is about
    assert 0.2 < accepted / drafted < 1.0
    assert tokens / passes > 1.5


def test_batch1_target_only_matches_batched_reference(policy, held_out):
    feats, _ = held_out
    idx = np.arange(0, len(feats), len(feats) // 100)[:100]
    reference = greedy_decode_batch(policy.model, _obs(policy, feats[idx]))
    for row, i in enumerate(idx):
        planner = TickPlanner(SchedulerConfig(k_max=0))
        planner.unlimited()
        res = speculative_decode(_engine(policy), policy.normalise(feats[i]), policy.cfg.n_tokens, None, planner)
        assert res.target_passes == policy.cfg.n_tokens and res.drafted == 0
        assert res.tokens == reference[row].tolist()


class _Passes:
    """A planner that allows a fixed number of target passes: a budget that runs out mid-chunk."""

    def __init__(self, passes, k):
        self.left, self.k = passes, k

    def plan(self, committed, remaining):
        if self.left == 0:
            return None
        self.left -= 1
        return 0 if committed == 0 else self.k

    def record(self, op, k, duration_ns):
        pass


def test_budget_cut_returns_a_verified_prefix(policy, held_out):
    feats, _ = held_out
    reference = greedy_decode_batch(policy.model, _obs(policy, feats[:50]))
    drafter = KinematicDrafter(policy.tokenizer)
    for row in range(50):
        res = _decode(policy, feats[row], drafter, 4, planner=_Passes(3 + row % 5, 4))
        assert res.target_passes == 3 + row % 5
        assert not res.complete and 0 < len(res.tokens) < policy.cfg.n_tokens
        assert res.tokens == reference[row, :len(res.tokens)].tolist()


def test_policy_beats_constant_velocity_on_held_out_runs(policy):
    m = policy.manifest["metrics_held_out"]
    assert m["action_rmse_rad"] < m["baseline_const_velocity_rmse_rad"]
    assert 1 not in policy.manifest["split"]["train"] and 1 in policy.manifest["split"]["held_out"]
