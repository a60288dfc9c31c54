"""`edgeinfer train` says when it learned nothing: the held-out action error against holding
still and constant velocity with 95 % bootstrap intervals, a warning and the manifest's "heldout" verdict, and
the metadata's episodes and frames against those found."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from edgeinfer.engines.training.evaluate import heldout_comparison
from edgeinfer.engines.training.fit_data import FitDataConfig, load_fit_data
from edgeinfer.engines.training.train import TrainConfig, train

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def _write_csv(path: Path, q: np.ndarray, rate_hz: float = 100.0) -> None:
    t = np.arange(len(q)) / rate_hz
    header = "t," + ",".join(f"q{j}" for j in range(q.shape[1]))
    np.savetxt(path, np.column_stack([t, q]), delimiter=",", header=header, comments="")


def _console() -> Console:
    return Console(record=True, width=200, force_terminal=False)


def test_a_policy_trained_on_a_stationary_arm_is_flagged_as_no_better_than_holding(tmp_path):
    # an arm at rest with sensor noise: nothing to predict, holding still is the best there is
    folder = tmp_path / "logs"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        _write_csv(folder / f"run{i}.csv", 0.5 + 1e-3 * rng.standard_normal((300, 2)))
    out = tmp_path / "p.json"
    console = _console()
    train(TrainConfig(data=folder, derive="qd", steps=5, batch_size=16, out=out), console)
    text = console.export_text()
    heldout = json.loads(out.read_text())["heldout"]
    assert heldout["verdict"].startswith("NOT better than hold")
    assert "hold" not in heldout["better_than"]
    assert heldout["held_out_units"] == ["run2.csv"]
    lo, hi = heldout["hold_rmse_rad"]["ci95"]
    assert 1.0e-3 < lo <= heldout["hold_rmse_rad"]["value"] <= hi < 2.0e-3  # sqrt(2) x 1 mrad of noise
    assert heldout["policy_minus_hold_rad"]["ci95"][1] >= 0
    assert "WARNING: the policy is NOT better than hold" in text
    assert "hold still" in text and "const velocity" in text and "95% CI" in text


def test_the_comparison_is_paired_and_blocked():
    rng = np.random.default_rng(1)
    offsets = rng.standard_normal((400, 4, 2))
    inc = offsets[:, 0]  # constant velocity from the first step: exact on step 1
    units = np.repeat([0, 1], 200)
    good = heldout_comparison(offsets + 0.01 * rng.standard_normal(offsets.shape), offsets, inc, units, 8)
    assert good["verdict"] == "better than both baselines" and good["better_than"] == ["hold", "const_velocity"]
    assert good["resampled"] == "blocks of 8 windows" and good["n_resampled"] == 50
    assert good["policy_rmse_rad"]["ci95"][1] < 0.02
    same = heldout_comparison(np.zeros_like(offsets), offsets, inc, units, 8)  # the policy *is* hold
    assert same["policy_minus_hold_rad"] == {"value": 0.0, "ci95": [0.0, 0.0]}
    assert same["verdict"] == "NOT better than hold"  # better than constant velocity, not than holding
    many = heldout_comparison(np.zeros_like(offsets), offsets, inc, np.repeat(np.arange(20), 20), 8)
    assert many["resampled"] == "units" and many["n_resampled"] == 20


def test_real_schunk_runs_record_both_baselines_with_intervals(schunk_dir, tmp_path):
    folder = tmp_path / "schunk"  # three real runs, linked (not copied); measurement_11 held out
    folder.mkdir()
    for n in (2, 3, 11):
        (folder / f"measurement_{n}").symlink_to(schunk_dir / f"measurement_{n}")
    out = tmp_path / "p.json"
    console = _console()
    train(TrainConfig(data=folder, steps=5, batch_size=32, out=out), console)
    m = json.loads(out.read_text())
    heldout = m["heldout"]
    assert heldout["held_out_units"] == ["measurement_11"] and heldout["windows"] == m["metrics_held_out"]["windows"]
    assert heldout["hold_rmse_rad"]["value"] == pytest.approx(m["metrics_held_out"]["baseline_hold_rmse_rad"])
    for key in ("policy_rmse_rad", "hold_rmse_rad", "const_velocity_rmse_rad"):
        lo, hi = heldout[key]["ci95"]
        assert 0 < lo <= heldout[key]["value"] <= hi
    # the Schunk arm moves smoothly: constant velocity is far better than holding, 5 steps learn nothing
    assert heldout["const_velocity_rmse_rad"]["ci95"][1] < heldout["hold_rmse_rad"]["ci95"][0]
    assert "const_velocity" not in heldout["better_than"]
    assert "WARNING" in console.export_text()
    assert m["data"]["metadata_claims"] is None and m["data"]["warnings"] == []


def test_episodes_claimed_by_the_metadata_but_missing_are_named():
    path = SHARED / "reachy2_lerobot_v30"
    if not path.is_dir():
        pytest.skip(f"real data not found at {path}")
    data = load_fit_data(FitDataConfig(data=path))
    assert data.claims == {"where": str(path / "meta" / "info.json"), "episodes_claimed": 50,
                           "frames_claimed": 14983, "episodes_found": 3, "frames_found": 899}
    assert data.warnings == [f"{path / 'meta' / 'info.json'} claims 50 episodes / 14983 frames; the data files "
                             "hold 3 episodes / 899 frames: training on 2 and holding out 1 of those found"]
