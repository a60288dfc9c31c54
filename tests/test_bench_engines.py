"""Engine bench: a seconds-long CPU run whose JSON is complete and consistent (timings never asserted)."""
import json

import pytest
import torch

from edgeinfer.bench.engines import METRICS, VERIFY_KS, bench_engines, headline, main

ROW_KEYS = {"backend", "precision", "device", "cuda_graphs", "per_token_us_p50", "per_token_us_p99", "verify_us_p50",
            "chunk_us_p50", "chunk_us_p99", "spec_chunk_us_p50", "max_abs_logit_diff", "token_agreement",
            "action_rmse_rad", "error"}


@pytest.fixture(scope="module")
def bench(policy, tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    result = bench_engines(policy, backends=("torch", "onnxruntime"), precisions=("fp32", "bf16", "fp8"),
                           device="cpu", n_obs=3, json_out=path, n_iters=5, quiet=True)
    return result, path


def test_bench_json_is_complete_and_consistent(bench):
    result, path = bench
    assert json.loads(path.read_text()) == result
    assert {"cpu", "cores", "gpu", "gpu_capability", "torch", "onnxruntime"} <= set(result["machine"])
    rows = result["rows"]
    # onnxruntime builds fp32 only (engines.engine.BUILDS): no rows for what it cannot build
    assert [(r["backend"], r["precision"]) for r in rows] == [
        ("torch", "fp32"), ("torch", "bf16"), ("torch", "fp8"), ("onnxruntime", "fp32")]
    for r in rows:
        assert ROW_KEYS <= set(r)
        assert r["device"] == "cpu" and r["cuda_graphs"] is False
        if r["error"]:
            assert all(r[m] is None for m in METRICS), r
            continue
        assert 0 < r["per_token_us_p50"] <= r["per_token_us_p99"]
        assert 0 < r["chunk_us_p50"] <= r["chunk_us_p99"]
        assert r["spec_chunk_us_p50"] > 0
        assert set(r["verify_us_p50"]) == {str(k) for k in VERIFY_KS}
        assert all(v > 0 for v in r["verify_us_p50"].values())
        assert 0 <= r["token_agreement"] <= 1 and 0 <= r["teacher_forced_agreement"] <= 1
        assert r["max_abs_logit_diff"] >= 0 and r["action_rmse_rad"] > 0
        assert r["spec_equals_greedy"] == 1.0  # speculative decoding is exact on every backend
    torch_rows = {r["precision"]: r for r in rows if r["backend"] == "torch"}
    assert not any(r["error"] for r in torch_rows.values())  # torch builds all three on CPU
    ref = torch_rows["fp32"]  # the same engine as the reference: bit for bit
    assert ref["token_agreement"] == 1.0 and ref["teacher_forced_agreement"] == 1.0
    assert ref["max_abs_logit_diff"] == 0.0
    assert ref["action_rmse_rad"] == result["reference"]["action_rmse_rad"]
    assert any(line.startswith("torch cpu: FP8 (emulated) full action chunk") for line in headline(rows))


def test_unavailable_device_gives_error_rows_not_a_crash(policy):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    result = bench_engines(policy, backends=("torch", "tensorrt", "nope"), precisions=("fp32",), device="cuda:0",
                           n_obs=1, n_iters=1, cuda_graphs="both", quiet=True)
    assert [r["backend"] for r in result["rows"]] == ["torch", "tensorrt", "nope", "torch"]
    assert [r["cuda_graphs"] for r in result["rows"]] == [False, False, False, True]
    assert all(r["error"].startswith("unavailable:") for r in result["rows"])


def test_summary_merges_saved_runs(bench, capsys):
    _, path = bench
    assert main(["--summary", str(path), str(path)]) == 0
    out = capsys.readouterr().out
    assert "full action chunk" in out and "fp8" in out
