"""`edgeinfer compare`: degraded figures are flagged, unchanged ones are not; the CLI's exit codes and JSON."""
import json
import subprocess
import sys

import pytest
from synthetic_runs import report

from edgeinfer.cli import main as edgeinfer_cli
from edgeinfer.sim.compare import (
    BETTER,
    CHANGED,
    NOT_JUDGED,
    SAME,
    WORSE,
    ReportError,
    compare,
    load_report,
    regressions,
)
from edgeinfer.sim.report import write_report


@pytest.fixture(scope="module")
def clean():
    return report("clean", seed=0)[0]


def _verdicts(rows):
    return {r["figure"]: r["verdict"] for r in rows}


def test_two_clean_runs_differ_in_nothing(clean):
    rows = compare(clean, report("clean again", seed=1)[0])
    assert {v for v in _verdicts(rows).values()} <= {SAME, NOT_JUDGED}
    by = _verdicts(rows)
    assert by["latency p50"] == by["latency p99"] == by["miss rate"] == by["action RMSE"] == SAME
    assert by["latency p999"] == NOT_JUDGED  # 1,500 ticks cannot bound a p99.9


@pytest.mark.parametrize("fault, worse", [
    # 1 % of commands dropped: lost ticks (misses) and fewer ticks served by a full chunk, latency unchanged
    (dict(drop_rate=0.01), {"miss rate", "ticks lost", "ticks served by full"}),
    # a 20 ms stall: 5 late ticks far above the clean run's maximum; percentiles unchanged
    (dict(stall_ms=20.0), {"latency max", "miss rate", "ticks late"}),
    # the runtime killed at tick 700: the control loop holds for the rest of the run
    (dict(kill_at_tick=700), {"miss rate", "ticks hold", "ticks served by full", "ticks served by hold"}),
])
def test_degraded_figures_are_flagged_and_only_those(clean, fault, worse):
    degraded = report("degraded", seed=1, **fault)[0]
    rows = compare(clean, degraded)
    assert set(regressions(rows)) == worse
    assert BETTER not in _verdicts(rows).values()
    # the other way round the same figures are better, nothing is worse
    back = _verdicts(compare(degraded, clean))
    assert {f for f, v in back.items() if v == BETTER} == worse and WORSE not in back.values()


def test_rows_carry_values_and_ratios(clean):
    killed = report("killed", seed=1, kill_at_tick=700)[0]
    row = next(r for r in compare(clean, killed) if r["figure"] == "ticks served by full")
    assert (row["a"], row["b"]) == (1500, 700) and row["ratio"] == pytest.approx(700 / 1500)
    assert row["test"].startswith("Fisher p=")
    miss = next(r for r in compare(clean, killed) if r["figure"] == "miss rate")
    assert miss["a"] == 0.0 and miss["ratio"] is None  # no ratio to a zero baseline


def test_version_1_reports_are_read_but_not_judged_by_intervals(clean):
    old = {k: v for k, v in clean.items() if k not in ("schema_version", "latency_ci95_ms", "latency_histogram_us")}
    by = _verdicts(compare(old, clean))
    assert by["latency p50"] == by["latency max"] == NOT_JUDGED and by["miss rate"] == SAME


def test_cli_compare_exit_codes_json_and_errors(clean, tmp_path, capsys):
    # the command line through edgeinfer.cli.main in this process (a fresh interpreter per call costs seconds of
    # imports; test_real_replays_clean_vs_runtime_killed runs `python -m edgeinfer compare` itself)
    def cli(*argv):
        capsys.readouterr()
        code = edgeinfer_cli(["compare", *map(str, argv)])
        return code, capsys.readouterr()

    a = write_report(clean, tmp_path / "a")
    b = write_report(report("killed", seed=1, kill_at_tick=700)[0], tmp_path / "b")
    code, out = cli(a, b, "--json", tmp_path / "cmp.json")
    assert code == 0, out.err
    assert "ticks hold" in out.out and "worse" in out.out
    doc = json.loads((tmp_path / "cmp.json").read_text())
    assert doc["schema"] == "edgeinfer.compare/1" and "ticks hold" in doc["regressions"]
    assert {r["figure"] for r in doc["rows"]} >= {"latency p99", "miss rate", "action RMSE"}
    assert cli(a, b, "--fail-on-regression")[0] == 1
    assert cli(a, a, "--fail-on-regression")[0] == 0
    (tmp_path / "bad.json").write_text("{not json")
    code, out = cli(a, tmp_path / "bad.json")
    assert code == 2 and "bad.json: not JSON" in out.err


def test_load_report_refuses_other_files(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"schema": "something/1"}))
    with pytest.raises(ReportError, match="x.json: not an edgeinfer replay report"):
        load_report(tmp_path / "x.json")
    (tmp_path / "v9.json").write_text(json.dumps({"schema": "edgeinfer.replay/1", "schema_version": 9}))
    with pytest.raises(ReportError, match="schema_version 9"):
        load_report(tmp_path / "v9.json")
    with pytest.raises(ReportError, match="no such file"):
        load_report(tmp_path / "missing.json")


def test_middle_rungs_have_no_direction():
    a = {"observations_sent": 1000, "fallbacks": {"full": 900, "draft": 100, "hold": 0}}
    b = {"observations_sent": 1000, "fallbacks": {"full": 700, "draft": 290, "hold": 10}}
    by = _verdicts(compare(a, b))
    assert by["ticks served by full"] == WORSE and by["ticks served by hold"] == WORSE
    assert by["ticks served by draft"] == CHANGED  # more drafts instead of full chunks: neither better nor worse
    assert set(regressions(compare(a, b))) == {"ticks served by full", "ticks served by hold"}


@pytest.mark.slow
def test_real_replays_clean_vs_runtime_killed(schunk_dir, tmp_path):
    """Two real replays (processes + sockets) of the first 2 s of measurement_1: the run whose runtime is
    killed halfway is flagged for holds and misses. Nothing else is asserted: on a shared machine the load,
    and so the latency, really does change between two runs."""
    from edgeinfer.logs.arm_log import ArmLog, read_schunk, write_schunk

    log = read_schunk(schunk_dir / "measurement_1")
    write_schunk(ArmLog("m1_2s", log.t_s[:500], log.q_rad[:500], log.qd_rad_s[:500]), tmp_path / "m1_2s")
    reports, stdout = {}, {}
    for name, extra in (("clean", ["--slo", "p99<=50ms,miss<=50%"]), ("killed", ["--kill-runtime-at-tick", "250"])):
        proc = subprocess.run([sys.executable, "-m", "edgeinfer", "replay", "--log", str(tmp_path / "m1_2s"),
                               "--out", str(tmp_path / name), *extra], capture_output=True, text=True, timeout=600)
        # 1: the killed runtime's exit code; 3: the clean run's SLO judged INVALID (a loaded host loses ticks)
        assert proc.returncode in ((0, 3) if name == "clean" else (0, 1)), proc.stdout + proc.stderr
        reports[name], stdout[name] = tmp_path / name / "report.json", proc.stdout
        for png in ("latency_histogram.png", "latency.png", "stages.png"):
            assert (tmp_path / name / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    clean = load_report(reports["clean"])
    assert clean["schema_version"] == 2 and clean["slo"]["objective"] == "p99<=50ms,miss<=50%"
    assert [t["metric"] for t in clean["slo"]["terms"]] == ["p99", "miss"] and "slo p99<=50ms" in stdout["clean"]
    proc = subprocess.run([sys.executable, "-m", "edgeinfer", "compare", str(reports["clean"]), str(reports["killed"]),
                           "--fail-on-regression", "--json", str(tmp_path / "cmp.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    worse = set(json.loads((tmp_path / "cmp.json").read_text())["regressions"])
    assert {"ticks hold", "ticks served by hold"} <= worse
    # the miss rate, overall or in the killed runtime's gap (on a host that stalls, the clean run can miss
    # enough that only the gap's rate stands out)
    assert any(name.startswith("miss rate") for name in worse), worse
