"""A replay of a log from the robot a policy was trained on needs no option but --policy and --log: the log is
read with the manifest's reader options, the training dataset's first held-out episode is replayed, and the
joint limits come from the manifest's fitted "limits" (sim/preflight.py, control/limits.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.sim.preflight import log_defaults, policy_shape
from edgeinfer.sim.run_config import ReplayConfig

REACHY = Path(__file__).resolve().parents[2] / "shared" / "data" / "reachy2_lerobot_v30"
needs_reachy = pytest.mark.skipif(not (REACHY / "meta" / "info.json").is_file(),
                                  reason="../shared/data/reachy2_lerobot_v30 not present")
D = 19  # Reachy 2's observation.state


def data_entry(source: Path, **changes) -> dict:
    """A manifest's "data", as `edgeinfer train --data DATASET --held-out 2` writes it
    (engines/training/fit_data.py)."""
    return {"source": str(source), "format": "lerobot", "reader_options": {"q_field": "observation.state"},
            "joint_names": None, "rate_hz": 30.0, "qd_from_differences": True, "q_from_integration": False,
            "split": {"by": "episode", "rule": "held_out = given (--held-out 2)", "held_out_option": "2",
                      "train": [0, 1], "held_out": [2]}} | changes


def fitted_limits() -> dict:
    return {"q_min_rad": [-3.0] * D, "q_max_rad": [3.0] * D, "qd_max_rad_s": [5.0] * D, "source": "fitted",
            "margin": "10% of the range"}


def write_policy(path: Path, data: dict | None, limits: dict | None = None) -> Path:
    """A tiny untrained 19-joint policy (weights and manifest, engines/models/policy.py) with `data` and `limits`."""
    import torch

    from edgeinfer.engines.models.model import ActionTransformer, PolicyConfig
    from edgeinfer.engines.models.policy import Policy
    from edgeinfer.engines.models.tokenizer import ActionTokenizer

    torch.manual_seed(0)
    cfg = PolicyConfig(obs_dim=3 * D, n_joints=D, horizon=2, stride_ticks=1, n_bins=8, d_model=16, n_layers=1,
                       n_heads=2)
    policy = Policy(ActionTransformer(cfg).eval(), ActionTokenizer(np.full(D, -0.01), np.full(D, 0.01), 8),
                    np.zeros(3 * D), np.ones(3 * D), manifest={})
    extra = {"control_rate_hz": 30.0} | ({"data": data} if data is not None else {}) | \
        ({"limits": limits} if limits is not None else {})
    policy.save(path, extra)
    return path


def manifest_only(tmp_path: Path, manifest: dict) -> Path:
    """A manifest JSON alone (what log_defaults and policy_shape read; no weights loaded)."""
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"config": {"n_joints": D, "stride_ticks": 1, "horizon": 2}} | manifest))
    return path


@needs_reachy
def test_the_training_dataset_replays_its_first_held_out_episode_with_the_training_reader_options(tmp_path):
    policy = manifest_only(tmp_path, {"data": data_entry(REACHY)})

    def defaults(**kw):
        cfg = ReplayConfig(log=kw.pop("log", REACHY), **kw)
        cfg.runtime.policy = policy
        return log_defaults(cfg)

    options, section = defaults()
    assert options == {"q_field": "observation.state", "episode": 2}
    assert section["taken"] == options and section["manifest"] == str(policy)
    assert section["episode_why"] == "the log is the policy's training dataset: its first held-out episode"
    # options given win, key by key: --episode picks another, the manifest's q_field still applies
    options, section = defaults(episode=0)
    assert options == {"q_field": "observation.state", "episode": 0} and section["episode_why"] is None
    # the same path spelled differently is the same dataset
    options, _ = defaults(log=REACHY / "meta" / "..")
    assert options["episode"] == 2


@needs_reachy
def test_another_dataset_or_format_takes_only_what_fits(tmp_path):
    other = manifest_only(tmp_path, {"data": data_entry(tmp_path / "elsewhere")})
    cfg = ReplayConfig(log=REACHY)
    cfg.runtime.policy = other
    assert log_defaults(cfg)[0] == {"q_field": "observation.state"}  # same format, not the training dataset
    csv = tmp_path / "arm.csv"
    csv.write_text("t,q0\n0,0\n")
    cfg = ReplayConfig(log=csv, rate_hz=10.0)
    cfg.runtime.policy = other
    options, section = log_defaults(cfg)
    assert options == {"rate_hz": 10.0} and section["taken"] == {}
    assert section["not_taken"] == "the log is csv, the policy was trained on lerobot"
    # a manifest without "data" (the shipped Schunk policy), or no log: nothing from the manifest
    assert log_defaults(ReplayConfig(log=REACHY, episode=1)) == ({"episode": 1}, None)
    cfg = ReplayConfig()
    cfg.runtime.policy = other
    assert log_defaults(cfg) == ({}, None)


def test_policy_shape_carries_the_manifests_names_limits_and_rate(tmp_path):
    from edgeinfer.logs.arm_log import synthetic_log

    cfg = ReplayConfig()
    cfg.runtime.policy = manifest_only(tmp_path, {"data": data_entry(REACHY, joint_names=[f"j{i}" for i in range(D)],
                                                                     rate_hz=29.5), "limits": fitted_limits()})
    shape = policy_shape(cfg.runtime, synthetic_log(seconds=0.1))
    assert shape["joint_names"][3] == "j3" and shape["limits"]["q_max_rad"] == [3.0] * D
    assert shape["manifest"] == str(cfg.runtime.policy) and shape["control_rate_hz"] == 29.5  # data.rate_hz
    assert policy_shape(ReplayConfig().runtime, synthetic_log(seconds=0.1))["limits"] is None  # the shipped one


@needs_reachy
@pytest.mark.slow
def test_replay_needs_only_the_policy_and_the_log(tmp_path):
    policy = write_policy(tmp_path / "reachy.json", data_entry(REACHY), fitted_limits())
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "edgeinfer", "replay", "--policy", str(policy), "--log", str(REACHY),
                          "--duration-s", "2", "--out", str(out), "--plots", "false"],
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "first held-out episode" in " ".join(run.stdout.split())  # said on the console
    report = json.loads((out / "report.json").read_text())
    assert report["policy_defaults"]["taken"] == {"q_field": "observation.state", "episode": 2}
    assert "episode2" in json.dumps(report)  # the log replayed is episode 2's
    limits = report["limits"]
    assert set(limits["sources"].values()) == {f"manifest {policy}"}
    assert limits["q_max_rad"] == [3.0] * D and limits["qd_max_rad_s"] == [5.0] * D
    assert 50 <= report["observations_sent"] <= 61  # 2 s at 30 Hz
    safety = report["safety"]
    assert safety["commands_checked"] > 0 and safety["nonfinite"] == 0 and safety["outside_position_limits"] == 0
