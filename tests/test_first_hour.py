"""A new user's first hour: optional extras checked before the work starts (one line naming the extra),
hints printed whole through rich, progress of long work in a terminal and in a log, doc statements that match
the code.

The end-to-end tests run the real `edgeinfer` command in a child process, with the optional modules blocked by a
sitecustomize on PYTHONPATH (an import of them raises ModuleNotFoundError, as on the base install)."""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pytest
from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]

BLOCKER = textwrap.dedent('''
    import os, sys

    class _Blocked:
        """Optional modules as on the base install: importing one raises ModuleNotFoundError."""
        names = set(filter(None, os.environ.get("BLOCK_MODULES", "").split(",")))

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in self.names:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _Blocked())
''')


def run_edgeinfer(tmp_path: Path, args: list[str], blocked: tuple[str, ...] = (), timeout_s: float = 120.0,
                  cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m edgeinfer ARGS` in a child process, stdout and stderr piped (not a terminal), with `blocked`
    modules missing; the package is the one this test file sits in (PYTHONPATH), so a clone tests itself."""
    site = tmp_path / "blocker"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "BLOCK_MODULES": ",".join(blocked),
                        "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "edgeinfer", *args], cwd=cwd or tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout_s)


# --- item 2: optional requirements checked before any work, one line naming the extra -------------------------


def test_every_extra_of_pyproject_is_known_to_the_check():
    from edgeinfer.core import extras

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(declared) - {"test"} == set(extras.EXTRAS)
    assert "transformers" in extras.EXTRAS["hf"] and "ray" in extras.EXTRAS["sweep"]
    assert {"mcap", "rosbags"} <= set(extras.EXTRAS["logs"])
    assert any("edgeinfer[" in d and "hf" in d for d in declared["test"])  # the tests install the peer


def test_require_names_the_extra_in_one_line(monkeypatch):
    from edgeinfer.core import extras

    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    assert extras.missing("sweep") == ["ray"]
    with pytest.raises(extras.MissingExtra) as e:
        extras.require("sweep", "edgeinfer sweep")
    assert str(e.value) == "edgeinfer sweep needs ray, not installed: pip install 'edgeinfer[sweep]'"
    assert isinstance(e.value, RuntimeError)  # the CLI prints it as one line, no traceback
    assert extras.missing("hf", ("json",)) == []
    with pytest.raises(ValueError, match="unknown extra"):
        extras.require("nope", "x")


@pytest.mark.slow
def test_bench_spec_without_transformers_stops_at_once_naming_the_extra(tmp_path):
    t0 = time.monotonic()
    # from the repository root, as the README runs it: with ../shared/data there, decoding first takes minutes
    args = ["bench", "spec", "--per-run", "1", "--ks", "2", "--json", str(tmp_path / "spec.json")]
    res = run_edgeinfer(tmp_path, args, blocked=("transformers",), timeout_s=90, cwd=ROOT)
    took = time.monotonic() - t0
    assert res.returncode == 2, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert lines == ["edgeinfer bench spec: error: bench spec's Hugging Face peer rows (--no-peer skips them) needs "
                     "transformers, not installed: pip install 'edgeinfer[hf]'"]
    assert took < 60  # imports only: the old bench decoded for minutes first
    assert not (tmp_path / "spec.json").exists()


@pytest.mark.slow
def test_sweep_of_mcap_logs_without_mcap_stops_before_ray_starts(tmp_path):
    (tmp_path / "run.mcap").write_bytes(b"")  # its format is told by its name: never read
    (tmp_path / "sweep.toml").write_text('[sweep]\nlogs = ["run.mcap"]\nout = "out"\n[configs.a]\n')
    res = run_edgeinfer(tmp_path, ["sweep", "sweep.toml"], blocked=("mcap", "mcap_ros2"), timeout_s=90)
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stderr.strip() == ("edgeinfer sweep: error: reading mcap logs needs mcap, not installed: "
                                  "pip install 'edgeinfer[logs]'")
    assert not (tmp_path / "out").exists()  # no replay started


# --- item 3: hints keep their brackets through rich ------------------------------------------------------------


def test_say_keeps_brackets_of_a_hint():
    from edgeinfer.core.progress import say

    out = io.StringIO()
    console = Console(file=out, width=200)
    say(console, "reading mcap logs needs mcap: pip install 'edgeinfer[logs]'", "yellow")
    assert out.getvalue() == "reading mcap logs needs mcap: pip install 'edgeinfer[logs]'\n"


@pytest.mark.slow
def test_launch_prints_a_failed_nodes_install_hint_whole(tmp_path):
    (tmp_path / "run.mcap").write_bytes(b"")
    (tmp_path / "l.toml").write_text('[replay]\nlog = "run.mcap"\nout = "out"\n')
    res = run_edgeinfer(tmp_path, ["launch", "l.toml"], blocked=("mcap", "mcap_ros2"), timeout_s=90)
    assert res.returncode == 1
    assert "pip install 'edgeinfer[logs]'" in res.stdout, res.stdout[-3000:]
    assert "pip install 'edgeinfer'" not in res.stdout


def test_readme_says_what_the_base_install_reads_and_writes():
    readme = (ROOT / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `run.mcap` |"))
    assert ".[logs]" in row  # the base install skips run.mcap (sim/run_mcap.py)
    assert "LeRobot readers" not in readme  # LeRobot reads on the base install (pyarrow)
    from edgeinfer.logs import _NEEDS

    assert "lerobot" not in _NEEDS and "csv" not in _NEEDS


# --- item 4: long work says what it does and how far along, in a terminal and in a log ---------------------------


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_progress_in_a_log_is_plain_lines_at_a_modest_rate():
    from edgeinfer.core.progress import Progress

    out, clock = io.StringIO(), _Clock()
    console = Console(file=out, width=200)  # not a terminal: a log file
    with Progress("training target", total=3000, console=console, every_s=10.0, clock=clock) as bar:
        for i in range(3000):
            clock.t = (i + 1) * 0.01  # 30 s of work, 10 ms a step
            bar.advance(detail="loss 1.000")  # a detail: no new line
    lines = out.getvalue().splitlines()
    assert lines[0] == "training target: 0/3000 (0 %), 0 s elapsed"
    assert lines[1].startswith("training target (loss 1.000): 1000/3000 (33 %), 10 s elapsed, about 20 s left")
    assert len(lines) == 5  # start, 10 s, 20 s, 30 s, done: one line per 10 s
    assert lines[-1] == "training target: done, 3000/3000 in 30 s"


def test_progress_prints_a_line_for_each_new_phase_but_not_faster_than_a_second():
    from edgeinfer.core.progress import Progress

    out, clock = io.StringIO(), _Clock()
    with Progress("bench: a", total=4, console=Console(file=out, width=200), clock=clock) as bar:
        for phase in "bcd":
            clock.t += 0.3 if phase == "c" else 2.0
            bar.advance(label=f"bench: {phase}")
    assert [line.split(":")[1].strip() for line in out.getvalue().splitlines()] == ["a", "b", "d", "d"]


def test_progress_at_a_terminal_draws_a_bar_and_no_plain_lines():
    from edgeinfer.core.progress import Progress

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with Progress("sweep: 4 replays on Ray", total=4, console=console) as bar:
        bar.advance()
    text = out.getvalue()
    assert "sweep: 4 replays on Ray" in text and "1/4" in text and "elapsed" not in text


@pytest.mark.slow
def test_bench_transport_piped_to_a_log_reports_its_phases(tmp_path):
    res = run_edgeinfer(tmp_path, ["bench", "transport", "--n", "10", "--n-idle", "10", "--n-periodic", "10",
                                   "--idle-gap-ms", "1"], timeout_s=120)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stderr.splitlines()
    assert lines[0] == "bench transport: starting the null runtime node: 0/12 (0 %), 0 s elapsed"
    assert lines[-1].startswith("bench transport: done, 12/12 in ")
    assert "observation -> chunk round trip" in res.stdout


@pytest.mark.slow
def test_replay_says_what_it_skips_and_what_the_runtime_does_before_its_first_chunk(tmp_path):
    res = run_edgeinfer(tmp_path, ["replay", "--out", "out", "--duration-s", "0.5", "--plots", "false"],
                        blocked=("mcap", "mcap_ros2"), timeout_s=180)  # the base install: no mcap
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    assert lines[0] == "run.mcap (--run-mcap false skips it) needs mcap, not installed: pip install 'edgeinfer[logs]'"
    assert lines[1].startswith("runtime: opening the engine auto chose at an earlier start, or, on a first run here, "
                               "compiling the CPU engines (15-60 s)")
    assert lines[2] == "starting runtime (speculative) and control processes: 0 s elapsed"
    done = next(i for i, line in enumerate(lines) if line.startswith("starting runtime (speculative) and control "
                                                                        "processes: done in "))
    for line in lines[3:done]:  # a slow start-up: a line every 10 s, how long it has taken so far
        assert re.fullmatch(r"starting runtime \(speculative\) and control processes: \d+ s elapsed", line)
    assert len(lines[3:done]) <= 12  # at most one line per 10 s (and the handshake's own limit)
    assert lines[done + 1] == "replaying 125 observations at 250 Hz (about 0.7 s)"
    assert not (tmp_path / "out" / "run.mcap").exists()


# --- item 10: doc statements that match the code -----------------------------------------------------------------


def test_launch_doc_lists_the_bool_values_the_parser_takes():
    from edgeinfer.core.config import _BOOLS

    text = (ROOT / "docs" / "launch.md").read_text()
    assert "any other value is refused" in text
    for value in _BOOLS:
        assert f"`{value}`" in text


def test_fleet_doc_says_robot_records_are_written_on_every_run():
    text = " ".join((ROOT / "docs" / "fleet.md").read_text().split())
    assert "every run writes each robot's record to `robots/NAME.npz`" in text


def test_fleet_bench_banner_bounds_the_settle_wait():
    from edgeinfer.bench.fleet_capacity import POINT_OVERHEAD_S, FleetBenchConfig, plan_line

    cfg = FleetBenchConfig()
    line = plan_line(cfg)
    points = len(cfg.configs) * len(cfg.phases) * 6  # N = 1 .. 32
    bound = points * (cfg.duration_s + POINT_OVERHEAD_S + cfg.settle_max_s) / 60
    assert f"at most {bound + 2 * 63 * 2.0 / 60:.0f} min" in line  # + a's 63 runtime processes, both phases
    assert "about 19 min on a quiet machine" in line  # the saved EPYC run: 55 points, 13 min


def test_keys_directory_is_ignored_and_the_docs_keep_keys_outside_the_repository(tmp_path):
    res = subprocess.run(["git", "check-ignore", "-q", "keys/server.key_secret"], cwd=ROOT)
    assert res.returncode == 0  # ignored
    hil = (ROOT / "docs" / "hil.md").read_text()
    assert "edgeinfer keys keys/" not in hil and "edgeinfer keys ~/.edgeinfer/keys" in hil


def test_embedding_doc_gives_the_measured_warm_up():
    text = (ROOT / "docs" / "embedding.md").read_text()
    assert "about a second" not in text and "warms up: 3-4 s" in text


@pytest.mark.slow
@pytest.mark.background  # a training: CPU-bound, no real-time bound (tests/cpu_share.py)
def test_train_piped_to_a_log_reports_its_steps(tmp_path, schunk_dir):
    out = run_edgeinfer(tmp_path, ["train", "--data", str(schunk_dir), "--steps", "4", "--batch-size", "8",
                                   "--out", str(tmp_path / "p" / "mini_target.json")], timeout_s=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0] == f"train: reading {schunk_dir}", out.stdout[-2000:]  # before the logs are read
    assert any(line.startswith("training target: 0/4 (0 %)") for line in lines), out.stdout[-2000:]
    assert any(line.startswith("train: decoding ") and "held-out windows" in line for line in lines)
    assert "training target: done, 4/4 in" in out.stdout
