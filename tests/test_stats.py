"""Latency/miss statistics and the report writers."""
import io
import json

import numpy as np
import pytest
import scipy.stats as st
from rich.console import Console

from edgeinfer.sim.report import print_table, write_report
from edgeinfer.sim.stats import (
    clopper_pearson_interval,
    early_stopping_estimate,
    early_stopping_passes,
    exceedance_p,
    fisher_exact_p,
    histogram_us,
    latency_summary_ms,
    mean_ci,
    min_passing_samples,
    quantile_ci,
    rms_ci,
    wilson_interval,
)


def test_wilson_known_values():
    lo, hi = wilson_interval(0, 100)
    assert lo == 0.0 and hi == pytest.approx(0.0370, abs=1e-4)
    lo, hi = wilson_interval(5, 100)
    assert lo == pytest.approx(0.0215, abs=1e-4) and hi == pytest.approx(0.1118, abs=1e-4)
    assert wilson_interval(100, 100)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)
    # Wider at higher confidence.
    assert wilson_interval(5, 100, 0.99)[1] > hi


def test_wilson_rejects_bad_input():
    for args in ((5, 4), (-1, 10)):
        with pytest.raises(ValueError):
            wilson_interval(*args)
    with pytest.raises(ValueError):
        wilson_interval(1, 10, confidence=1.0)


def test_latency_summary_matches_numpy():
    rng = np.random.default_rng(0)
    lat_ns = rng.lognormal(mean=15, sigma=0.5, size=5000).astype(np.int64)
    s = latency_summary_ms(lat_ns)
    ms = lat_ns / 1e6
    for key, p in (("p50", 50), ("p90", 90), ("p99", 99), ("p999", 99.9)):
        assert s[key] == pytest.approx(np.percentile(ms, p))
    assert s["max"] == pytest.approx(ms.max()) and s["mean"] == pytest.approx(ms.mean())


def test_latency_summary_empty_and_nan():
    assert latency_summary_ms(np.array([])) == dict.fromkeys(["p50", "p90", "p99", "p999", "max", "mean"])
    s = latency_summary_ms(np.array([1e6, 3e6, np.nan]))
    assert s["max"] == 3.0 and s["mean"] == 2.0


def test_quantile_ci():
    x = np.arange(1, 101, dtype=float)
    # Classic table value: the 95 % CI for the median of n=100 spans order statistics 40 and 61.
    assert quantile_ci(x, 0.5) == (40.0, 61.0)
    # p99 cannot be bounded above from 100 samples; 368 is the smallest n that can at 95 %.
    assert quantile_ci(x, 0.99) is None
    assert quantile_ci(np.arange(1, 368.0), 0.99) is None
    assert quantile_ci(np.arange(1, 369.0), 0.99) is not None
    assert quantile_ci([], 0.5) is None
    # Coverage: the true median of U(0, 1) is 0.5; a 95 % interval should contain it about 95 % of the time.
    rng = np.random.default_rng(1)
    hits = sum(lo <= 0.5 <= hi for lo, hi in (quantile_ci(rng.random(200), 0.5) for _ in range(400)))
    assert hits / 400 > 0.92


def _report(decode, spec=None):
    return {"schema": "edgeinfer.replay/1", "log": "synthetic-minjerk-seed0", "rate_hz": 250.0,
            "deadline_ms": 4.0, "decode": decode, "observations_sent": 750, "commands_received": 749,
            "latency_ms": latency_summary_ms(np.array([1e6, 2e6, 5e6])), "deadline_misses": 1,
            "miss_rate": 1 / 750, "miss_rate_ci95": list(wilson_interval(1, 750)),
            "outcomes": {"on_time": 748, "late": 1, "lost": 1, "hold": 0},
            "fallbacks": {"draft_only": 2} if spec else {"hold": 1},
            "spec": {"acceptance_rate": spec, "tokens_per_target_pass": None},
            "quality": {"action_rmse_rad": None}, "extra": {"anything": [1, 2]}}


def test_print_table_with_none_values():
    out = io.StringIO()
    reports = [_report("target"), _report("speculative", spec=0.8)]
    reports[0]["miss_rate"] = None
    table = print_table(reports, console=Console(file=out, width=140))
    text = out.getvalue()
    assert "speculative" in text and "ticks served by hold" in text and "ticks served by draft_only" in text
    assert "chunks by rung" in text
    assert "0.800" in text and table.row_count >= 14


def test_write_report(tmp_path):
    r = _report("speculative", spec=np.float64(0.5))
    r["quality"]["action_rmse_rad"] = float("nan")
    path = write_report(r, tmp_path / "out")
    back = json.loads(path.read_text())
    assert path.name == "report.json" and back["spec"]["acceptance_rate"] == 0.5
    assert back["quality"]["action_rmse_rad"] is None and back["schema"] == "edgeinfer.replay/1"


def test_clopper_pearson_matches_scipy():
    for k, n in ((0, 100), (5, 100), (100, 100), (1, 937), (37, 937), (3, 10_000), (500, 1000), (2, 10**6)):
        for conf in (0.9, 0.95, 0.99):
            ref = st.binomtest(k, n).proportion_ci(conf, method="exact")
            lo, hi = clopper_pearson_interval(k, n, conf)
            assert lo == pytest.approx(ref.low, rel=1e-5, abs=1e-15) and hi == pytest.approx(ref.high, rel=1e-5)
    # 0 misses in n ticks: the upper bound has the closed form 1 - (a/2)^(1/n) ("rule of three" ~ 3.7/n)
    assert clopper_pearson_interval(0, 937)[1] == pytest.approx(1 - 0.025 ** (1 / 937), rel=1e-9)
    assert clopper_pearson_interval(0, 0) == (0.0, 1.0)
    for args in ((5, 4), (-1, 10)):
        with pytest.raises(ValueError):
            clopper_pearson_interval(*args)


def test_loadgen_min_passing_samples_known_values():
    # h for t = 0 is ceil(log(1 - c) / log(p)): 44 at p90 and 459 at p99 with LoadGen's c = 0.99
    assert min_passing_samples(0, 0.90, 0.99) == 44
    assert min_passing_samples(0, 0.99, 0.99) == 459
    # LoadGen's SingleStream needs 64 queries for one over-latency query at p90, 99 % (h = 63, t = 1)
    assert min_passing_samples(1, 0.90, 0.99) == 63
    for t in (0, 1, 5, 20):
        for p, c in ((0.9, 0.99), (0.99, 0.975), (0.999, 0.95)):
            h = min_passing_samples(t, p, c)
            # h is the least passing count: LoadGen's odds(h, t) = P(Binomial(h+t, 1-p) <= t) < 1 - c
            assert st.binom.cdf(t, h + t, 1 - p) < 1 - c <= st.binom.cdf(t, h - 1 + t, 1 - p)
            assert early_stopping_passes(t, h + t, p, c) and not early_stopping_passes(t, h + t - 1, p, c)
    with pytest.raises(ValueError):
        min_passing_samples(-1, 0.9)
    with pytest.raises(ValueError):
        early_stopping_passes(1, 5, 1.5)


def test_early_stopping_estimate_is_the_order_statistic_bound():
    rng = np.random.default_rng(3)
    for n in (400, 937, 5000):
        x = rng.lognormal(0, 0.5, n)
        for p in (0.5, 0.9, 0.99):
            assert early_stopping_estimate(x, p, 0.975) == quantile_ci(x, p, 0.95)[1]
    x = np.arange(1, 1001.0)
    est = early_stopping_estimate(x, 0.99, 0.99)
    above = int(np.sum(x > est))  # the samples above the estimate still pass; one more would not
    assert early_stopping_passes(above, 1000, 0.99, 0.99) and not early_stopping_passes(above + 1, 1000, 0.99, 0.99)
    assert early_stopping_estimate(np.arange(100.0), 0.99, 0.99) is None  # < 459 samples
    lost = np.r_[np.ones(990), np.full(10, np.nan)]  # lost samples are +inf: 1 % lost cannot show a p99
    assert early_stopping_estimate(lost, 0.99, 0.975) == np.inf


def test_fisher_exact_matches_scipy():
    for ka, na, kb, nb in ((0, 937, 5, 937), (3, 100, 10, 120), (0, 10, 0, 10), (12, 1500, 30, 1500),
                           (1, 2, 1, 3), (750, 1500, 0, 1500)):
        ref = st.fisher_exact([[ka, na - ka], [kb, nb - kb]]).pvalue
        assert fisher_exact_p(ka, na, kb, nb) == pytest.approx(ref, rel=1e-6)
        # one-sided: B's proportion higher <=> the table's odds ratio below 1
        less = st.fisher_exact([[ka, na - ka], [kb, nb - kb]], alternative="less").pvalue
        greater = st.fisher_exact([[ka, na - ka], [kb, nb - kb]], alternative="greater").pvalue
        assert fisher_exact_p(ka, na, kb, nb, "b_greater") == pytest.approx(less, rel=1e-6)
        assert fisher_exact_p(ka, na, kb, nb, "b_less") == pytest.approx(greater, rel=1e-6)
    with pytest.raises(ValueError):
        fisher_exact_p(5, 4, 0, 1)


def test_exceedance_and_mean_and_rms_intervals():
    assert exceedance_p(0, 10, 10) == 1.0
    assert exceedance_p(1, 10, 10) == pytest.approx(10 / 20)
    assert exceedance_p(5, 1000, 1000) == pytest.approx(np.prod([(1000 - i) / (2000 - i) for i in range(5)]))
    # simulation: under one distribution the test rejects at most ~alpha of the time
    rng = np.random.default_rng(4)
    rejects = 0
    for _ in range(300):
        a, b = rng.random(200), rng.random(200)
        rejects += exceedance_p(int(np.sum(b > a.max())), 200, 200) < 0.05
    assert rejects / 300 < 0.08
    lo, hi = mean_ci(rng.normal(10.0, 1.0, 10_000))
    assert lo < 10.0 < hi and hi - lo == pytest.approx(2 * 1.96 / 100, rel=0.05)
    assert mean_ci([1.0, np.nan]) == (np.inf, np.inf) and mean_ci([1.0]) is None
    e = rng.normal(0, 0.01, (2000, 6))
    lo, hi = rms_ci(e, batch=50)
    assert lo < 0.01 < hi
    assert rms_ci(e[:60], batch=50) is None


def test_histogram_us_is_sparse_1us_bins():
    h = histogram_us(np.array([1_000, 1_999, 2_000, 2_500, 10_000_000, np.nan]))
    assert h == [[1, 2], [2, 2], [10_000, 1]]
    assert histogram_us(np.array([-1500.0, 2500.0]), bin_us=2) == [[-2, 1], [2, 1]]
    with pytest.raises(ValueError):
        histogram_us(np.array([1.0]), bin_us=0)
