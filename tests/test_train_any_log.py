"""`edgeinfer train` / `distill` on any log the replayer reads (engines/training/fit_data.py): units and split, windows
inside units, fitted limits, the manifest, and the refusal to overwrite the shipped weights. Real LeRobot
datasets from ../shared/data (skipped without them), plus small CSV folders written here."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from edgeinfer.cli import main as edgeinfer_cli
from edgeinfer.core.config import field_docs
from edgeinfer.engines.models.paths import DEFAULT_POLICY, WEIGHTS_DIR
from edgeinfer.engines.models.policy import load_policy
from edgeinfer.engines.training.distill import DistillConfig, distill
from edgeinfer.engines.training.fit_data import FitDataConfig, default_horizon, default_stride_ticks, load_fit_data
from edgeinfer.engines.training.train import TrainConfig, train
from edgeinfer.logs.lerobot_log import list_lerobot_episodes

pytestmark = pytest.mark.background  # CPU-bound, no real-time bound (tests/conftest.py)

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
# name: (joints, rate Hz, episodes, default stride ticks, default horizon)
LEROBOT = {"reachy2_lerobot_v30": (19, 30.0, 3, 1, 4), "gr1_sim_lerobot_v20": (44, 20.0, 5, 1, 2)}


def _shared(name: str) -> Path:
    path = SHARED / name
    if not path.is_dir():
        pytest.skip(f"real data not found at {path}")
    return path


def _write_csv(path: Path, q: np.ndarray, rate_hz: float = 100.0) -> Path:
    """A CSV log with a time column and positions only (velocities to derive)."""
    t = np.arange(len(q)) / rate_hz
    header = "t," + ",".join(f"q{j}" for j in range(q.shape[1]))
    np.savetxt(path, np.column_stack([t, q]), delimiter=",", header=header, comments="")
    return path


@pytest.fixture
def csv_folder(tmp_path) -> Path:
    """Three 2-joint CSV runs (positions only, 100 Hz): run1, run2 near 0 rad, run10 (last by number, not by
    text) near 100 rad, so that a window crossing two runs or a limit fitted on run10 would show."""
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "README.txt").write_text("not a log")
    for i, base in ((1, 0.0), (2, 0.5), (10, 100.0)):
        t = np.arange(120) / 100.0
        q = base + np.column_stack([0.3 * np.sin(2 * t + i), 0.2 * np.cos(3 * t)])
        _write_csv(folder / f"run{i}.csv", q)
    return folder


def test_schunk_split_is_the_shipped_one(schunk_dir):
    shipped = json.loads(DEFAULT_POLICY.read_text())["split"]
    data = load_fit_data(FitDataConfig(data=schunk_dir))
    number = lambda units: [int(str(u.name).removeprefix("measurement_")) for u in units]  # noqa: E731
    assert (number(data.train), number(data.held_out)) == (shipped["train"], shipped["held_out"])
    assert data.by == "file" and data.fmt == "schunk" and not data.manifest(0, 0)["qd_from_differences"]
    stride = default_stride_ticks(data.rate_hz)
    assert (stride, default_horizon(stride / data.rate_hz, data.n_joints)) == (5, 8)  # the shipped shape
    assert len(data.windows("train", 8, 5)[0]) == shipped["train_windows"]
    assert len(data.windows("held_out", 8, 5)[0]) == shipped["held_out_windows"]


def test_csv_folder_units_split_windows_and_limits(csv_folder):
    data = load_fit_data(FitDataConfig(data=csv_folder, derive="qd"))
    assert [u.name for u in data.train] == ["run1.csv", "run2.csv"] and [u.name for u in data.held_out] == ["run10.csv"]
    assert data.by == "file" and data.fmt == "csv" and data.rule == "held_out = the last file (run10.csv)"
    feats, offsets = data.windows("train", 4, 2)
    assert len(feats) == 2 * (120 - 5 * 2)  # per unit: stride <= t < T - H * stride
    assert np.abs(offsets).max() < 0.1  # no window spans run2 (near 0 rad) and run10 (near 100 rad)
    assert np.abs(data.windows("held_out", 4, 2)[0][:, :2] - 100).max() < 1  # held-out windows: run10's alone
    limits = data.limits()
    q = np.concatenate([u.log.q_rad for u in data.train])
    lo, hi = np.array(limits["q_min_rad"]), np.array(limits["q_max_rad"])
    assert np.all(lo < q.min(0)) and np.all(q.max(0) < hi) and np.all(hi < 2)  # training data only, widened
    np.testing.assert_allclose(hi - q.max(0), 0.1 * (q.max(0) - q.min(0)))
    qd = np.concatenate([u.log.qd_rad_s for u in data.train])
    np.testing.assert_allclose(limits["qd_max_rad_s"], 1.5 * np.abs(qd).max(0))
    manifest = data.manifest(1, 1)
    assert manifest["reader_options"] == {"derive": "qd"} and manifest["qd_from_differences"]
    assert manifest["split"]["train"] == ["run1.csv", "run2.csv"] and manifest["rate_hz"] == pytest.approx(100)


def test_held_out_option_and_refusals(csv_folder, tmp_path):
    given = load_fit_data(FitDataConfig(data=csv_folder, derive="qd", held_out="run1, run10.csv"))
    assert [u.name for u in given.train] == ["run2.csv"]
    assert [u.name for u in given.held_out] == ["run1.csv", "run10.csv"]
    with pytest.raises(ValueError, match="no file 'run3'.*run10.csv"):
        load_fit_data(FitDataConfig(data=csv_folder, derive="qd", held_out="run3"))
    with pytest.raises(ValueError, match="nothing left to train on"):
        load_fit_data(FitDataConfig(data=csv_folder, derive="qd", held_out="run1,run2,run10"))
    one = load_fit_data(FitDataConfig(data=csv_folder / "run2.csv", derive="qd"))  # one log: split by time
    assert one.by == "time" and [len(u.log) for u in one.train + one.held_out] == [96, 24]
    assert one.manifest(0, 0)["split"]["held_out_from_s"] == pytest.approx(0.96)
    with pytest.raises(ValueError, match="split by time"):
        load_fit_data(FitDataConfig(data=csv_folder / "run2.csv", derive="qd", held_out="run2"))
    runs = tmp_path / "schunk_like"  # Schunk runs of which none has n % 5 == 1: an empty held-out set
    runs.mkdir()
    for n in (2, 3):
        (runs / f"measurement_{n}").mkdir()
        (runs / f"measurement_{n}" / "time.csv").write_text("".join(f"{i * 0.004!r}\n" for i in range(50)))
        (runs / f"measurement_{n}" / "trajectory.csv").write_text("0.1,0.2\n" * 50)
    with pytest.raises(ValueError, match="no file is held out"):
        load_fit_data(FitDataConfig(data=runs))
    wide = tmp_path / "wide"
    wide.mkdir()
    for i in (1, 2):
        _write_csv(wide / f"w{i}.csv", np.zeros((20, 65)))
    with pytest.raises(ValueError, match="65 joints, more than the 64"):
        load_fit_data(FitDataConfig(data=wide, derive="qd"))


def test_out_defaults_outside_the_package_and_shipped_weights_refused(tmp_path, capsys):
    assert TrainConfig().out == Path("out/policies/schunk_lwa4p_target.json")
    assert DistillConfig().out == Path("out/policies/schunk_draft.json")
    assert DistillConfig(target=Path("x/gr1_target.json")).out == Path("out/policies/gr1_draft.json")
    for cls in (TrainConfig, DistillConfig):
        with pytest.raises(ValueError, match=f"{WEIGHTS_DIR}.*--overwrite-shipped"):
            cls(out=WEIGHTS_DIR / "schunk_target.json")
        assert cls(out=WEIGHTS_DIR / "schunk_target.json", overwrite_shipped=True).out.parent == WEIGHTS_DIR
    before = DEFAULT_POLICY.stat().st_mtime_ns
    assert edgeinfer_cli(["train", "--out", str(WEIGHTS_DIR / "schunk_target.json"), "--steps", "1"]) == 2
    assert "refusing to overwrite the shipped policies" in capsys.readouterr().err
    assert DEFAULT_POLICY.stat().st_mtime_ns == before


def test_every_option_has_help():
    for cls in (TrainConfig, DistillConfig):
        docs = field_docs(cls)
        assert [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)] == []


def test_list_lerobot_episodes_trusts_the_files():
    for name, (_, _, episodes, _, _) in LEROBOT.items():
        assert list_lerobot_episodes(_shared(name)) == list(range(episodes))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """A short training run (20 steps) on each real LeRobot dataset: {name: (manifest path, FitData)}."""
    out = {}
    for name in LEROBOT:
        if not (SHARED / name).is_dir():
            continue
        path = tmp_path_factory.mktemp(name) / f"{name}_target.json"
        train(TrainConfig(data=SHARED / name, steps=20, batch_size=32, out=path))
        out[name] = (path, load_fit_data(FitDataConfig(data=SHARED / name)))
    return out


@pytest.mark.parametrize("name", list(LEROBOT))
def test_train_on_lerobot(trained, name):
    _shared(name)
    joints, rate_hz, episodes, stride, horizon = LEROBOT[name]
    path, data = trained[name]
    m = json.loads(path.read_text())
    assert m["control_rate_hz"] == pytest.approx(rate_hz, abs=1e-3) and m["data"]["rate_hz"] == m["control_rate_hz"]
    assert (m["config"]["n_joints"], m["config"]["stride_ticks"], m["config"]["horizon"]) == (joints, stride, horizon)
    split = m["data"]["split"]
    assert split["by"] == "episode" and split["held_out"] == [episodes - 1]
    assert split["train"] == list(range(episodes - 1))
    assert m["data"]["format"] == "lerobot" and m["data"]["qd_from_differences"]  # no velocities in either set
    assert m["data"]["source"] == str(SHARED / name)
    q = np.concatenate([u.log.q_rad for u in data.train])
    qd = np.concatenate([u.log.qd_rad_s for u in data.train])
    lim = m["limits"]
    assert lim["source"] == "fitted" and len(lim["q_min_rad"]) == joints
    assert np.all(np.array(lim["q_min_rad"]) < q.min(0)) and np.all(q.max(0) < np.array(lim["q_max_rad"]))
    assert np.all(np.abs(qd).max(0) < np.array(lim["qd_max_rad_s"]))
    metrics = m["metrics_held_out"]
    assert metrics["windows"] == split["held_out_windows"] == len(data.windows("held_out", horizon, stride)[0])
    assert metrics["action_rmse_rad"] > 0 and metrics["baseline_hold_rmse_rad"] > 0
    policy = load_policy(path)  # sha256 checked
    assert policy.cfg.n_tokens == horizon * joints


def test_training_is_reproducible(csv_folder, tmp_path):
    a = train(TrainConfig(data=csv_folder, derive="qd", steps=3, batch_size=16, out=tmp_path / "a" / "p.json"))
    b = train(TrainConfig(data=csv_folder, derive="qd", steps=3, batch_size=16, out=tmp_path / "b" / "p.json"))
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert a.manifest["metrics_held_out"] == b.manifest["metrics_held_out"]


def test_distill_reuses_the_targets_data_and_split(trained, tmp_path):
    name = "reachy2_lerobot_v30"
    _shared(name)
    target_path = trained[name][0]
    cfg = DistillConfig(target=target_path, steps=5, batch_size=32, out=tmp_path / "draft.json")
    draft = distill(load_policy(target_path), cfg)
    target = json.loads(target_path.read_text())
    assert draft.manifest["data"]["split"] == target["data"]["split"]
    assert draft.manifest["distilled_from"] == target["sha256"]
    m = draft.manifest["metrics_held_out"]
    assert m["windows"] == target["data"]["split"]["held_out_windows"]
    assert 0 <= m["acceptance_rate"] <= 1 and 1 <= m["tokens_per_pass"] <= cfg.eval_k + 1


def test_the_default_horizon_covers_the_next_chunk_and_a_horizon_is_bounded(tmp_path):
    # 64 joints at 100 Hz gave H = 1: each chunk ended as the next was decoded, and every other tick held
    assert default_horizon(0.02, 64) == 2
    assert default_horizon(0.02, 6) == 8 and default_horizon(1 / 30, 19) == 4
    with pytest.raises(ValueError, match="horizon must be <= 64"):
        TrainConfig(data=tmp_path, horizon=100, out=tmp_path / "p.json")
