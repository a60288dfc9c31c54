"""`edgeinfer sweep`: the plan a sweep file makes, and a real sweep of short replays of real Schunk recordings as
tasks on local Ray (each one `edgeinfer replay` with its own runtime and control processes)."""
import csv
import json

import pytest
from rich.console import Console

from edgeinfer.sim.sweep import SweepConfig, plan, sweep


def _sweep_file(tmp_path, logs, configs: str, base: str = "") -> object:
    path = tmp_path / "sweep.toml"
    path.write_text(f"[sweep]\nlogs = {json.dumps([str(p) for p in logs])}\nout = \"out\"\n"
                    f"[base]\nduration_s = 1.0\n{base}\n{configs}")
    return path


def test_plan_crosses_logs_configs_and_grid(tmp_path):
    for name in ("run_a", "run_b"):
        (tmp_path / name).mkdir()
    path = tmp_path / "sweep.toml"
    path.write_text('[sweep]\nlogs = ["run_*"]\n[base]\nslo = "p99<=5ms"\n'
                    '[configs.spec]\nruntime.decode = "speculative"\n'
                    '[configs.bad]\ntime_scale = 100.0\n'
                    '[grid]\n"runtime.scheduler.budget_ms" = [10.0, 20.0]\n')
    runs, out = plan(path)
    assert out == tmp_path / "out" / "sweep"
    assert [r.name for r in runs] == [f"{log}/{c},budget_ms={b}" for log in ("run_a", "run_b")
                                      for c in ("spec", "bad") for b in (10.0, 20.0)]
    good = [r for r in runs if r.error is None]
    assert len(good) == 4 and all("--slo" in r.argv and "--decode" in r.argv for r in good)
    assert good[1].argv[good[1].argv.index("--budget-ms") + 1] == "20.0"
    assert good[0].argv[good[0].argv.index("--log") + 1] == str(tmp_path / "run_a")
    bad = [r for r in runs if r.error is not None]
    assert len(bad) == 4 and all("time_scale" in r.error and "configs.bad" in r.error for r in bad)
    path.write_text('[sweep]\nlogs = ["nothing_*"]\n')
    with pytest.raises(ValueError, match="nothing_"):
        plan(path)
    path.write_text('[sweep]\nlogs = ["run_a"]\n[bogus]\n')
    with pytest.raises(ValueError, match="bogus"):
        plan(path)


@pytest.mark.slow
def test_sweep_on_local_ray(schunk_dir, tmp_path):
    ray = pytest.importorskip("ray")
    # one log: crossing logs with configs is the plan's (test above); each real replay here costs seconds
    logs = [schunk_dir / "measurement_1"]
    path = _sweep_file(tmp_path, logs, base='slo = "p99<=20ms,miss<=50%"\n[base.runtime]\nwarmup_chunks = 5\n',
                       configs='[configs.speculative]\nruntime.decode = "speculative"\n'
                               '[configs.target-only]\nruntime.decode = "target-only"\n'
                               '[configs.bad-option]\ntime_scale = 100.0\n'  # rejected at once; no-policy: in its task
                               '[configs.no-policy]\nruntime.policy = "/nonexistent/policy.json"\n')
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        rows = sweep(path, SweepConfig(num_cpus_per_task=2), Console(quiet=True))
    finally:
        ray.shutdown()
    assert [r["run"] for r in rows] == [f"{log.name}/{c}" for log in logs
                                        for c in ("speculative", "target-only", "bad-option", "no-policy")]
    ok = [r for r in rows if r["status"] == "ok"]
    assert [r["config"] for r in ok] == ["speculative", "target-only"]
    for r in ok:
        rep = r["report"]
        assert rep["log"] == r["log"].rsplit("/", 1)[-1] and rep["observations_sent"] == 250  # 1 s at 250 Hz
        assert rep.get("decode_requested", rep["decode"]) == r["config"]  # "decode" says what ran
        assert sum(rep["outcomes"].values()) == rep["observations_sent"] == r["observations"]
        assert r["latency_p50_ms"] == rep["latency_ms"]["p50"] and r["latency_p99_ms"] == rep["latency_ms"]["p99"]
        assert r["miss_rate"] == rep["miss_rate"] and r["miss_rate_upper95"] == rep["miss_rate_ci95"][1]
        assert r["verdict"] in ("VALID", "INVALID") and r["error"] is None
        assert (tmp_path / "out" / r["run"].replace("/", "__") / "report.json").exists()
    failed = [r for r in rows if r["status"] == "failed"]
    assert len(failed) == 2 and all(r["report"] is None for r in failed)
    for r in failed:
        assert ("time_scale" in r["error"]) if r["config"] == "bad-option" else (
            "exit code 2" in r["error"] and "nonexistent" in r["error"])
    on_disk = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert on_disk["schema"] == "edgeinfer.sweep/1" and len(on_disk["runs"]) == 4
    table = list(csv.DictReader((tmp_path / "out" / "sweep.csv").open()))
    assert [t["status"] for t in table] == [r["status"] for r in rows]
    assert float(table[0]["latency_p50_ci95_lo"]) <= float(table[0]["latency_p50_ms"])
