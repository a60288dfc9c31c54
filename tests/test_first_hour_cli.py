"""A new user's first hour on the command line: errors that name the option (and suggest one for a
typo), --help that starts with the options used most, --version, figures whole in 80-column tables, a restart
drill whose table says whether it recovered, and an INVALID SLO that fails the command. Real `edgeinfer`
processes, as a user runs them."""
import os
import re
import socket
import subprocess
import sys

import pytest
from synthetic_runs import report

from edgeinfer.sim.report import write_report


def _edgeinfer(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "edgeinfer", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def _one_error_line(proc) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def test_a_typo_gets_did_you_mean_in_the_commands_usage():
    proc = _edgeinfer("replay", "--budegt-ms", "3")
    line = _one_error_line(proc)
    assert line == "edgeinfer replay: error: unrecognized argument --budegt-ms; did you mean --budget-ms?"
    assert proc.stderr.startswith("usage: edgeinfer replay")
    hil = _edgeinfer("hil", "--endpoint", "tcp://h:5", "--curv-dir", "k")
    assert "did you mean --curve-dir?" in _one_error_line(hil)


def test_bad_paths_name_their_option(tmp_path):
    a_file = tmp_path / "README.md"
    a_file.write_text("not a folder")
    assert _one_error_line(_edgeinfer("replay", "--out", str(a_file))).startswith(
        f"edgeinfer replay: error: --out {a_file}: a file is in the way")
    assert _one_error_line(_edgeinfer("replay", "--out", "/proc/x")).startswith(
        "edgeinfer replay: error: --out /proc/x: ")
    assert _one_error_line(_edgeinfer("replay", "--policy", str(tmp_path / "nope.json"))) == (
        f"edgeinfer replay: error: --policy {tmp_path / 'nope.json'}: no such manifest file, nor a shipped policy's "
        "name (default, large, dct)")


@pytest.mark.background  # start-up errors only: no real-time bound (tests/cpu_share.py)
def test_a_file_that_is_not_a_manifest_is_named_by_serve_and_replay_alike(tmp_path):
    """One reader of manifests (engines/models/paths.read_manifest) for the replayer's preflight and the runtime."""
    from edgeinfer.core.config import to_argv
    from edgeinfer.core.transport import Endpoints

    for content, why in ((b"root:x:0:0:root:/root:/bin/bash\n", "Expecting value"), (b"[1, 2]", "a JSON list"),
                         (bytes(range(128, 256)), "codec can't decode")):
        path = tmp_path / "p.json"
        path.write_bytes(content)
        for argv in (["replay", "--policy", str(path), "--out", str(tmp_path / "o")],
                     ["serve", "--policy", str(path), *to_argv(Endpoints.free_loopback())]):
            line = _one_error_line(_edgeinfer(*argv))
            assert line.startswith(f"edgeinfer {argv[0]}: error: {path}: not a policy manifest (") and why in line


def test_serve_on_a_port_in_use_says_so_in_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _edgeinfer("serve", "--chunks", f"tcp://127.0.0.1:{port}", "--obs", "tcp://127.0.0.1:1",
                          "--commands", "tcp://127.0.0.1:2", "--ready", "tcp://127.0.0.1:3", "--null-policy", "true")
    line = _one_error_line(proc)
    assert line.startswith(f"edgeinfer serve: error: --chunks tcp://127.0.0.1:{port}: cannot bind")
    assert "Address already in use" in line


def test_version_help_order_and_hidden_internal_command():
    version = _edgeinfer("--version")
    assert version.returncode == 0 and re.fullmatch(r"edgeinfer \d+\.\d+\S*\n", version.stdout)
    top = _edgeinfer("-h").stdout
    assert "fleet-replay" in top and "fleet-robots" not in top
    help_ = _edgeinfer("replay", "-h").stdout
    usage = help_[:help_.index("\n\n")]
    assert "[--log PATH] [--policy PATH]" in usage and "[--out PATH] [--budget-ms FLOAT]" in usage
    first = help_.index("the options used most")
    assert first < help_.index("  --log PATH") < help_.index("  --out PATH") < help_.index("  --topic STR")
    assert "3 --slo's verdict is INVALID" in " ".join(help_.split())


def test_compare_keeps_every_figure_whole_at_80_columns(tmp_path):
    from edgeinfer.sim.compare import _fmt, compare

    a, b = report("clean", seed=0)[0], report("killed", seed=1, kill_at_tick=700)[0]
    write_report(a, tmp_path / "a")
    write_report(b, tmp_path / "b")
    proc = _edgeinfer("compare", str(tmp_path / "a" / "report.json"), str(tmp_path / "b" / "report.json"),
                      env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in proc.stdout
    cells = [c.strip() for line in lines for c in line.split("│")]
    for row in compare(a, b):
        for value in (row["a"], row["b"], row["ratio"]):
            assert _fmt(value) in cells, (_fmt(value), proc.stdout)


def test_sweep_table_never_splits_a_figure():
    from rich.console import Console

    from edgeinfer.sim.sweep import print_rows

    row = {"run": "measurement_1/speculative-fused-budget-12ms", "status": "ok", "latency_p50_ms": 1.42,
           "latency_p50_ci95_ms": [1.38, 1.5], "latency_p99_ms": 2.718, "latency_p99_ci95_ms": [2.5, 3.25],
           "miss_rate": 0.0123, "miss_rate_upper95": 0.0201, "verdict": "INVALID", "error": None}
    console = Console(width=80, record=True, file=open(os.devnull, "w"))
    print_rows([row], console)
    words = console.export_text().replace("│", " ").split()
    for figure in ("1.420", "[1.380,", "1.500]", "2.718", "[2.500,", "3.250]", "1.23", "2.01)"):
        assert figure in words, console.export_text()


def test_the_table_says_when_a_restart_did_not_recover():
    from edgeinfer.sim.report import _injected

    kill = {"injected": {"runtime_kill": {"at_row": 300, "done_at_row": 300, "restarted": True}}}
    assert "NOT recovered" in _injected({**kill, "runtime_fault": {"recovered": False, "time_to_recover_ms": None}})
    assert "recovered in 412 ms" in _injected({**kill, "runtime_fault": {"recovered": True,
                                                                         "time_to_recover_ms": 412.3}})


@pytest.mark.slow
def test_an_invalid_slo_fails_the_replay(tmp_path):
    proc = _edgeinfer("replay", "--out", str(tmp_path), "--duration-s", "0.5", "--slo", "p99<=0.001ms",
                      "--plots", "false", "--run-mcap", "false", timeout=300)
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "INVALID" in proc.stderr


def test_train_and_distill_help_import_no_torch():
    """`edgeinfer train --help` took 4 s: its config imported torch. The configs live in engines/training/fit_config.py,
    which imports no torch (nor does the command table, nor the data loaders)."""
    code = ("import sys, edgeinfer.engines.training.fit_config, edgeinfer.core.commands; "
            "print(sorted(m for m in ('torch', 'onnxruntime', 'numba') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    from edgeinfer.core.commands import config_classes

    assert [c.__name__ for c in config_classes("train")] == ["TrainConfig"]
    assert [c.__name__ for c in config_classes("distill")] == ["DistillConfig"]
