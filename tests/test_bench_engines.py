"""Engine bench: a seconds-long CPU run whose JSON is complete and consistent (timings never asserted)."""
import json

import numpy as np
import pytest
import torch

from edgeinfer.bench.engines import METRICS, VERIFY_KS, bench_engines, headline, main

pytestmark = pytest.mark.background  # CPU-bound, no real-time bound (tests/conftest.py)

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


# --- ultrafast rows (edgeinfer/bench/ultrafast.py) ---------------------------------------------------------------

@pytest.fixture(scope="module")
def ultrafast(policy):
    """A tiny run: torch (the baseline engine), onnxruntime, and tensorrt (never available on CPU)."""
    from edgeinfer.bench.ultrafast import UltrafastConfig, bench_ultrafast

    cfg = UltrafastConfig(n_obs=4, warmup_chunks=1, kinematic_ks=(4,), learned_ks=(4,), preset=False,  # auto: probes
                          engines=(("torch", "fp32", None), ("onnxruntime", "fp32", None), ("tensorrt", "fp32", None)))
    saved = []
    section = bench_ultrafast([policy], cfg, save=lambda s: saved.append(json.loads(json.dumps(s))), quiet=True)
    return section, saved


def test_ultrafast_rows_have_every_field_and_one_baseline(ultrafast):
    from edgeinfer.bench.ultrafast import FIGURES

    section, saved = ultrafast
    rows = section["rows"]
    assert [(r["backend"], r["decode"], r["k"], r["acceptance"]) for r in rows] == [
        ("torch", "target-only", None, "greedy"), ("torch", "kinematic", 4, "greedy"),
        ("torch", "learned", 4, "greedy"), ("torch", "kinematic", 8, "relaxed+/-1"),
        ("onnxruntime", "target-only", None, "greedy"), ("onnxruntime", "kinematic", 4, "greedy"),
        ("onnxruntime", "learned", 4, "greedy"), ("onnxruntime", "kinematic", 8, "relaxed+/-1"),
        ("tensorrt", "target-only", None, "greedy"), ("tensorrt", "kinematic", 4, "greedy"),
        ("tensorrt", "learned", 4, "greedy"), ("tensorrt", "kinematic", 8, "relaxed+/-1")]
    assert [r["baseline"] for r in rows].count(True) == 1 and rows[0]["baseline"]
    assert section["policies"]["schunk_target"]["params"] > 0
    n = section["policies"]["schunk_target"]["n_tokens"]
    measured = [r for r in rows if r["backend"] in ("torch", "onnxruntime")]
    for r in measured:
        assert r["error"] is None, r
        assert set(FIGURES) <= set(r) and r["policy"] == "schunk_target"
        assert 0 < r["chunk_us_p50"] <= r["chunk_us_p99"]
        assert r["target_passes_per_chunk"] * r["tokens_per_pass"] == pytest.approx(n, rel=1e-2)
        assert 0 <= r["token_agreement"] <= 1 and r["action_rmse_rad"] > 0
        drafts = r["decode"] != "target-only"
        assert (r["acceptance_rate"] is not None) == drafts and (r["drafter_us_per_token"] is not None) == drafts
        assert (r["target_passes_per_chunk"] == n) == (not drafts or r["acceptance_rate"] == 0)
        # a model drafter runs its own passes: at least its prefill per chunk; the kinematic drafter runs none
        assert (r["draft_passes_per_chunk"] is not None) == (r["decode"] == "learned")
        if r["decode"] == "learned":
            assert r["draft_passes_per_chunk"] >= 1
    # the JSON is saved after every row, each time with one more row (then once more with the baseline's drift)
    assert [len(s["rows"]) for s in saved] == [*range(1, len(rows) + 1), len(rows)]
    assert saved[-1] == json.loads(json.dumps(section))


def test_ultrafast_ratios_divide_by_this_runs_baseline(ultrafast):
    section, _ = ultrafast
    base = section["rows"][0]
    assert base["vs_baseline"] == 1.0 and base["token_agreement"] == 1.0
    for r in section["rows"]:
        if r["error"] is None:
            assert r["vs_baseline"] == round(base["chunk_us_p50"] / r["chunk_us_p50"], 3), r


def test_ultrafast_exact_and_lossy_labels(ultrafast):
    section, _ = ultrafast
    for r in section["rows"]:
        if r["error"]:
            assert r["label"] is None and r["exact"] is None
        elif r["acceptance"].startswith("relaxed"):  # lossy by its rule, whatever its agreement on 4 chunks
            assert r["label"] == "lossy" and r["exact"] is False
        else:  # greedy acceptance on fp32 torch/onnxruntime: the target's own tokens
            assert r["label"] == ("exact" if r["token_agreement"] == 1.0 else "lossy")
            if r["backend"] == "torch":
                assert r["exact"] is True
    fastest = [line for line in section["headline"] if line.startswith("schunk_target: fastest exact: ")]
    assert len(fastest) == 1 and "goal x14: " in fastest[0] and "relaxed" not in fastest[0]


def test_relaxed_acceptance_is_lossy_even_when_its_tokens_agree(policy):
    """Relaxed acceptance is lossy by its rule: with bins=0 it keeps exactly greedy's drafts (agreement 1.0 on
    these chunks), and its row is still labelled lossy, never a candidate for the fastest exact row."""
    from edgeinfer.bench.ultrafast import UltrafastConfig, bench_ultrafast

    cfg = UltrafastConfig(n_obs=2, warmup_chunks=0, engines=(("torch", "fp32", None),), kinematic_ks=(), learned_ks=(),
                          relaxed_bins=0, relaxed_k=4, preset=False)
    base, relaxed = bench_ultrafast([policy], cfg, quiet=True)["rows"]
    assert base["label"] == "exact" and relaxed["acceptance"] == "relaxed+/-0"
    assert relaxed["token_agreement"] == 1.0 and relaxed["exact"] is False and relaxed["label"] == "lossy"


def test_ultrafast_baseline_drift_is_measured_and_warned(ultrafast):
    from edgeinfer.bench.ultrafast import headline

    section, saved = ultrafast
    pol = section["policies"]["schunk_target"]
    assert pol["baseline_end_us_p50"] > 0
    assert pol["baseline_drift"] == round(pol["baseline_end_us_p50"] / section["rows"][0]["chunk_us_p50"], 3)
    assert saved[-1]["policies"]["schunk_target"]["baseline_drift"] == pol["baseline_drift"]
    warned = lambda drift: any("WARNING" in line for line in headline(  # noqa: E731
        {**section, "policies": {"schunk_target": {**pol, "baseline_drift": drift}}}))
    assert [warned(d) for d in (1.0, 1.2, 1 / 1.2, 1.3, 0.7)] == [False, False, False, True, True]


def test_ultrafast_unavailable_engine_is_an_error_row(ultrafast):
    from edgeinfer.bench.ultrafast import FIGURES

    section, _ = ultrafast
    trt = [r for r in section["rows"] if r["backend"] == "tensorrt"]
    assert len(trt) == 4
    for r in trt:
        assert r["error"].startswith("unavailable: tensorrt runs on CUDA devices only"), r
        assert all(r[f] is None for f in FIGURES)


def test_preset_decode_is_exact_and_speculates(policy):
    """The ultrafast row's decode (the runtime's adaptive planner, unbudgeted) on the torch engine: the target's
    greedy tokens, in fewer target passes than tokens (its exploration speculates at k = 1, 2, 4, 8, 16 first)."""
    from edgeinfer.bench.ultrafast import Stack, measure_stack
    from edgeinfer.engines.backends.build import load_engine
    from edgeinfer.engines.backends.calibration import sample_windows
    from edgeinfer.engines.models.drafters import KinematicDrafter

    feats, _, _ = sample_windows(policy, 3, 1)
    engine = load_engine(policy, "torch")
    _, greedy = measure_stack(engine, policy, feats, Stack("torch", "fp32", "target-only"), warmup=0)
    figures, tokens = measure_stack(engine, policy, feats, Stack("auto", "fp32", "preset"),
                                    KinematicDrafter(policy.tokenizer), warmup=3)
    assert np.array_equal(tokens, greedy)
    assert figures["target_passes_per_chunk"] < policy.cfg.n_tokens and figures["drafter_us_per_token"] > 0


def test_timed_drafter_counts_time_and_tokens_on_its_clock(policy):
    from edgeinfer.bench.ultrafast import TimedDrafter
    from edgeinfer.engines.models.drafters import KinematicDrafter

    ticks = iter(range(0, 10_000, 100))  # every clock read advances 100 ns
    timed = TimedDrafter(KinematicDrafter(policy.tokenizer), clock=lambda: next(ticks))
    d = policy.cfg.n_joints
    timed.reset([0.0] * d, [0.0] * d, [0.0] * d)
    assert timed.propose([], 3) == timed.inner.propose([], 3)
    assert len(timed.propose_dist([1, 2], 2, None, None)[0]) == 2
    assert (timed.ns, timed.drafted, timed.name) == (300, 5, "kinematic")


def test_bench_main_refuses_a_missing_policy(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--rows", "ultrafast", "--policy", str(tmp_path / "nope.json")])
    assert f"--policy: no such manifest: {tmp_path / 'nope.json'}" in capsys.readouterr().err


def test_summary_prints_a_saved_ultrafast_run(ultrafast, tmp_path, capsys):
    section, _ = ultrafast
    path = tmp_path / "uf.json"
    path.write_text(json.dumps({"rows": [], "ultrafast": section}))
    assert main(["--summary", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ultrafast rows on cpu" in out and "schunk_target: fastest exact: " in out
    assert "onnxruntime fp32 kinematic k=8 relaxed+/-1" in out
