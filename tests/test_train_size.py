"""`edgeinfer train --size {small,large}`: small is the shipped schunk_target's shape, large has at least 3 M
parameters; a large policy trains by the same command, and the shipped one (engines/weights/schunk_large_target)
loads with its sha256 and was fitted on the default policy's data and split."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.cli import main as edgeinfer_cli
from edgeinfer.engines.models.model import POLICY_SIZES, ActionTransformer, PolicyConfig
from edgeinfer.engines.models.paths import DEFAULT_POLICY, LARGE_POLICY
from edgeinfer.engines.models.policy import load_policy
from edgeinfer.engines.training.train import TrainConfig


def _parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def test_small_is_the_shipped_shape_and_large_has_3m_parameters():
    shipped = json.loads(DEFAULT_POLICY.read_text())["config"]
    assert {k: shipped[k] for k in POLICY_SIZES["small"]} == POLICY_SIZES["small"]
    assert TrainConfig().size == "small"  # the default trains the shipped shape
    small = ActionTransformer(PolicyConfig(**{**shipped, **POLICY_SIZES["small"]}))
    large = ActionTransformer(PolicyConfig(**{**shipped, **POLICY_SIZES["large"]}))
    assert _parameters(small) == 112_704
    assert _parameters(large) == 3_209_792 >= 3_000_000


def test_size_option_in_help_and_refused_when_unknown(capsys):
    with pytest.raises(SystemExit):
        edgeinfer_cli(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--size {small,large}" in text and "0.11 M parameters" in text and "3.2 M parameters" in text
    with pytest.raises(SystemExit):
        edgeinfer_cli(["train", "--size", "huge", "--steps", "1"])
    assert "invalid choice: 'huge'" in capsys.readouterr().err


def test_two_step_large_training_by_the_command(tmp_path):
    """`edgeinfer train --size large` on a tiny 2-joint CSV folder: the manifest records the size and the
    weights have the large shape."""
    folder = tmp_path / "logs"
    folder.mkdir()
    t = np.arange(60) / 100.0
    for i in (1, 2):  # run2 is held out (the last file)
        q = np.column_stack([t, 0.3 * np.sin(2 * t + i), 0.2 * np.cos(3 * t)])
        np.savetxt(folder / f"run{i}.csv", q, delimiter=",", header="t,q0,q1", comments="")
    out = tmp_path / "large" / "p.json"
    argv = ["train", "--data", str(folder), "--derive", "qd", "--size", "large", "--steps", "2",
            "--batch-size", "4", "--out", str(out)]
    assert edgeinfer_cli(argv) == 0
    manifest = json.loads(out.read_text())
    assert manifest["train"]["size"] == "large" and manifest["train"]["steps"] == 2
    assert {k: manifest["config"][k] for k in POLICY_SIZES["large"]} == POLICY_SIZES["large"]
    policy = load_policy(out)  # sha256 checked
    assert _parameters(policy.model) > 3_000_000  # fewer joints and positions than the Schunk chunk: still > 3 M
    assert manifest["metrics_held_out"]["windows"] == manifest["data"]["split"]["held_out_windows"] > 0


def test_shipped_large_policy_loads_on_the_default_data_and_split():
    if not LARGE_POLICY.exists():
        pytest.skip(f"{LARGE_POLICY} not trained yet")
    large, default = json.loads(LARGE_POLICY.read_text()), json.loads(DEFAULT_POLICY.read_text())
    assert large["weights"] == "schunk_large_target.pt"
    policy = load_policy(LARGE_POLICY)  # raises when the .pt's sha256 does not match the manifest
    assert _parameters(policy.model) == 3_209_792 and large["train"]["size"] == "large"
    split, shipped = large["data"]["split"], default["split"]  # the default's manifest predates "data"
    number = lambda units: [int(u.removeprefix("measurement_")) for u in units]  # noqa: E731
    assert (number(split["train"]), number(split["held_out"])) == (shipped["train"], shipped["held_out"])
    windows = ("train_windows", "held_out_windows")
    assert [split[k] for k in windows] == [shipped[k] for k in windows]
    assert large["config"] == {**default["config"], **POLICY_SIZES["large"]}
    for key in ("lo_rad", "hi_rad"):  # the same tokenizer, fitted on the same training windows
        np.testing.assert_allclose(large["tokenizer"][key], default["tokenizer"][key], rtol=1e-12)
    metrics = large["metrics_held_out"]
    assert metrics["windows"] == default["metrics_held_out"]["windows"]
    assert metrics["action_rmse_rad"] < metrics["baseline_const_velocity_rmse_rad"]


def test_large_policy_path_is_in_the_package():
    assert LARGE_POLICY.parent == DEFAULT_POLICY.parent and Path(LARGE_POLICY).suffix == ".json"
