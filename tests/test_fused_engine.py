"""The fused (numba) backend computes the torch model's pass: logits match torch for every pass shape and
position, and greedy decoding (target-only and speculative) gives torch fp32's tokens on real observations.

Tolerances: the fused pass computes in float64 and rounds its logits to float32, so against the torch model
run in float64 it differs by float32 rounding only (rtol 1e-6); against torch fp32 it differs by torch's own
fp32 rounding (measured max 4.6e-5 over 1000 held-out chunks, out/fused/agreement.py; 1e-4 as for onnxruntime).
"""
import dataclasses

import numpy as np
import pytest
import torch

pytest.importorskip("numba")

from edgeinfer.core.speculative import FixedK, speculative_decode  # noqa: E402
from edgeinfer.engines.backends.build import load_engine  # noqa: E402
from edgeinfer.engines.backends.engine import unavailable_reason  # noqa: E402
from edgeinfer.engines.backends.fused_engine import FusedEngine  # noqa: E402
from edgeinfer.engines.backends.quality import greedy_chunk  # noqa: E402
from edgeinfer.engines.models.drafters import KinematicDrafter, make_drafter  # noqa: E402
from edgeinfer.engines.models.model import ActionTransformer  # noqa: E402
from edgeinfer.engines.training.evaluate import greedy_decode_batch  # noqa: E402

pytestmark = pytest.mark.background  # CPU-bound, no real-time bound (tests/conftest.py)

FP32_ATOL = 1e-4
F64_RTOL = F64_ATOL = 1e-6


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    """The torch references on one thread: on a busy 2-core machine a second one only waits."""


@pytest.fixture(scope="module")
def fused(policy):
    return load_engine(policy, "fused")


@pytest.fixture(scope="module")
def sample(policy, held_out):
    """1000 held-out windows: (raw features (N, obs_dim), normalised float32 (N, obs_dim), torch fp32
    target-only greedy tokens (N, n_tokens))."""
    feats, _ = held_out
    feats = feats[np.random.default_rng(3).choice(len(feats), 1000, replace=False)]
    x = policy.normalise(feats).astype(np.float32)
    return feats, x, greedy_decode_batch(policy.model, torch.as_tensor(x))


def _reference(model, obs, tokens, dtype=torch.float64) -> np.ndarray:
    """Cache-free forward of `model` in `dtype` over [obs, tokens]: logits (1 + len(tokens), n_bins)."""
    m = ActionTransformer(model.cfg).to(dtype).eval()
    m.load_state_dict(model.state_dict())
    with torch.inference_mode():
        obs_t = torch.as_tensor(obs, dtype=torch.float32).to(dtype)[None]
        return m(obs_t, torch.tensor([tokens], dtype=torch.long))[0].float().numpy()


def _passes_match(model, engine, seed: int) -> None:
    """Prefill with tokens, verify passes of 1..9 tokens at growing positions, a rejected draft (junk tokens)
    re-fed at the same positions (rollback by position), and passes of every length at the end."""
    cfg = model.cfg
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal(cfg.obs_dim).astype(np.float32)
    seq = rng.integers(0, cfg.n_bins, cfg.n_tokens).tolist()
    want64, want32 = _reference(model, obs, seq), _reference(model, obs, seq, torch.float32)

    def check(got, start, what):
        np.testing.assert_allclose(got, want64[start:start + len(got)], rtol=F64_RTOL, atol=F64_ATOL, err_msg=what)
        np.testing.assert_allclose(got, want32[start:start + len(got)], atol=FP32_ATOL, err_msg=what)

    check(engine.forward(obs, seq[:3], 0), 0, "prefill + 3 tokens")
    n = 4  # positions < n hold seq
    for t in (1, 2, 5, 9):
        junk = [(x + 1) % cfg.n_bins for x in seq[n - 1:n - 1 + t]]
        engine.forward(None, junk, n)  # a rejected draft: its cache rows are stale from here on
        engine.rollback(n)
        check(engine.forward(None, seq[n - 1:n - 1 + t], n), n, f"pass of {t} at {n} after a rejected draft")
        n += t
    for t in range(1, cfg.seq_len - n + 1):
        check(engine.forward(None, seq[n - 1:n - 1 + t], n), n, f"pass of {t} at {n}")


def test_logits_match_torch_for_every_pass_shape(policy, fused):
    _passes_match(policy.model, fused, seed=0)


@pytest.mark.parametrize("shape", [dict(d_model=96, n_layers=3, n_heads=6, n_bins=66),  # n_bins: not a multiple of 4
                                   dict(d_model=256, n_layers=4, n_heads=8)])
def test_other_configs_match_torch(policy, shape):
    torch.manual_seed(0)
    model = ActionTransformer(dataclasses.replace(policy.cfg, **shape)).eval()
    with torch.no_grad():  # larger than the default init, so that every part moves the logits
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    _passes_match(model, FusedEngine(model), seed=1)


def test_greedy_equals_torch_fp32_on_1000_held_out_observations(policy, fused, sample):
    _, x, reference = sample
    tokens = np.array([fused.greedy_chunk(o) for o in x])
    assert (tokens == reference).all(), f"{np.sum(tokens != reference)} tokens differ"
    for o in x[:20]:  # the one-call chunk is the pass-by-pass decode
        assert fused.greedy_chunk(o) == greedy_chunk(fused, o, policy.cfg.n_tokens)


@pytest.mark.parametrize("drafter_name", ["kinematic", "learned"])
def test_speculative_on_fused_equals_target_only(policy, fused, sample, drafter_name):
    feats, x, reference = (a[:100] for a in sample)
    drafter = make_drafter(drafter_name, policy, **({"backend": "fused"} if drafter_name == "learned" else {}))
    if drafter_name == "learned":
        assert isinstance(drafter.engine, FusedEngine)
    else:
        assert isinstance(drafter, KinematicDrafter)
    d = policy.cfg.n_joints
    accepted = 0
    for row, f in enumerate(feats):
        k = (1, 2, 4, 8)[row % 4]
        q = np.zeros(d)
        drafter.reset(q, f[d:2 * d], q - f[2 * d:3 * d])
        res = speculative_decode(fused, x[row], policy.cfg.n_tokens, drafter, FixedK(k))
        assert res.tokens == reference[row].tolist(), f"observation {row} with k={k}"
        accepted += res.accepted
    assert accepted > 0  # the drafts were used, so the verify passes' rows mattered


def test_refuses_what_it_cannot_run(policy, fused):
    assert unavailable_reason("fused", "cpu") is None
    assert unavailable_reason("fused", "cuda") == "fused runs on the CPU only (a numba-compiled pass)"
    with pytest.raises(RuntimeError, match="backend 'fused' on cuda: fused runs on the CPU only"):
        load_engine(policy, "fused", "fp32", "cuda")
    with pytest.raises(ValueError, match="fp32 only"):
        load_engine(policy, "fused", "bf16")
    with pytest.raises(ValueError, match="ActionTransformer of engines/models/model.py only, not Linear"):
        FusedEngine(torch.nn.Linear(2, 2))
    n = policy.cfg.seq_len
    with pytest.raises(ValueError, match="does not fit"):
        fused.forward(None, [1, 2], n - 1)
    with pytest.raises(ValueError, match="token id out of range"):
        fused.forward(None, [policy.cfg.n_bins], 5)
