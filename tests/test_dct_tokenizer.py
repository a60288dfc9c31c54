"""DCT action tokens (engines/models/dct_tokenizer.py): the departure from the constant-velocity chunk round-trips
within half a bin per coefficient, every prefix decodes within the documented bound (filled by the least acceleration),
coefficient-major order, state round trip (a manifest whose tokens are about anything else refused), the increment
required, dispatch by "kind"."""
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.fft import dct

from edgeinfer.engines.models.bins import fitted_range
from edgeinfer.engines.models.dct_tokenizer import DctTokenizer, completion_gain, constant_velocity_rad, dct_rad
from edgeinfer.engines.models.paths import DCT_POLICY, DEFAULT_POLICY
from edgeinfer.engines.models.tokenizer import ActionTokenizer, decode_chunk, encode_chunk, tokenizer_from_state

pytestmark = pytest.mark.background  # CPU-bound, no real-time bound (tests/conftest.py)

H, D = 8, 3


def smooth_offsets(rng: np.random.Generator, n: int):
    """(n, H, D) chunk offsets of smooth motion (a velocity and an acceleration per joint, plus a little noise) and
    the last chunk-step increment q - q_prev (n, D) of that motion (offset -1 is a - v)."""
    h = np.arange(1, H + 1)[None, :, None]
    v, a = rng.normal(0, 0.01, (n, 1, D)), rng.normal(0, 0.001, (n, 1, D))
    return v * h + a * h ** 2 + rng.normal(0, 1e-4, (n, H, D)), (v - a)[:, 0]


def departure_coefficients(offsets, inc):
    return dct(offsets - constant_velocity_rad(inc, H), type=2, norm="ortho", axis=1)


@pytest.fixture(scope="module")
def fitted():
    train, train_inc = smooth_offsets(np.random.default_rng(0), 5000)
    return DctTokenizer.fit(train, train_inc, n_bins=64), *smooth_offsets(np.random.default_rng(1), 2000)


def test_round_trip_within_half_a_bin_per_coefficient(fitted):
    tok, offsets, inc = fitted
    assert tok.about == "constant_velocity"
    coefs = departure_coefficients(offsets, inc)
    inside = np.all((coefs > tok.lo_rad) & (coefs < tok.hi_rad), axis=(1, 2))
    assert inside.mean() > 0.99  # the fitted ranges cover held-out data of the same motion
    tokens = tok.encode(offsets[inside], inc[inside])
    assert tokens.shape == (inside.sum(), H * D) and tokens.dtype == np.int64
    assert np.all(np.abs(tok.coefficients(tokens) - coefs[inside]) <= tok.width_rad / 2 + 1e-12)
    decoded = tok.decode(tokens, inc[inside])
    assert decoded.shape == (inside.sum(), H, D)
    # orthonormal: the chunk's error energy per joint is the coefficients' (Parseval)
    assert np.allclose(((decoded - offsets[inside]) ** 2).sum(1),
                       ((tok.coefficients(tokens) - coefs[inside]) ** 2).sum(1))


def test_the_departure_needs_narrower_bins_than_the_offsets(fitted):
    """Why the departure from constant velocity is tokenized: a ramp's DCT decays slowly, so the offsets' own
    coefficients need wider ranges (1.2-1.7x on this motion, 4-9x on the Schunk runs), and err 5x more at the first
    step here."""
    tok, offsets, inc = fitted
    train, _ = smooth_offsets(np.random.default_rng(0), 5000)
    own = DctTokenizer(*fitted_range(dct_rad(train), 0.998), 64)  # bins over the offsets' own coefficients
    assert np.all(own.width_rad[:2] > 1.2 * tok.width_rad[:2])
    k, j = np.indices((H, D))
    own_trip = dct(own.centers_rad(own.bin_of(dct_rad(offsets), k, j), k, j), type=3, norm="ortho", axis=1)
    first = lambda x: float(np.sqrt(np.mean((x - offsets)[:, 0] ** 2)))  # noqa: E731
    assert first(tok.decode(tok.encode(offsets, inc), inc)) < 0.3 * first(own_trip)


def test_every_prefix_decodes_the_whole_horizon_within_the_bound(fitted):
    tok, offsets, inc = fitted
    tokens = tok.encode(offsets, inc)
    prior = constant_velocity_rad(inc, H)
    coefs = departure_coefficients(offsets, inc)
    inside = np.all((coefs > tok.lo_rad) & (coefs < tok.hi_rad), axis=(1, 2))
    errors = []
    for rows in range(1, H + 1):
        decoded = tok.decode(tokens[:, :rows * D], inc)
        assert decoded.shape == offsets.shape  # the whole horizon at every prefix length
        err_sq = ((decoded - offsets) ** 2).sum(1)  # (N, D) per joint, summed over the horizon
        assert np.all(err_sq[inside] <= tok.error_bound_sq(rows, offsets[inside], inc[inside]) + 1e-15), rows
        # the verified coefficients of the departure are kept exactly, the rest filled
        np.testing.assert_allclose(dct(decoded - prior, type=2, norm="ortho", axis=1)[:, :rows],
                                   tok.coefficients(tokens[:, :rows * D])[:, :rows], atol=1e-12)
        errors.append(np.sqrt(err_sq.mean()))
    assert errors[0] > 3 * errors[-1]  # each row refines the chunk: coarse first
    assert np.all(np.diff(errors[:3]) < 0)


def test_tokens_are_coefficient_major():
    tok = DctTokenizer(np.full((H, D), -1.0), np.full((H, D), 1.0), n_bins=64)
    coefs = np.zeros((H, D))
    coefs[0, 1] = 0.5  # coefficient 0 of joint 1
    coefs[2, 0] = -0.5  # coefficient 2 of joint 0
    inc = np.array([0.01, -0.02, 0.03])
    offsets = np.asarray(dct(coefs, type=3, norm="ortho", axis=0)) + constant_velocity_rad(inc, H)  # inverse DCT-II
    tokens = tok.encode(offsets, inc)
    mid = 32  # the bin holding 0
    expected = np.full(H * D, mid)
    expected[0 * D + 1] = mid + 16  # 0.5 / (2 / 64) bins above lo + 1
    expected[2 * D + 0] = mid - 16
    assert tokens.tolist() == expected.tolist()
    assert tok.bin_of(0.5, 0, 1) == mid + 16 and np.isclose(tok.centers_rad(mid + 16, 0, 1), 0.5 + 1 / 64)
    # one row decodes coefficient 0 only: the least-acceleration departure with that mean (a ramp up from the
    # observation, not the flat line at the mean that zero coefficients would give)
    first = tok.decode(tokens[:D], np.zeros(D))
    assert first.shape == (H, D) and np.isclose(first[:, 1].mean() * np.sqrt(H), tok.centers_rad(mid + 16, 0, 1))
    assert 0 < first[0, 1] < first[-1, 1] and np.all(np.diff(first[:, 1]) > 0)


def test_state_dict_round_trip_and_dispatch(fitted):
    tok, offsets, inc = fitted
    state = json.loads(json.dumps(tok.state_dict()))  # as a manifest stores it
    assert (state["kind"], state["about"]) == ("dct", "constant_velocity")
    back = tokenizer_from_state(state)
    assert isinstance(back, DctTokenizer) and (back.kind, back.prefix_rung) == ("dct", "coarse")
    assert (back.horizon, back.n_joints, back.n_bins, back.about) == (H, D, 64, "constant_velocity")
    assert back.encode(offsets, inc).tolist() == tok.encode(offsets, inc).tolist()
    # encode_chunk / decode_chunk: the increment reaches a DCT tokenizer, a step tokenizer decodes its tokens alone
    np.testing.assert_array_equal(decode_chunk(tok, encode_chunk(tok, offsets, inc), inc),
                                  tok.decode(tok.encode(offsets, inc), inc))
    step = ActionTokenizer(np.full(D, -0.05), np.full(D, 0.05), 64)
    np.testing.assert_array_equal(decode_chunk(step, encode_chunk(step, offsets, inc), inc),
                                  step.decode(step.encode(offsets)))


def test_a_manifest_not_about_constant_velocity_is_refused_naming_the_field(tmp_path):
    """Tokens of anything but the departure from constant velocity (no "about", or "rest") do not decode here:
    loading the manifest fails with one ValueError naming the file, the field and what to do (retrain)."""
    from edgeinfer.engines.models.policy import load_policy

    manifest = json.loads(DCT_POLICY.read_text())
    (tmp_path / manifest["weights"]).write_bytes((DCT_POLICY.parent / manifest["weights"]).read_bytes())
    state = {k: v for k, v in manifest["tokenizer"].items() if k != "about"}
    for entry, found in ((state, "is missing"), ({**state, "about": "rest"}, "is 'rest'")):
        with pytest.raises(ValueError, match=f'field "about" {found}.*retrain the policy'):
            tokenizer_from_state(entry)
        path = tmp_path / "old_dct.json"
        path.write_text(json.dumps({**manifest, "tokenizer": entry}))
        with pytest.raises(ValueError, match=f'old_dct.json.*field "about" {found}.*edgeinfer train --tokenizer dct'):
            load_policy(path)


def test_a_step_manifest_without_kind_loads_as_step():
    state = json.loads(DEFAULT_POLICY.read_text())["tokenizer"]
    assert "kind" not in state  # the shipped manifests predate the DCT tokens
    tok = tokenizer_from_state(state)
    assert isinstance(tok, ActionTokenizer) and (tok.kind, tok.prefix_rung) == ("step", "partial")
    assert tok.state_dict() == state  # the step manifests stay as they were
    with pytest.raises(ValueError, match="'bpe' is unknown"):
        tokenizer_from_state({**state, "kind": "bpe"})


def test_bad_input_is_refused_naming_it(fitted):
    tok, offsets, inc = fitted
    with pytest.raises(ValueError, match="multiple of n_joints"):
        tok.decode(np.zeros(D + 1, dtype=int), inc[0])
    with pytest.raises(ValueError, match="up to 24"):
        tok.decode(np.zeros(H * D + D, dtype=int), inc[0])
    with pytest.raises(ValueError, match="horizon, n_joints"):
        tok.encode(np.zeros((H - 1, D)), inc[0])
    for call in (lambda: tok.encode(offsets[0]), lambda: tok.decode(np.zeros(D, dtype=int))):
        with pytest.raises(ValueError, match="needs the observation's last chunk-step increment"):
            call()
    with pytest.raises(ValueError, match=r"increment_rad of shape \(4,\) does not fit \(3,\)"):
        tok.decode(np.zeros(D, dtype=int), np.zeros(D + 1))
    with pytest.raises(ValueError, match=r"increment_rad of shape \(5, 3\) does not fit \(2, 3\)"):
        tok.decode(np.zeros((2, D), dtype=int), np.zeros((5, D)))  # not silently broadcast to another batch
    with pytest.raises(ValueError, match=r"does not fit \(3,\)"):
        tok.encode(offsets[0], inc[:2])
    with pytest.raises(ValueError, match="increment_rad must be finite"):
        tok.decode(np.zeros(D, dtype=int), np.full(D, np.nan))
    for bad in (np.full(D, 64), np.full(D, -1), np.full(D, 3.7), np.array(5)):
        with pytest.raises(ValueError, match="tokens must be an array of integers in 0..63"):
            tok.decode(bad, inc[0])
    with pytest.raises(ValueError, match="offsets_rad must be finite"):
        tok.encode(np.full((H, D), np.nan), inc[0])
    with pytest.raises(ValueError, match=r"fit needs offsets \(N, H, D\) and increments \(N, D\)"):
        DctTokenizer.fit(offsets, inc[:10])
    with pytest.raises(ValueError, match="rows must be in 0..8"):
        tok.error_bound_sq(-1, offsets, inc)
    with pytest.raises(ValueError, match=r"lo_rad must be finite, got -inf at \(0, 1\)"):
        DctTokenizer(np.where(np.eye(H, D, 1) > 0, -np.inf, -1.0), np.ones((H, D)))
    with pytest.raises(ValueError, match="hi_rad - lo_rad must be finite"):
        DctTokenizer(np.full((H, D), -1e308), np.full((H, D), 1e308))
    for n_bins in (128.7, "128", True):
        with pytest.raises(ValueError, match="n_bins must be an integer >= 2"):
            DctTokenizer(np.zeros((H, D)), np.ones((H, D)), n_bins)
    with pytest.raises(ValueError, match="tokenizer must be an object"):
        tokenizer_from_state(None)
    with pytest.raises(ValueError, match="hi_rad must exceed"):
        DctTokenizer(np.zeros((H, D)), np.zeros((H, D)))
    with pytest.raises(ValueError, match=r"\(H, D\)"):
        DctTokenizer(np.zeros(D), np.ones(D))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.integers(1, H))
def test_prefix_error_bound_holds_for_any_chunk_inside_the_ranges(seed, rows):
    rng = np.random.default_rng(seed)
    tok = DctTokenizer(-rng.uniform(0.01, 1, (H, D)), rng.uniform(0.01, 1, (H, D)), int(rng.integers(2, 300)))
    inc = rng.normal(0, 0.2, (4, D))  # any increment
    told = np.asarray(dct(rng.uniform(tok.lo_rad, tok.hi_rad, (4, H, D)), type=3, norm="ortho", axis=1))
    offsets = told + constant_velocity_rad(inc, H)
    tokens = tok.encode(offsets, inc)
    assert np.all((tokens >= 0) & (tokens < tok.n_bins))
    err_sq = ((tok.decode(tokens[:, :rows * D], inc) - offsets) ** 2).sum(1)
    assert np.all(err_sq <= tok.error_bound_sq(rows, offsets, inc) + 1e-12)


def test_a_coarse_chunk_is_right_where_the_arm_acts(fitted):
    """One row of coefficients starts on the arm's motion: its first step is as good as constant velocity's (zeros
    past the prefix of the offsets' own DCT would be a flat line at the chunk's mean, far off at the first step),
    and every further row keeps it there while refining the whole horizon."""
    tok, offsets, inc = fitted
    tokens, prior = tok.encode(offsets, inc), constant_velocity_rad(inc, H)
    rmse = lambda x, h=slice(None): float(np.sqrt(np.mean((x - offsets)[:, h] ** 2)))  # noqa: E731
    flat = np.repeat(offsets.mean(1, keepdims=True), H, axis=1)  # the offsets' own coefficient 0 alone, exact
    one = tok.decode(tokens[:, :D], inc)
    assert rmse(one, 0) < 0.2 * rmse(flat, 0) and rmse(one) < 0.5 * rmse(flat)
    assert rmse(one, 0) <= 1.05 * rmse(prior, 0)
    errors = [rmse(tok.decode(tokens[:, :r * D], inc)) for r in range(1, H + 1)]
    assert errors[0] < 0.2 * rmse(prior) and errors[-1] < 0.5 * errors[0]
    # all H rows: the prior plus the inverse DCT of the departure (a full chunk is exactly the target's)
    np.testing.assert_allclose(tok.decode(tokens, inc), prior + dct(tok.coefficients(tokens), type=3, norm="ortho",
                                                                     axis=1), atol=1e-15)
    # no row: the constant-velocity chunk itself (the draft rung, the kinematic drafter's chunk)
    assert completion_gain(H, 0).shape == (H, 0) and np.array_equal(tok.decode(tokens[:, :0], inc), prior)


def test_load_policy_refuses_a_tokenizer_that_does_not_fit_the_config(tmp_path):
    from edgeinfer.engines.models.policy import load_policy

    manifest = json.loads(DEFAULT_POLICY.read_text())
    (tmp_path / manifest["weights"]).write_bytes((DEFAULT_POLICY.parent / manifest["weights"]).read_bytes())
    short = DctTokenizer(np.full((4, 6), -1.0), np.full((4, 6), 1.0), n_bins=64)  # the config's horizon is 8
    for state, kind in ((short.state_dict(), DctTokenizer), (manifest["tokenizer"], ActionTokenizer)):
        path = tmp_path / f"{kind.kind}.json"
        path.write_text(json.dumps({**manifest, "tokenizer": state}))
        if kind is ActionTokenizer:
            assert isinstance(load_policy(path).tokenizer, ActionTokenizer)
        else:
            with pytest.raises(ValueError, match=r"dct.json: tokenizer \(dct\) does not fit config .*horizon=8"):
                load_policy(path)


def test_train_and_distill_with_dct_tokens(tmp_path):
    from edgeinfer.engines.models.policy import load_policy
    from edgeinfer.engines.training.distill import DistillConfig, distill
    from edgeinfer.engines.training.train import TrainConfig, train

    logs = tmp_path / "logs"
    logs.mkdir()
    for i in (1, 2, 3):  # three 2-joint CSV runs, positions only, 100 Hz
        t = np.arange(150) / 100.0
        q = np.column_stack([t, 0.3 * np.sin(2 * t + i), 0.2 * np.cos(3 * t + i)])
        np.savetxt(logs / f"run{i}.csv", q, delimiter=",", header="t,q0,q1", comments="")
    out = tmp_path / "p_target.json"
    train(TrainConfig(data=logs, derive="qd", steps=3, batch_size=16, n_bins=16, tokenizer="dct", out=out))
    manifest = json.loads(out.read_text())
    assert manifest["tokenizer"]["kind"] == "dct"
    policy = load_policy(out)
    assert isinstance(policy.tokenizer, DctTokenizer)
    assert policy.tokenizer.lo_rad.shape == (policy.cfg.horizon, 2) and policy.tokenizer.n_bins == 16
    metrics = manifest["metrics_held_out"]
    assert len(metrics["tokenizer_rmse_rad_per_prefix"]) == policy.cfg.horizon
    assert metrics["tokenizer_rmse_rad_per_prefix"][-1] == pytest.approx(metrics["tokenizer_rmse_rad"])
    draft = distill(policy, DistillConfig(target=out, steps=2, batch_size=16, out=tmp_path / "p_draft.json"))
    assert isinstance(load_policy(tmp_path / "p_draft.json").tokenizer, DctTokenizer)
    assert draft.manifest["tokenizer"] == manifest["tokenizer"]


@pytest.mark.parametrize("edit, says", [
    (lambda m: m["tokenizer"].__setitem__("kind", "step"), "tokenizer (kind 'step')"),
    (lambda m: m.pop("tokenizer"), "missing key 'tokenizer'"),
    (lambda m: m["config"].__setitem__("horizon", 4), "do not fit config"),
])
def test_a_corrupt_dct_manifest_is_refused_naming_the_file_and_what_is_wrong(tmp_path, edit, says):
    import json
    import shutil

    from edgeinfer.engines.models.paths import DCT_POLICY
    from edgeinfer.engines.models.policy import load_policy

    m = json.loads(DCT_POLICY.read_text())
    edit(m)
    shutil.copy(DCT_POLICY.with_suffix(".pt"), tmp_path)
    (tmp_path / "bad.json").write_text(json.dumps(m))
    with pytest.raises(ValueError) as e:
        load_policy(tmp_path / "bad.json")
    assert str(e.value).startswith(str(tmp_path / "bad.json")) and says in str(e.value)
