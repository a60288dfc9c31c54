"""Latency/miss statistics and the report writers."""
import io
import json

import numpy as np
import pytest
from edgeinfer.sim.report import plot_latency, print_table, write_report
from edgeinfer.sim.stats import latency_summary_ms, quantile_ci, wilson_interval
from rich.console import Console


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
    assert "speculative" in text and "fallback hold" in text and "fallback draft_only" in text
    assert "0.800" in text and table.row_count >= 14


def test_write_report(tmp_path):
    r = _report("speculative", spec=np.float64(0.5))
    r["quality"]["action_rmse_rad"] = float("nan")
    path = write_report(r, tmp_path / "out")
    back = json.loads(path.read_text())
    assert path.name == "report.json" and back["spec"]["acceptance_rate"] == 0.5
    assert back["quality"]["action_rmse_rad"] is None and back["schema"] == "edgeinfer.replay/1"


def test_plot_latency_writes_png(tmp_path):
    rng = np.random.default_rng(2)
    lat = rng.gamma(4.0, 0.5, size=1000)
    lat[10] = np.nan
    path = plot_latency(lat, 4.0, (lat > 4.0) | np.isnan(lat), tmp_path / "plots" / "latency.png", "smoke")
    data = path.read_bytes()
    assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError):
        plot_latency(lat, 4.0, lat[:10] > 4.0, tmp_path / "bad.png", "bad")
