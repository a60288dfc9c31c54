import numpy as np
import pytest

from edgeinfer.engines.models.tokenizer import ActionTokenizer

pytestmark = pytest.mark.background  # CPU-bound, no real-time bound (tests/conftest.py)


def make_tok():
    return ActionTokenizer(np.array([-0.01, -0.02]), np.array([0.01, 0.02]), n_bins=20)


def test_error_feedback_keeps_every_step_within_half_a_bin():
    tok = make_tok()
    rng = np.random.default_rng(0)
    inc = rng.uniform(-0.009, 0.009, size=(500, 8, 2)) * np.array([1, 2])
    offsets = np.cumsum(inc, axis=1)
    decoded = tok.decode(tok.encode(offsets))
    assert decoded.shape == offsets.shape
    assert np.all(np.abs(decoded - offsets) <= tok.width_rad / 2 + 1e-12)


def test_tokens_are_increment_bins_and_decode_is_a_cumsum():
    tok = make_tok()  # joint 0: width 0.001, bins centred at -0.0095 + 0.001 i
    offsets = np.array([[[0.0031, 0.0], [0.0062, 0.0]]])  # (1, H=2, D=2)
    tokens = tok.encode(offsets)
    assert tokens.shape == (1, 4)
    assert tokens[0, 0] == 13  # 0.0031 falls in [0.003, 0.004)
    assert np.isclose(tok.decode(tokens)[0, 0, 0], 0.0035)
    # second step quantises the residual 0.0062 - 0.0035 = 0.0027 -> bin 12 (centre 0.0025)
    assert tokens[0, 2] == 12
    assert np.isclose(tok.decode(tokens)[0, 1, 0], 0.0060)


def test_out_of_range_increments_saturate_then_catch_up():
    tok = make_tok()
    offsets = np.array([[[0.05, 0.0], [0.05, 0.0], [0.05, 0.0], [0.05, 0.0], [0.05, 0.0], [0.05, 0.0]]])
    decoded = tok.decode(tok.encode(offsets))[0, :, 0]
    assert decoded[0] == pytest.approx(0.0095)  # clipped to the top bin
    assert abs(decoded[-1] - 0.05) <= 0.0005 + 1e-12  # error feedback reached the target


def test_fit_covers_training_increments_and_validates():
    rng = np.random.default_rng(1)
    inc = rng.normal(0, [0.001, 0.01], size=(10_000, 2))
    tok = ActionTokenizer.fit(inc, n_bins=64)
    assert np.all(tok.lo_rad < np.quantile(inc, 0.001, axis=0))
    assert np.all(tok.hi_rad > np.quantile(inc, 0.999, axis=0))
    with pytest.raises(ValueError, match="hi_rad"):
        ActionTokenizer(np.array([0.0]), np.array([0.0]))
    with pytest.raises(ValueError, match="multiple of n_joints"):
        tok.decode(np.zeros(5, dtype=int))
    assert ActionTokenizer.from_state_dict(tok.state_dict()).state_dict() == tok.state_dict()
