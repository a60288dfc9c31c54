"""`edgeinfer bench`: a short run of every ruler on a real held-out Schunk log (benchmarks/quick.toml), checked
for structure and internal consistency: counts add up, percentiles ordered, quality present, ratios what
they claim. Timings are never asserted (the machine is shared and noisy)."""
import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from edgeinfer.bench.e2e import REPLAY_TIME_SCALE, scenario_log
from edgeinfer.bench.figures import TAIL_KEYS, compare
from edgeinfer.bench.scenarios import ReplayScenario, load_scenarios
from edgeinfer.bench.suite import BenchConfig, run_bench
from edgeinfer.bench.suite_report import markdown
from edgeinfer.cli import main as edgeinfer_cli
from edgeinfer.logs.arm_log import synthetic_log
from edgeinfer.sim.schedule import tick_grid

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def result(schunk_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    cfg = BenchConfig(log=[schunk_dir / "measurement_1"], scenarios="quick", json=tmp / "bench.json", out=tmp / "out")
    res = run_bench(cfg, console=Console(quiet=True), command=["edgeinfer", "bench", "--scenarios", "quick"])
    assert json.loads((tmp / "bench.json").read_text()) == json.loads(json.dumps(res))  # the JSON is the result
    return res


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    """`edgeinfer ARGV` run in this process through the console script's entry (edgeinfer.cli.main), without
    a fresh interpreter's seconds of imports: (exit code, stdout, stderr)."""
    capsys.readouterr()
    try:
        code = edgeinfer_cli(list(argv))
    except SystemExit as e:  # argparse: -h, usage errors
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def _fig(result, scenario, ruler, decode, stat):
    return next(f for f in result["figures"] if f["id"] == f"{scenario}/{ruler}/{decode}/{stat}")


def test_records_machine_versions_seeds_and_command(result):
    assert result["schema"] == "edgeinfer.bench.suite/1"
    m = result["machine"]
    assert m["cpu"] and m["cores"] >= 1 and "gpu" in m
    assert m["torch"] == "2.13.0" or m["torch"].startswith("2.13.0+")
    assert m["pyzmq"] and m["libzmq"] and m["numpy"]
    assert result["command"] == ["edgeinfer", "bench", "--scenarios", "quick"]
    assert set(result["source"]) == {"commit", "dirty"}
    assert all(v >= 0 for v in result["load_average_1min"].values())
    assert result["seeds"] == {"observations": 0, "runtime": 0}
    assert result["scenarios"]["repeats"] == 2 and result["scenarios"]["source"].endswith("quick.toml")
    assert result["data"]["logs"] == ["measurement_1"] and result["data"]["source"].startswith("real")
    assert result["floors"]["payload_bytes"] > 0 and result["floors"]["period_ms"] == pytest.approx(4.0, rel=0.01)


def test_every_figure_is_well_formed_and_tails_are_ordered(result):
    ids = [f["id"] for f in result["figures"]]
    assert len(ids) == len(set(ids))
    for f in result["figures"]:
        assert f["better"] in ("lower", "higher") and f["unit"]
        vals = [v for v in f["repeats"] if v is not None]
        if not vals:  # e.g. a replay's action RMSE when every tick was a hold: nothing to compare
            assert f["ruler"] == "action RMSE" and f["value"] is None and f["spread"] is None
            continue
        assert f["spread"] == [min(vals), max(vals)]
        if f["ruler"] != "deadline miss rate":  # the miss rate pools ticks; the rest quote the median
            assert f["value"] == pytest.approx(float(np.median(vals)))
        if f["ci95"] is not None:
            assert f["ci95"][0] <= f["ci95"][1]
    groups = {}
    for f in result["figures"]:
        if f["stat"] in TAIL_KEYS:
            groups.setdefault((f["scenario"], f["ruler"], f["decode"]), {})[f["stat"]] = f
    tails = [g for g in groups.values() if set(g) == set(TAIL_KEYS)]
    assert len(tails) >= 2 + 3  # TTFA of both modes, every floor (plus the replay scenarios)
    for g in tails:
        if g["p50"]["value"] is None:  # no sample at all (every observation lost): every statistic is None
            assert all(g[k]["value"] is None for k in TAIL_KEYS)
            continue
        for r in range(len(g["p50"]["repeats"])):
            per_repeat = [g[k]["repeats"][r] for k in TAIL_KEYS]
            assert per_repeat == sorted(per_repeat)  # p50 <= p95 <= p99 <= p99.9 <= max in every repeat
        medians = [g[k]["value"] for k in TAIL_KEYS]
        assert medians == sorted(medians)  # and so in their medians


def test_in_process_counts_and_quality(result):
    n_obs = load_scenarios("quick").decode.observations
    for mode in ("target-only", "speculative"):
        reps = result["decode"][mode]["repeats"]
        assert len(reps) == 2
        for r in reps:
            assert r["chunks"] == n_obs and r["incomplete"] == 0 and r["tokens"] == n_obs * 48
            assert r["offline_chunks"] == load_scenarios("quick").decode.offline_chunks
        assert _fig(result, "offline", "chunk throughput", mode, "rate")["value"] > 0
        ttfa, chunk = (_fig(result, "in-process", r, mode, "p50")["value"] for r in ("time to first action",
                                                                                    "chunk latency"))
        assert 0 < ttfa <= chunk  # the first step is verified before (or when) the chunk is done
    # greedy speculative decoding is exact: the very same tokens, so the very same actions
    agree = _fig(result, "in-process", "token agreement with target-only", "speculative", "fraction")
    assert agree["value"] == 1.0
    assert all(r["chunks_identical"] == 1.0 for r in result["decode"]["speculative"]["repeats"])
    rmse = {m: _fig(result, "in-process", "action RMSE", m, "rmse")["value"] for m in ("target-only", "speculative")}
    assert rmse["target-only"] == rmse["speculative"] and 0 < rmse["target-only"] < 0.05
    passes = {m: _fig(result, "in-process", "target passes per token", m, "mean")["value"]
              for m in ("target-only", "speculative")}
    assert passes["target-only"] == 1.0 and passes["speculative"] < 1.0


def test_end_to_end_counts_add_up(result):
    assert set(result["e2e"]) == {"steady", "idle_gaps", "overload_2x"}
    for name, scen in result["e2e"].items():
        if name == "overload_2x" and not REPLAY_TIME_SCALE:
            assert "time_scale" in scen["error"] and not any(scen["runs"].values())
            continue
        assert scen["error"] is None, scen["error"]
        for mode, runs in scen["runs"].items():
            assert len(runs) == 1  # quick.toml: one replay per scenario and mode
            for run in runs:
                n = run["observations"]
                assert n > 0 and sum(run["outcomes"].values()) == n  # one outcome per observation
                assert run["deadline_misses"] == n - run["outcomes"]["on_time"]
                assert run["commands_received"] + run["lost"] == n == run["latency_ms"]["n"] + run["lost"]
                assert run["process_exit_codes"] == {"runtime": 0, "control": 0}
            miss = _fig(result, name, "deadline miss rate", mode, "rate")
            assert miss["misses"] == sum(r["deadline_misses"] for r in runs)
            assert miss["observations"] == sum(r["observations"] for r in runs)
            assert miss["value"] == pytest.approx(miss["misses"] / miss["observations"])
            assert miss["ci95"][0] <= miss["value"] <= miss["ci95"][1]
            rmse = _fig(result, name, "action RMSE", mode, "rmse")["value"]
            assert rmse is None or rmse > 0
    steady = result["e2e"]["steady"]["runs"]["speculative"][0]
    idle = result["e2e"]["idle_gaps"]["runs"]["speculative"][0]
    assert steady["observations"] == idle["observations"]  # the same slice, only shifted in time


def test_ratios_are_value_over_target_only_and_over_the_floor(result):
    by_id = {f["id"]: f for f in result["figures"]}
    checked = floors = 0
    for f in result["figures"]:
        if f["decode"] == "speculative":
            base = by_id[f"{f['scenario']}/{f['ruler']}/target-only/{f['stat']}"]
            if base["value"] and f["value"] is not None:
                assert f["vs_target_only"] == pytest.approx(f["value"] / base["value"])
                checked += 1
        if f["decode"] == "target-only" and f["value"]:  # a rate of 0 over 0 (no miss) has no ratio
            assert f["vs_target_only"] == pytest.approx(1.0)
        if f["vs_floor"] is not None:
            ruler = "zmq round trip after idle" if f["scenario"] == "idle_gaps" else "zmq round trip"
            assert f["vs_floor"] == pytest.approx(f["value"] / by_id[f"floor/{ruler}/floor/{f['stat']}"]["value"])
            floors += 1
    assert checked >= 10 and floors >= 10


def test_markdown_and_compare_are_computed_from_the_json(result, tmp_path, capsys):
    md = markdown(result)
    for ruler in ("time to first action", "time per output token", "chunk throughput", "latency",
                  "deadline miss rate", "token agreement with target-only", "zmq round trip", "wake error"):
        assert f"| {ruler} |" in md
    assert "Machine: " in md and result["machine"]["cpu"] in md and "Command: `edgeinfer bench" in md
    rows, verdict = compare(result, result, 0.1)
    assert verdict == "ok" and rows and all(r["verdict"] == "same" and r["ratio"] in (1.0, None) for r in rows)
    slower = copy.deepcopy(result)
    f = next(f for f in slower["figures"] if f["id"] == "in-process/chunk latency/speculative/p50")
    f["value"], f["spread"], f["ci95"] = f["value"] * 3, [v * 3 for v in f["spread"]], None
    orig = next(x for x in result["figures"] if x["id"] == f["id"])
    if orig["ci95"] is None or orig["ci95"][1] < f["spread"][0]:  # disjoint intervals: a regression
        rows, verdict = compare(result, slower, 0.1)
        assert verdict == "regression"
        assert next(r for r in rows if r["id"] == f["id"])["ratio"] == pytest.approx(3.0)
    # the CLI: compare two saved results without running a bench; markdown through the script
    base, new = tmp_path / "base.json", tmp_path / "new.json"
    base.write_text(json.dumps(result))
    new.write_text(json.dumps(result))
    code, out, err = _cli(capsys, "bench", "--compare", str(base), "--current", str(new))
    assert code == 0, err
    assert "verdict: ok" in out
    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- bench-table:cpu -->\nold\n<!-- /bench-table:cpu -->\nrest\n")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "perf_table.py"), str(base), "--readme",
                           str(readme)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = readme.read_text()
    assert "old" not in text and md in text and text.endswith("<!-- /bench-table:cpu -->\nrest\n")


def test_idle_gap_log_stays_on_the_tick_grid():
    log = synthetic_log(seconds=2.0)
    sc = ReplayScenario(name="gaps", seconds=1.0, burst_s=0.2, gap_s=0.3)
    gapped = scenario_log(log, sc)
    ticks = tick_grid(gapped)
    assert len(gapped) == 250 and np.array_equal(gapped.q_rad, log.q_rad[:250])  # the data stay continuous
    jumps = np.diff(ticks)
    assert set(jumps.tolist()) == {1, 1 + 75} and np.sum(jumps > 1) == 4  # 5 bursts, 4 gaps of 75 ticks


def test_bad_scenarios_and_options_are_clear_errors(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[[replay]]\nname = 'x'\nsecondz = 1.0\n")
    with pytest.raises(ValueError, match=r"bad.toml: \[\[replay\]\] #1: unknown keys \['secondz'\]"):
        load_scenarios(str(bad))
    bad.write_text("[[replay]]\nname = 'x'\nburst_s = 1.0\n")
    with pytest.raises(ValueError, match="burst_s and gap_s go together"):
        load_scenarios(str(bad))
    code, _, err = _cli(capsys, "bench", "--scenarios", "nope")
    assert code == 2 and "scenarios file not found" in err and "quick" in err
    code, _, err = _cli(capsys, "bench", "--log", str(tmp_path / "missing"))
    assert code == 2 and "log directory not found" in err
    for suite in ("engines", "spec"):  # the suites keep their own parsers
        code, out, _ = _cli(capsys, "bench", suite, "-h")
        assert code == 0 and f"edgeinfer bench {suite}" in out
