"""`edgeinfer bench spec`: a seconds-long run on held-out real runs; structure and consistency, never timings.
One run, through the command line, serves every test: its JSON holds the rows bench_spec returned."""
import contextlib
import io
import json
import re

import pytest

from edgeinfer.cli import main as edgeinfer_cli


@pytest.fixture(scope="module")
def cli_run(schunk_dir, tmp_path_factory):
    """`edgeinfer bench spec ...` through the console script's entry, in this process (no fresh interpreter):
    (exit code, stdout, the rows of its --json)."""
    out = tmp_path_factory.mktemp("spec") / "spec.json"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = edgeinfer_cli(["bench", "spec", "--data-dir", str(schunk_dir), "--per-run", "1", "--drafters",
                              "kinematic", "--ks", "1,4", "--repeats", "2", "--no-peer", "--json", str(out)])
    return code, stdout.getvalue(), json.loads(out.read_text())


def test_rows_are_complete_and_consistent(cli_run):
    rows = {r["name"]: r for r in cli_run[2]}
    base = rows["target-only"]
    assert base["target_passes_per_chunk"] == 48 and base["speedup"] == 1.0 and base["exact"]
    assert base["acceptance_rate"] is None and base["chunks"] == 20  # one chunk from each held-out run
    same = base["same_work_per_run"]  # target-only decoded twice: the noise floor of the per-run figures
    assert len(same) == 20 and all(v > 0 for v in same.values())
    fixed = next(r for r in rows.values() if r["name"].startswith("kinematic k="))
    assert fixed["k"] in (1, 4) and fixed["exact"] and 0 < fixed["acceptance_rate"] < 1
    assert fixed["target_passes_per_chunk"] < 48
    assert fixed["action_rmse_rad"] == base["action_rmse_rad"]  # exact: the very same actions
    adaptive = rows["kinematic adaptive"]
    assert adaptive["exact"] and len(adaptive["per_run_vs_target_only"]) == 20 and adaptive["vs_best_fixed"] > 0
    passes = adaptive["per_run_target_passes_per_chunk"]  # one chunk per run: that chunk's passes
    assert len(passes) == 20 and all(1 <= p <= 48 for p in passes.values())
    relaxed = next(r for r in rows.values() if "relaxed" in r["name"])
    assert not relaxed["exact"] and relaxed["exact_by"] == "lossy"
    sampled = next(r for r in rows.values() if "sampling" in r["name"])
    assert sampled["exact"] and "chi-square" in sampled["exact_by"]
    for r in rows.values():
        assert r["tokens_per_s"] > 0 and r["action_rmse_rad"] > 0


def test_stress_rows_only_probe_a_drafter_that_loses_for_a_few_passes(cli_run):
    rows = {r["name"].split(" (")[0]: r for r in cli_run[2] if r["name"].endswith(") adaptive")}
    assert set(rows) == {"slow", "useless", "collapsing"}
    for r in rows.values():
        assert r["exact"] and r["chunks"] == 20 and r["vs_best_fixed"] is None and r["probes"] >= 0
    for name in ("slow", "useless"):  # never ahead: only probes draft, 4 passes of at most k_max = 4 drafts each
        assert rows[name]["drafted_per_chunk"] * 20 <= rows[name]["probes"] * 4 * 4
    assert "worst adaptive row" in cli_run[1] and "after the collapse" in cli_run[1]


def test_cli_writes_one_entry_per_row(cli_run):
    code, stdout, rows = cli_run
    assert code == 0
    assert isinstance(rows, list) and len(rows) >= 5
    for r in rows:
        assert {"name", "tokens_per_s", "target_passes_per_chunk", "acceptance_rate", "exact"} <= set(r)
    assert any(r["name"] in ("kinematic k=1", "kinematic k=4") for r in rows)  # the --ks asked for
    assert not any(r["name"].startswith("kinematic k=") and r["k"] not in (1, 4) for r in rows)
    assert "target-only" in stdout


def test_cli_rejects_bad_ks(capsys):
    with pytest.raises(SystemExit) as e:
        edgeinfer_cli(["bench", "spec", "--ks", "1,x"])
    assert e.value.code == 2 and "--ks must be comma separated integers" in capsys.readouterr().err


def test_rows_describe_the_reference_and_the_engine_the_product_runs(cli_run):
    """Every row set twice: on torch (the reference) and on packed (what backend auto runs on a CPU), with the same
    tokens: both are exact against their own target-only decoding."""
    by_backend = {}
    for r in cli_run[2]:
        by_backend.setdefault(r["backend"], {})[r["name"]] = r
    assert set(by_backend) == {"torch", "packed"}
    kinds = {b: {re.sub(r" k=\d+", "", n): r["exact"] for n, r in rows.items()} for b, rows in by_backend.items()}
    assert kinds["torch"] == kinds["packed"]  # the same rows (each backend's fixed k is its own best), as exact
