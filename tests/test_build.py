"""`edgeinfer build`: the quality gate against the fp32 target on held-out real runs, through the CLI."""
import json
import os
import subprocess
import sys

import pytest
from rich.console import Console

from edgeinfer.engines.backends.build import BuildConfig, build

pytestmark = pytest.mark.background  # CPU-bound, no real-time bound (tests/conftest.py)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "edgeinfer", "build", *args], capture_output=True, text=True,
                          timeout=300)


def test_bf16_passes_the_default_gate_and_fails_a_strict_one(schunk_dir, tmp_path):
    out = tmp_path / "build.json"
    proc = _cli("--backend", "torch", "--precision", "bf16", "--data-dir", str(schunk_dir), "--n-obs", "32",
                "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(out.read_text())
    q = summary["quality"]
    assert summary["passed"] and q["observations"] == 32
    # bf16 flips some tokens (measured 0.91-0.93 agreement) but the actions stay within 10 % of fp32's error
    assert 0.8 <= q["token_agreement"] < 1.0 and q["max_abs_logit_diff"] > 1e-3
    assert q["action_rmse_rad"] <= summary["gate"]["max_action_rmse_rad"]
    strict = _cli("--backend", "torch", "--precision", "bf16", "--data-dir", str(schunk_dir), "--n-obs", "32",
                  "--min-token-agreement", "1.0")
    assert strict.returncode == 1 and "FAIL" in strict.stdout


def test_fp32_torch_engine_is_the_reference(schunk_dir):
    s = build(BuildConfig(backend="torch", data_dir=schunk_dir, n_obs=16), Console(quiet=True))
    assert s["passed"] and s["quality"]["token_agreement"] == 1.0
    assert s["quality"]["action_rmse_rad"] == pytest.approx(s["quality"]["ref_action_rmse_rad"])


def test_missing_recordings_are_named(tmp_path):
    proc = _cli("--backend", "torch", "--data-dir", str(tmp_path / "nowhere"))
    assert proc.returncode == 2 and "nowhere" in proc.stderr and "Traceback" not in proc.stderr


def test_onnxruntime_build_uses_the_engine_cache_and_rebuilds_a_corrupt_plan(schunk_dir, tmp_path):
    env_args = ("--backend", "onnxruntime", "--data-dir", str(schunk_dir), "--n-obs", "8")
    env = {**os.environ, "EDGEINFER_CACHE_DIR": str(tmp_path / "cache")}
    runs = []
    for i in range(3):
        out = tmp_path / f"build{i}.json"
        proc = subprocess.run([sys.executable, "-m", "edgeinfer", "build", *env_args, "--json", str(out)],
                              capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        runs.append((proc, json.loads(out.read_text())))
        if i == 1:  # corrupt the cached plan between the second and third build
            plan = runs[-1][1]["plan"]["path"]
            data = bytearray(open(plan, "rb").read())
            data[len(data) // 2] ^= 0xFF
            open(plan, "wb").write(bytes(data))
    (_, first), (_, second), (third_proc, third) = runs
    assert not first["plan"]["cached"] and second["plan"]["cached"] and not third["plan"]["cached"]
    assert "sha256 mismatch (corrupt); rebuilding" in third_proc.stdout + third_proc.stderr
    assert first["plan"]["sha256"] == second["plan"]["sha256"]
    for _, s in runs:  # 100 % greedy agreement with the fp32 torch target, logits within 1e-4
        assert s["passed"] and s["quality"]["token_agreement"] == 1.0 and s["quality"]["max_abs_logit_diff"] < 1e-4
