"""The speculation ceiling of an engine's pass-cost curve (edgeinfer/bench/ceiling.py)."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgeinfer.bench.ceiling import ceiling, ceiling_lines, chunk_us, speedup_at

# `edgeinfer bench engines --policy large` on the 2-core EPYC VM: packed fp32, two threads (p50 us per pass)
PACKED_X2 = {"1": 107.42, "2": 121.76, "3": 140.62, "4": 164.07, "5": 195.1, "6": 232.31, "7": 271.6, "8": 309.06,
             "9": 346.92}


def test_a_flat_curve_is_bounded_by_the_drafts_kept():
    flat = {t: 100.0 for t in range(1, 10)}
    best = ceiling(flat, 48)
    assert best["k"] == 8
    assert best["ratio"] == pytest.approx(48 / (1 + 47 / 9), abs=1e-3)


def test_a_pass_that_costs_its_tokens_never_pays():
    linear = {t: 100.0 * t for t in range(1, 10)}
    assert ceiling(linear, 48) == {"ratio": 1.0, "k": 0}


def test_the_packed_cpu_curve_caps_even_an_oracle_drafter():
    best = ceiling(PACKED_X2, 48)
    assert best["k"] >= 5 and 2.6 < best["ratio"] < 2.75
    # the learned drafter's tokens per verify pass at k = 3 and 4 (47 / 15.1, 47 / 13.3 verify passes per chunk)
    measured = ceiling(PACKED_X2, 48, {3: 47 / 15.1, 4: 47 / 13.3})
    assert measured["k"] in (3, 4) and 1.9 < measured["ratio"] < 2.05


def test_tokens_per_pass_outside_one_to_k_plus_one_is_refused():
    with pytest.raises(ValueError, match="tokens per pass"):
        chunk_us({1: 1.0, 3: 2.0}, 48, 2, 3.5)
    with pytest.raises(ValueError, match="single-token"):
        ceiling({2: 1.0}, 48)


@given(st.lists(st.floats(1.0, 1e4), min_size=2, max_size=9), st.integers(2, 64))
def test_the_oracle_bounds_every_measured_drafter(costs, n):
    curve = {t + 1: c for t, c in enumerate(sorted(costs))}  # a longer pass never costs less
    oracle = ceiling(curve, n)
    partial = ceiling(curve, n, {k: (k + 2) / 2 for k in range(1, len(curve))})
    assert 1.0 <= partial["ratio"] <= oracle["ratio"] + 1e-9


def test_speedup_at_a_k_that_loses_is_below_one_not_clamped():
    linear = {t: 100.0 * t for t in range(1, 6)}  # k + 1 tokens cost k + 1 passes
    assert speedup_at(linear, 48, 4, 2.0) < 1.0 == ceiling(linear, 48, {4: 2.0})["ratio"]
    assert speedup_at(linear, 48, 4, 2.0) == pytest.approx(4800 / (100 + 47 / 2.0 * 500))


def test_the_bench_lines_pair_each_drafter_row_with_its_engines_curve():
    def row(decode, k, chunk_us, passes, threads):
        return {"policy": "p", "backend": "packed", "precision": "fp32", "threads": threads, "decode": decode, "k": k,
                "acceptance": "greedy", "chunk_us_p50": chunk_us, "target_passes_per_chunk": passes, "error": None}

    result = {"data": {"threads": 1},
              "rows": [{"backend": "packed", "precision": "fp32", "threads": 2, "pass_cost_us_p50": PACKED_X2},
                       {"backend": "torch", "precision": "fp32", "threads": 1, "pass_cost_us_p50": None}],
              "ultrafast": {"policies": {"p": {"n_tokens": 48}},
                            "rows": [row("target-only", None, 4961.0, 48, 2), row("learned", 4, 5588.0, 14.3, 2),
                                     row("learned", 4, 8259.0, 14.3, None)]}}  # threads 1: another engine
    [line] = ceiling_lines(result)
    assert line.startswith("p: ceiling of speculation on packed fp32 x2 threads")
    assert "learned k=4 (3.53 tokens per verify pass)" in line and "measured x0.89" in line
    shifted = {int(t): c - PACKED_X2["1"] + 4961.0 / 48 for t, c in PACKED_X2.items()}  # the chunk's cost per pass
    bound = (48 * shifted[1]) / (shifted[1] + 47 / (47 / 13.3) * shifted[5])
    assert f"x{bound:.2f} with free drafting" in line
    assert line.count("learned") == 1
