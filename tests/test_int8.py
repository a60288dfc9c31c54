"""INT8 weights (engines/backends/int8.py) for onnxruntime: built through the engine cache under their own key, refused
by the quality gate past a tight bound and labelled LOSSY; a deliberately damaged engine likewise."""
import pytest
from rich.console import Console

from edgeinfer.engines.backends import build as build_module
from edgeinfer.engines.backends.build import BuildConfig, build
from edgeinfer.engines.backends.torch_engine import TorchEngine

pytestmark = pytest.mark.background  # CPU-bound, no real-time bound (tests/conftest.py)


def test_int8_engine_is_refused_past_a_tight_bound_and_labelled_lossy(schunk_dir, tmp_path, monkeypatch,
                                                                     one_torch_thread):
    monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(tmp_path / "engines"))
    s = build(BuildConfig(backend="onnxruntime", precision="int8", data_dir=schunk_dir, n_obs=32,
                          min_token_agreement=0.99), Console(quiet=True))
    q = s["quality"]
    # measured 0.88 token agreement on 256 held-out observations (dynamic int8, MatMul weights per channel)
    assert 0.5 < q["token_agreement"] < 0.99 and q["max_abs_logit_diff"] > 1e-3
    assert not s["passed"] and s["lossy"]
    assert s["plan"]["path"].endswith("plan.onnx") and not s["plan"]["cached"]
    assert s["plan"]["bytes"] < 400_000  # int8 weights: smaller than the fp32 plan (580 KB)


class DamagedEngine(TorchEngine):
    """The fp32 target with bin 0's logit raised at every position: greedy decoding picks bin 0 throughout."""

    def forward(self, obs, tokens, start):
        logits = super().forward(obs, tokens, start)
        logits[:, 0] += 100.0
        return logits


@pytest.mark.parametrize("min_agreement, max_rmse_increase", [(0.99, 10.0), (0.0, 0.0)])
def test_the_gate_refuses_a_damaged_engine_on_either_bound(schunk_dir, policy, monkeypatch, one_torch_thread,
                                                           min_agreement, max_rmse_increase):
    monkeypatch.setattr(build_module, "load_engine", lambda policy, *a, **k: DamagedEngine(policy.model))
    s = build(BuildConfig(backend="torch", data_dir=schunk_dir, n_obs=16, min_token_agreement=min_agreement,
                          max_rmse_increase=max_rmse_increase), Console(quiet=True))
    assert s["quality"]["token_agreement"] < 1.0 and s["lossy"] and not s["passed"]


def test_the_exact_fp32_engine_is_not_lossy(schunk_dir, one_torch_thread):
    s = build(BuildConfig(backend="torch", data_dir=schunk_dir, n_obs=8), Console(quiet=True))
    assert s["passed"] and not s["lossy"] and s["quality"]["token_agreement"] == 1.0
