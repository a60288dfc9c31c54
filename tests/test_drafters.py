"""Drafters by registry name on real held-out observations: speculative decoding stays token-identical to
target-only greedy decoding with every drafter and every k in 1..16; the model drafters' drafts are really
accepted; their caches follow the committed prefix; propose_dist returns proper distributions."""
import shutil

import numpy as np
import pytest
import torch

from edgeinfer.core.speculative import FixedK, speculative_decode
from edgeinfer.engines.backends.cache import EngineCache
from edgeinfer.engines.backends.torch_engine import TorchEngine
from edgeinfer.engines.models.drafters import DEFAULT_DRAFT, DRAFTERS, ModelDrafter, default_backend, make_drafter
from edgeinfer.engines.models.policy import load_policy
from edgeinfer.engines.training.evaluate import greedy_decode_batch

pytestmark = pytest.mark.background  # CPU-bound, no real-time bound (tests/conftest.py)

NAMES = ("kinematic", "early-exit", "learned")



@pytest.fixture(scope="module")
def drafters(policy, tmp_path_factory):
    """Every registered drafter on its default backend (ONNX plans built in a temporary engine cache)."""
    options = {}
    if default_backend() == "onnxruntime":
        options = {"cache": EngineCache(tmp_path_factory.mktemp("engines")), "log": lambda line: None}
    return {name: make_drafter(name, policy, **({} if name == "kinematic" else options)) for name in NAMES}


@pytest.fixture(scope="module")
def target(policy):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the runtime's setting; 2 threads are slower at batch 1
    yield TorchEngine(policy.model)
    torch.set_num_threads(threads)


def _reset(policy, drafter, f):
    """Reset from raw features f (18,) = [q, qd, q - q_prev] of a held-out window."""
    d = policy.cfg.n_joints
    drafter.reset(f[:d], f[d:2 * d], f[:d] - f[2 * d:])


def _decode(policy, target, drafter, f, k):
    _reset(policy, drafter, f)
    return speculative_decode(target, policy.normalise(f), policy.cfg.n_tokens, drafter, FixedK(k))


def test_registry_names_every_drafter(policy):
    assert set(NAMES) <= set(DRAFTERS)
    with pytest.raises(KeyError, match="known"):
        make_drafter("oracle", policy)


def test_greedy_exact_with_every_drafter_and_every_k(policy, held_out, target, drafters, capsys):
    feats, _ = held_out
    idx = np.random.default_rng(3).choice(len(feats), 64, replace=False)
    reference = greedy_decode_batch(policy.model, torch.as_tensor(policy.normalise(feats[idx])))
    # every k on 3 observations each, and k = 4 and 8 (the runtime's range) on all 64
    runs = [(k, row) for k in range(1, 17) for row in range(3 * (k - 1) % 61, 3 * (k - 1) % 61 + 3)]
    runs += [(k, row) for k in (4, 8) for row in range(64)]
    measured = {}
    for name, drafter in drafters.items():
        accepted = drafted = passes = 0
        for k, row in runs:
            res = _decode(policy, target, drafter, feats[idx[row]], k)
            assert res.complete and res.tokens == reference[row].tolist(), f"{name}, observation {idx[row]}, k={k}"
            accepted, drafted, passes = accepted + res.accepted, drafted + res.drafted, passes + res.target_passes
        measured[name] = (accepted / drafted, len(runs) * policy.cfg.n_tokens / passes)
    with capsys.disabled():
        print("\n" + "\n".join(f"  {n:10s} acceptance {a:.3f}  tokens/pass {t:.2f}" for n, (a, t) in measured.items()))
    for name, (acceptance, _) in measured.items():
        assert 0.05 < acceptance < 1.0, name  # the drafts are real proposals, accepted some of the time
    assert measured["learned"][0] > measured["kinematic"][0]  # distillation pays


def test_model_drafter_cache_follows_the_committed_prefix(policy, held_out):
    """After any history of proposals, the drafts equal the draft model's own cache-free greedy continuation
    (max_passes None); with one pass per propose, the first draft still does and the cost is one pass (plus
    the prefill, deferred to the chunk's first proposal)."""
    feats, _ = held_out
    draft = load_policy(DEFAULT_DRAFT)
    exact = make_drafter("learned", policy, backend="torch", max_passes=None)
    one_pass = make_drafter("learned", policy, backend="torch", max_passes=1)
    rng = np.random.default_rng(0)
    for f in feats[rng.choice(len(feats), 5, replace=False)]:
        obs = torch.as_tensor(draft.normalise(f))[None]
        _reset(policy, exact, f)
        _reset(policy, one_pass, f)
        committed: list[int] = []
        while len(committed) < policy.cfg.n_tokens - 1:
            k = min(int(rng.integers(1, 8)), policy.cfg.n_tokens - 1 - len(committed))
            expected = list(committed)
            with torch.inference_mode():
                for _ in range(k):
                    logits = draft.model(obs, torch.tensor([expected], dtype=torch.long))
                    expected.append(int(logits[0, -1].argmax()))
            assert exact.propose(committed, k) == expected[len(committed):]
            passes = one_pass.passes
            drafts = one_pass.propose(committed, k)
            first = not committed  # the first proposal of a chunk also runs the draft engine's (deferred) prefill
            assert len(drafts) == k and drafts[0] == expected[len(committed)] and one_pass.passes <= passes + 1 + first
            # the verify keeps a random prefix of the drafts, then a token unlike the next draft
            kept = int(rng.integers(0, k + 1))
            committed += drafts[:kept] + [int(rng.integers(0, policy.cfg.n_bins))]


def test_learned_manifest_names_the_target(policy):
    draft = load_policy(DEFAULT_DRAFT)  # checks the weights' sha256 against the manifest
    assert draft.manifest["distilled_from"] == policy.manifest["sha256"]
    assert draft.tokenizer.state_dict() == policy.tokenizer.state_dict()
    assert draft.cfg.n_tokens == policy.cfg.n_tokens and draft.cfg.n_layers < policy.cfg.n_layers + 1
    assert sum(p.numel() for p in draft.model.parameters()) < sum(p.numel() for p in policy.model.parameters())
    m = draft.manifest["metrics_held_out"]
    assert 0 < m["acceptance_rate"] < 1 and m["k"] == 4
    assert set(draft.manifest["split"]["held_out"]) == set(policy.manifest["split"]["held_out"])


def _warp(logits, temperature=0.8, top_p=0.9):
    """Temperature, then top-p: -inf outside the smallest most likely set reaching top_p."""
    z = np.asarray(logits, np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    drop = np.zeros(len(p), bool)
    drop[order] = np.cumsum(p[order]) - p[order] >= top_p
    return np.where(drop, -np.inf, z)


@pytest.mark.parametrize("name", NAMES)
def test_propose_dist_returns_distributions(policy, held_out, drafters, name):
    feats, _ = held_out
    drafter = drafters[name]
    for i, f in enumerate(feats[::2000]):
        _reset(policy, drafter, f)
        tokens, k = [], 1 + i % 6
        drafts, q = drafter.propose_dist(tokens, k, _warp, np.random.default_rng(i))
        assert len(drafts) == k and q.shape == (k, policy.cfg.n_bins) and q.dtype == np.float64
        np.testing.assert_allclose(q.sum(1), 1.0, atol=1e-12)
        assert np.all(q >= 0) and np.all(q[np.arange(k), drafts] > 0)
        if isinstance(drafter, ModelDrafter):  # same rng, same draws; the top-p cut leaves zeros
            again, q2 = drafter.propose_dist(tokens, k, _warp, np.random.default_rng(i))
            assert again == drafts and np.array_equal(q, q2)
            assert np.all((q == 0).sum(1) > 0)


def test_the_learned_drafter_is_the_one_beside_the_policys_manifest(tmp_path):
    """Each policy's learned drafter is its own distilled draft (<name>_draft.json beside <name>_target.json), so
    `--drafter learned` and `auto` work for the DCT policy; a policy without one is refused naming the file and
    the command, and auto leaves it out."""
    from edgeinfer.engines.models.drafters import applicable_drafters, draft_path
    from edgeinfer.engines.models.paths import DCT_DRAFT, DCT_POLICY, LARGE_POLICY

    dct = load_policy(DCT_POLICY)
    assert draft_path(dct) == DCT_DRAFT and draft_path(load_policy()) == DEFAULT_DRAFT
    drafter = make_drafter("learned", dct, backend="torch")
    assert drafter.policy.manifest["distilled_from"] == dct.manifest["sha256"]
    large = load_policy(LARGE_POLICY)  # shipped with its draft (engines/weights/schunk_large_draft.json)
    assert "learned" in applicable_drafters(large)
    assert make_drafter("learned", large).policy.manifest["distilled_from"] == large.manifest["sha256"]
    (tmp_path / "lone_target.json").write_text(LARGE_POLICY.read_text())  # the same policy with no draft beside it
    shutil.copy(LARGE_POLICY.with_suffix(".pt"), tmp_path)  # a copy: the loader refuses symlinks out of the folder
    lone = load_policy(tmp_path / "lone_target.json")
    assert "learned" not in applicable_drafters(lone) and "learned" in applicable_drafters(dct)
    with pytest.raises(FileNotFoundError, match="lone_draft.json.*edgeinfer distill"):
        make_drafter("learned", lone)


def test_learned_drafts_in_one_greedy_run_are_the_draft_models_greedy_tokens():
    """The large policy's learned drafter drafts autoregressively in one greedy_run call per proposal and keeps what
    that run fed in its cache. After any number of its drafts is kept and a correction appended, its next drafts are
    still the draft model's own greedy continuation (here against the model in torch, cache-free)."""
    from edgeinfer.engines.models.paths import LARGE_POLICY

    large = load_policy(LARGE_POLICY)
    drafter = make_drafter("learned", large)
    assert drafter.max_passes is None and hasattr(drafter.engine, "greedy_run")
    model, rng = drafter.policy.model, np.random.default_rng(5)
    q, qd, q_prev = (np.asarray(a, np.float64) for a in large.warmup_state())
    drafter.reset(q, qd, q_prev)
    obs = torch.as_tensor(drafter.policy.features(q, qd, q_prev), dtype=torch.float32)[None]
    committed = [int(rng.integers(0, large.cfg.n_bins))]
    while len(committed) < large.cfg.n_tokens - 6:
        k = int(rng.integers(1, 6))
        drafts = drafter.propose(committed, k)
        want, seq = [], list(committed)
        with torch.inference_mode():
            for _ in range(k):
                want.append(int(model(obs, torch.tensor([seq]))[0, -1].argmax()))
                seq.append(want[-1])
        assert drafts == want, f"after {len(committed)} committed tokens, k={k}"
        kept = int(rng.integers(0, k + 1))
        committed += drafts[:kept] + [int(rng.integers(0, large.cfg.n_bins))]  # kept drafts, then a correction
