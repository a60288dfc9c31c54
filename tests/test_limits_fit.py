"""Limits fitted on one episode clamp the next out loud: a replay whose log leaves the limits in
use names those joints and counts the commands the limit gate clamped, in report.json's "safety" and on the
console."""
from __future__ import annotations

import json

import numpy as np
import pytest
from rich.console import Console

from edgeinfer.sim.report import print_table
from edgeinfer.sim.supervisor import limits_fit_report

D = 6


def test_the_joints_the_log_leaves_and_the_clamps_are_named():
    q = np.zeros((50, 3))
    q[:, 1] = np.linspace(-0.5, 0.5, 50)  # leaves [-0.2, 0.2] on both sides
    q[10, 2] = 2.0
    sources = {"q_min_rad": "manifest p.json", "q_max_rad": "manifest p.json", "qd_max_rad_s": "given"}
    out = limits_fit_report(q, ["a", "b", "c"], [-0.2, -0.2, -1.0], [0.2, 0.2, 1.0], sources,
                            {"clamped_position": 7, "clamped_velocity": 0})
    assert [o["joint"] for o in out["joints_outside_limits"]] == ["b", "c"]
    assert out["joints_outside_limits"][0] == {"joint": "b", "recorded_rad": [-0.5, 0.5], "limits_rad": [-0.2, 0.2]}
    assert (out["clamped_position"], out["clamped_velocity"]) == (7, 0)
    assert out["warnings"] == [
        "the log's recorded positions leave the position limits (manifest p.json) on 2 of 3 joints: b, c",
        "the limit gate clamped 7 commands to the position limits (manifest p.json) and 0 to the velocity limit "
        "(given): the action error includes them"]
    inside = limits_fit_report(q, None, [-3.0] * 3, [3.0] * 3, sources, {"clamped_position": 0})
    assert inside["joints_outside_limits"] == [] and inside["warnings"] == []
    assert limits_fit_report(q, None, [-3.0] * 3, [3.0] * 3, sources, None)["clamped_position"] is None


def _tiny_policy(path, limits: dict):
    """An untrained 6-joint policy whose manifest carries fitted `limits` (what `edgeinfer train` writes)."""
    import torch

    from edgeinfer.engines.models.model import ActionTransformer, PolicyConfig
    from edgeinfer.engines.models.policy import Policy
    from edgeinfer.engines.models.tokenizer import ActionTokenizer

    torch.manual_seed(0)
    cfg = PolicyConfig(obs_dim=3 * D, n_joints=D, horizon=2, stride_ticks=5, n_bins=8, d_model=16, n_layers=1,
                       n_heads=2)
    policy = Policy(ActionTransformer(cfg).eval(), ActionTokenizer(np.full(D, -0.01), np.full(D, 0.01), 8),
                    np.zeros(3 * D), np.ones(3 * D), manifest={})
    policy.save(path, {"control_rate_hz": 250.0, "limits": limits})
    return path


@pytest.mark.slow
def test_a_replay_beyond_the_manifests_fitted_limits_says_so(tmp_path):
    from edgeinfer.logs.arm_log import synthetic_log, write_schunk
    from edgeinfer.sim.replay import replay
    from edgeinfer.sim.run_config import ReplayConfig

    log = synthetic_log(seconds=2.0)
    write_schunk(log, tmp_path / "log")
    lo, hi = log.q_rad.min(0), log.q_rad.max(0)
    narrow = hi.copy()
    narrow[[1, 4]] = lo[[1, 4]] + 0.5 * (hi - lo)[[1, 4]]  # fitted on another episode: half of joints 1 and 4
    limits = {"q_min_rad": (lo - 0.01).tolist(), "q_max_rad": np.where(narrow < hi, narrow, hi + 0.01).tolist(),
              "qd_max_rad_s": [2.0] * D, "source": "fitted", "margin": "test"}
    cfg = ReplayConfig(log=tmp_path / "log", out=tmp_path / "out", fork_nodes=True)
    cfg.runtime.policy = _tiny_policy(tmp_path / "p.json", limits)
    console = Console(record=True, width=250, force_terminal=False)
    report = replay(cfg, console)
    safety = json.loads((tmp_path / "out" / "report.json").read_text())["safety"]
    assert safety["outside_position_limits"] == 0  # the gate held: the old report said only this
    assert [o["joint"] for o in safety["joints_outside_limits"]] == ["joint 1", "joint 4"]
    assert safety["position_limits_source"] == f"manifest {tmp_path / 'p.json'}"
    counters = report["node_stats"]["control"]["counters"]
    assert safety["clamped_position"] == counters["clamped_position"] > 50  # the log is past them half the time
    text = console.export_text()
    assert f"safety: the log's recorded positions leave the position limits (manifest {tmp_path / 'p.json'}) on 2 " \
           "of 6 joints: joint 1, joint 4" in text
    assert f"safety: the limit gate clamped {safety['clamped_position']} commands" in text


def test_the_table_shows_the_clamps_and_prints_each_warning():
    report = {"safety": {"outside_position_limits": 0, "clamped_position": 12, "clamped_velocity": 3,
                         "joints_outside_limits": [{"joint": "elbow"}], "warnings": ["w1", "w2"]}}
    console = Console(record=True, width=200, force_terminal=False)
    print_table([report], console)
    text = console.export_text()
    assert "12 / 3" in text and "elbow" in text
    assert "safety: w1\nsafety: w2" in text
