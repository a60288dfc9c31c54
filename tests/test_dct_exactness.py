"""The shipped DCT policy (engines/weights/schunk_dct_target.*): greedy speculative decoding is token-identical to its
target-only greedy decoding with every drafter (kinematic in DCT space, early-exit, learned), on real held-out
observations; the drafters are picked by the tokenizer's kind; its manifest records its held-out quality."""
import json

import numpy as np
import pytest
import torch

from edgeinfer.core.speculative import FixedK, speculative_decode
from edgeinfer.engines.backends.torch_engine import TorchEngine
from edgeinfer.engines.models.dct_tokenizer import DctTokenizer
from edgeinfer.engines.models.drafters import DctKinematicDrafter, KinematicDrafter, make_drafter
from edgeinfer.engines.models.paths import DCT_DRAFT, DCT_POLICY, DEFAULT_POLICY
from edgeinfer.engines.models.policy import load_policy
from edgeinfer.engines.training.evaluate import greedy_decode_batch

pytestmark = pytest.mark.background  # CPU-bound, no real-time bound (tests/conftest.py)

NAMES = ("kinematic", "early-exit", "learned")


@pytest.fixture(scope="module")
def dct_policy():
    return load_policy(DCT_POLICY)


@pytest.fixture(scope="module")
def drafters(dct_policy):
    """Every drafter; the model drafters on torch (their backend changes the speed, not the exactness, which
    tests/test_drafters.py checks on the default backend)."""
    return {"kinematic": make_drafter("kinematic", dct_policy),
            "early-exit": make_drafter("early-exit", dct_policy, backend="torch"),
            "learned": make_drafter("learned", dct_policy, path=DCT_DRAFT, backend="torch")}


@pytest.fixture(scope="module")
def target(dct_policy, one_torch_thread):
    return TorchEngine(dct_policy.model)


def _state(policy, f):
    """(q, qd, q_prev) of raw features f (18,) = [q, qd, q - q_prev] of a held-out window."""
    d = policy.cfg.n_joints
    return f[:d], f[d:2 * d], f[:d] - f[2 * d:]


def test_greedy_exact_with_every_drafter(dct_policy, held_out, target, drafters, capsys):
    feats, _ = held_out
    idx = np.random.default_rng(5).choice(len(feats), 24, replace=False)
    reference = greedy_decode_batch(dct_policy.model, torch.as_tensor(dct_policy.normalise(feats[idx])))
    measured = {}
    for name, drafter in drafters.items():
        accepted = drafted = 0
        for row, i in enumerate(idx):
            k = (1, 2, 4, 6, 8, 16)[row % 6]
            drafter.reset(*_state(dct_policy, feats[i]))
            res = speculative_decode(target, dct_policy.normalise(feats[i]), dct_policy.cfg.n_tokens, drafter,
                                     FixedK(k))
            assert res.complete and res.tokens == reference[row].tolist(), f"{name}, observation {i}, k={k}"
            accepted, drafted = accepted + res.accepted, drafted + res.drafted
        measured[name] = accepted / drafted
    with capsys.disabled():
        print("\n" + "\n".join(f"  dct {n:10s} acceptance {a:.3f}" for n, a in measured.items()))
    for name, acceptance in measured.items():
        assert 0.02 < acceptance < 1.0, name  # real proposals, accepted some of the time
    assert measured["learned"] > max(measured["kinematic"], measured["early-exit"])  # distillation pays


def test_drafters_follow_the_tokenizer_kind(dct_policy, drafters):
    assert isinstance(dct_policy.tokenizer, DctTokenizer)
    assert isinstance(drafters["kinematic"], DctKinematicDrafter)
    assert all(isinstance(drafters[n].guess, DctKinematicDrafter) for n in ("early-exit", "learned"))
    assert isinstance(make_drafter("kinematic", load_policy(DEFAULT_POLICY)), KinematicDrafter)
    with pytest.raises(ValueError, match="kinematic_drafter"):
        KinematicDrafter(dct_policy.tokenizer)
    with pytest.raises(ValueError, match="tokenizer"):  # the step draft's tokens mean something else
        make_drafter("learned", dct_policy, path=DEFAULT_POLICY.with_name("schunk_draft.json"), backend="torch")


def test_kinematic_drafts_are_the_tokenized_constant_velocity_chunk(dct_policy, held_out):
    feats, _ = held_out
    q, qd, q_prev = _state(dct_policy, feats[1234])
    drafter = DctKinematicDrafter(dct_policy.tokenizer)
    drafter.reset(q, qd, q_prev)
    h = dct_policy.cfg.horizon
    chunk = np.arange(1, h + 1)[:, None] * (q - q_prev)[None, :]  # (H, D) constant velocity
    expected = dct_policy.tokenizer.encode(chunk, q - q_prev).tolist()
    assert expected == dct_policy.tokenizer.encode(np.zeros_like(chunk), np.zeros_like(q)).tolist()  # departs by 0
    assert drafter.propose([], 5) == expected[:5]
    assert drafter.propose(expected[:10], 4) == expected[10:14]
    assert drafter.propose(expected[:-2], 8) == expected[-2:]  # never past the chunk
    drafts, q_rows = drafter.propose_dist(expected[:3], 2, None, None)
    assert drafts == expected[3:5] and q_rows.shape == (2, dct_policy.cfg.n_bins) and q_rows.sum() == 2


def test_manifests_record_the_step_policys_data_and_training(dct_policy):
    step = json.loads(DEFAULT_POLICY.read_text())
    dct, draft = dct_policy.manifest, json.loads(DCT_DRAFT.read_text())
    split = dct["data"]["split"]  # units by run name (measurement_<n>); the step manifest lists the numbers n
    for key in ("train", "held_out"):
        assert [int(name.removeprefix("measurement_")) for name in split[key]] == step["split"][key], key
    assert (split["train_windows"], split["held_out_windows"]) == \
        (step["split"]["train_windows"], step["split"]["held_out_windows"])
    assert {k: dct["train"][k] for k in ("seed", "steps", "batch_size")} == \
        {k: step["train"][k] for k in ("seed", "steps", "batch_size")}
    assert (dct["train"]["lr"], step["train"]["lr"]) == (0.004, 0.002)  # docs/policy.md "Shipped" says why
    assert draft["distilled_from"] == dct["sha256"]
    assert {k: draft["distill"][k] for k in ("seed", "steps", "batch_size", "lr")} == \
        {k: json.loads((DEFAULT_POLICY.parent / "schunk_draft.json").read_text())["distill"][k]
         for k in ("seed", "steps", "batch_size", "lr")}
    # the bar: the full-chunk action RMSE within 10% of the step policy's (the shipped one: 7.3%), and
    # well below constant velocity
    rmse, step_rmse = dct["metrics_held_out"]["action_rmse_rad"], step["metrics_held_out"]["action_rmse_rad"]
    assert rmse <= 1.10 * step_rmse
    assert rmse < 0.6 * dct["metrics_held_out"]["baseline_const_velocity_rmse_rad"]
    assert dct["metrics_held_out"]["tokenizer_rmse_rad_per_prefix"][0] < 0.5 * step["metrics_held_out"][
        "baseline_hold_rmse_rad"]  # one coefficient row already halves holding position
    assert isinstance(load_policy(DCT_DRAFT).tokenizer, DctTokenizer)
