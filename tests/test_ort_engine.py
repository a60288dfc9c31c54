"""The onnxruntime backend decodes exactly as the torch backend on real held-out observations."""
import importlib.util

import numpy as np
import pytest
import torch

from edgeinfer.core.scheduler import SchedulerConfig, TickPlanner
from edgeinfer.core.speculative import speculative_decode
from edgeinfer.engines.backends.build import load_engine
from edgeinfer.engines.backends.cache import EngineCache
from edgeinfer.engines.backends.torch_engine import TorchEngine
from edgeinfer.engines.models.drafters import KinematicDrafter

pytestmark = [pytest.mark.background,  # CPU-bound, no real-time bound (tests/cpu_share.py)
              pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("onnxruntime", "onnxscript")),
                                 reason="needs onnxruntime and onnxscript")]

LOGIT_ATOL = 1e-4  # measured max 4.1e-5 on this sample (AMD EPYC, onnxruntime 1.32 CPU EP)
# Fixed sample: its smallest top-1/top-2 logit margin is 2e-4, well above the backends' difference. Exact
# token equality across backends holds only away from near-ties (margins of 1e-6 occur in the held-out set).
N_OBS = 200


@pytest.fixture(scope="module")
def engines(policy, tmp_path_factory):
    """(torch fp32 CPU, onnxruntime CPU) engines of the default policy; the ONNX plan built in a temp cache."""
    from edgeinfer.engines.backends.ort_engine import OrtEngine  # here, not at collection (onnxruntime, onnx)

    cache = EngineCache(tmp_path_factory.mktemp("engines"))
    return TorchEngine(policy.model), OrtEngine.from_policy(policy, cache=cache, log=lambda line: None)


@pytest.fixture(scope="module")
def observations(policy, held_out):
    feats, _ = held_out
    idx = np.random.default_rng(1).choice(len(feats), N_OBS, replace=False)
    return feats[idx]


@pytest.fixture(scope="module")
def torch_greedy(policy, engines, observations):
    """Torch backend's greedy chunk of each observation: [(tokens, logits (n_tokens, n_bins))], 1 torch thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the engine's setting (TorchEngine.from_policy); 2 threads are slower at batch 1
    try:
        return [_greedy(engines[0], policy.normalise(f), policy.cfg.n_tokens) for f in observations]
    finally:
        torch.set_num_threads(threads)


def _greedy(engine, obs, n_tokens):
    """Target-only greedy chunk, one token per pass: (tokens, logits of each pass (n_tokens, n_bins))."""
    logits = [engine.forward(obs, (), 0)[-1]]
    tokens = [int(logits[-1].argmax())]
    while len(tokens) < n_tokens:
        logits.append(engine.forward(None, (tokens[-1],), len(tokens))[-1])
        tokens.append(int(logits[-1].argmax()))
    return tokens, np.stack(logits)


def test_greedy_chunks_and_logits_match_torch(policy, engines, observations, torch_greedy):
    worst = 0.0
    for row, (feats, (tokens_torch, logits_torch)) in enumerate(zip(observations, torch_greedy)):
        tokens_ort, logits_ort = _greedy(engines[1], policy.normalise(feats), policy.cfg.n_tokens)
        assert tokens_ort == tokens_torch, f"observation {row}"
        worst = max(worst, float(np.abs(logits_ort - logits_torch).max()))
    assert worst < LOGIT_ATOL, f"max abs logit difference {worst:.3g}"


def test_speculative_on_ort_equals_greedy(policy, engines, observations, torch_greedy):
    drafter = KinematicDrafter(policy.tokenizer)
    d = policy.cfg.n_joints
    accepted = drafted = 0
    for row, feats in enumerate(observations):
        k = (1, 2, 4, 6, 8)[row % 5]
        obs = policy.normalise(feats)
        q = np.zeros(d)
        drafter.reset(q, feats[d:2 * d], q - feats[2 * d:3 * d])
        planner = TickPlanner(SchedulerConfig(k_max=k, adaptive=False))
        planner.unlimited()
        res = speculative_decode(engines[1], obs, policy.cfg.n_tokens, drafter, planner)
        assert res.complete
        assert res.tokens == torch_greedy[row][0], f"observation {row} with k={k}"
        accepted, drafted = accepted + res.accepted, drafted + res.drafted
    assert 0.2 < accepted / drafted < 1.0  # the verify passes really did accept and reject drafts


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_rollback_junk_then_real_tokens_equals_never_junk(policy, engines, observations, backend):
    engine = engines[backend == "onnxruntime"]
    obs = policy.normalise(observations[0])
    tokens, _ = _greedy(engine, obs, policy.cfg.n_tokens)
    n, k = 10, 6  # committed prefix, then k+1 positions first written with junk
    real = tokens[n - 1:n + k]
    engine.forward(obs, tokens[:n - 1], 0)
    clean = engine.forward(None, real, n)
    engine.forward(obs, tokens[:n - 1], 0)
    engine.forward(None, [(t + 17) % policy.cfg.n_bins for t in real], n)
    engine.rollback(n)
    np.testing.assert_allclose(engine.forward(None, real, n), clean, rtol=0, atol=1e-6)


def test_ort_builds_fp32_only(policy):
    with pytest.raises(ValueError, match="precision='bf16'"):
        load_engine(policy, "onnxruntime", "bf16")
