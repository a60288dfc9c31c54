"""Dataclass-generated command-line options, TOML launch files, and the real `edgeinfer` CLI."""
import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from edgeinfer.control.loop import ControlConfig
from edgeinfer.control.safety import SafetyLimits
from edgeinfer.core.config import (
    add_options,
    build,
    expand_bool_flags,
    field_docs,
    first_sentence,
    load,
    load_launch,
    to_argv,
)
from edgeinfer.core.scheduler import SchedulerConfig
from edgeinfer.launch import LaunchConfig
from edgeinfer.node.runtime import RuntimeConfig
from edgeinfer.sim.run_config import ReplayConfig

ROOT = Path(__file__).resolve().parents[1]


def replay_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="test")
    add_options(p, ReplayConfig)
    return p


def parse_build(argv, launch=None) -> ReplayConfig:
    return build(ReplayConfig, replay_parser().parse_args(argv), launch)


def custom_config(tmp_path) -> ReplayConfig:
    return ReplayConfig(
        log=tmp_path / "log dir", out=tmp_path / "out", deadline_ms=4.0, settle_ms=50.0, handshake_timeout_s=9.0,
        runtime=RuntimeConfig(policy=tmp_path / "p.json", decode="target-only", drafter="kinematic",
                              scheduler=SchedulerConfig(budget_ms=9.5, k_max=3, quantile=0.95, window=64),
                              warmup_chunks=5, threads=2),
        control=ControlConfig(phase_ms=0.5, spin_us=50.0,
                              limits=SafetyLimits(q_min_rad=[-1.0, -2.5, -0.125], q_max_rad=[1.0, 2.5, 3.0],
                                                  qd_max_rad_s=1.5)))


def test_to_argv_round_trips_nested_non_default_values(tmp_path):
    cfg = custom_config(tmp_path)
    assert cfg != ReplayConfig()
    argv = to_argv(cfg)
    i = argv.index("--budget-ms")
    assert argv[i + 1] == "9.5"
    i = argv.index("--q-min-rad")
    assert argv[i + 1:i + 4] == ["-1.0", "-2.5", "-0.125"] and argv[i + 4] == "--q-max-rad"
    back = parse_build(argv)
    assert back == cfg
    # converted to the annotated types, not left as strings
    assert type(back.runtime.scheduler.k_max) is int and back.runtime.scheduler.k_max == 3
    assert back.control.phase_ms == 0.5 and back.runtime.decode == "target-only"
    assert back.control.limits.q_min_rad == [-1.0, -2.5, -0.125]
    assert isinstance(back.log, Path) and back.log == tmp_path / "log dir"


def test_none_fields_are_omitted_and_stay_none():
    cfg = ReplayConfig(deadline_ms=None, log=None)
    argv = to_argv(cfg)
    assert "--deadline-ms" not in argv and "--log" not in argv
    assert parse_build(argv) == cfg


def test_no_options_build_the_defaults():
    assert parse_build([]) == ReplayConfig()


def test_options_fill_only_their_field():
    cfg = parse_build(["--k-max", "2", "--phase-ms", "0.25"])
    assert cfg.runtime.scheduler == SchedulerConfig(k_max=2)
    assert cfg.control.phase_ms == 0.25 and cfg.control.limits == SafetyLimits()
    assert cfg.runtime.decode == RuntimeConfig().decode


def write_launch(tmp_path, text: str) -> Path:
    path = tmp_path / "launch.toml"
    path.write_text(text)
    return path


LAUNCH = "[replay]\ndeadline_ms = 5.0\n[replay.runtime.scheduler]\nbudget_ms = 7.0\n"


def test_launch_file_fills_nested_fields(tmp_path):
    launch = load_launch(write_launch(tmp_path, LAUNCH), "replay")
    assert launch == {"deadline_ms": 5.0, "runtime": {"scheduler": {"budget_ms": 7.0}}}
    cfg = parse_build([], launch)
    assert cfg.deadline_ms == 5.0
    assert cfg.runtime.scheduler == SchedulerConfig(budget_ms=7.0)
    assert cfg.runtime.decode == RuntimeConfig().decode and cfg.control == ControlConfig()


def test_command_line_overrides_launch_file(tmp_path):
    launch = load_launch(write_launch(tmp_path, LAUNCH), "replay")
    cfg = parse_build(["--budget-ms", "8.25", "--k-max", "1"], launch)
    assert cfg.runtime.scheduler.budget_ms == 8.25  # option beats the file
    assert cfg.runtime.scheduler.k_max == 1
    assert cfg.deadline_ms == 5.0  # file value kept where no option was given


def test_launch_sections_other_than_the_one_asked_are_ignored(tmp_path):
    path = write_launch(tmp_path, "[train]\nepochs = 3\n[replay]\nduration_s = 1.0\n")
    assert load_launch(path, "replay") == {"duration_s": 1.0}
    assert load_launch(None, "replay") == {}


def test_a_launch_file_without_the_asked_table_is_refused_not_run_with_defaults(tmp_path):
    path = write_launch(tmp_path, "[serve]\nbudget_ms = 3.0\n[hil]\n")  # e.g. replay --launch launch/hil.toml
    with pytest.raises(ValueError, match=r"no \[replay\] table \(it has \['hil', 'serve'\]\)"):
        load_launch(path, "replay")
    path.write_text("replay = 3\n")
    with pytest.raises(ValueError, match="replay must be a table, got int"):
        load_launch(path, "replay")


def test_a_bool_option_alone_means_true_and_never_takes_a_positional_argument():
    parser = argparse.ArgumentParser()
    parser.add_argument("file")
    add_options(parser, LaunchConfig)
    assert expand_bool_flags(parser, ["--dry-run", "f.toml"]) == ["--dry-run", "true", "f.toml"]
    assert expand_bool_flags(parser, ["f.toml", "--dry-run"]) == ["f.toml", "--dry-run", "true"]
    assert expand_bool_flags(parser, ["--dry-run", "No", "f.toml"]) == ["--dry-run", "No", "f.toml"]
    args = parser.parse_args(expand_bool_flags(parser, ["--dry-run", "f.toml"]))
    assert args.file == "f.toml" and vars(args)["dry_run"] is True
    assert vars(parser.parse_args(["f.toml", "--dry-run", "off"]))["dry_run"] is False
    alone = argparse.ArgumentParser()  # no positional argument: a word after the flag is its value, checked
    add_options(alone, LaunchConfig)
    assert expand_bool_flags(alone, ["--dry-run", "ture"]) == ["--dry-run", "ture"]
    with pytest.raises(SystemExit):
        alone.parse_args(["--dry-run", "ture"])


def test_shipped_launch_file_builds_a_valid_config():
    path = ROOT / "launch" / "replay.toml"
    if not path.is_file():
        pytest.skip("no launch/replay.toml")
    launch = load_launch(path, "replay")
    assert launch, "launch/replay.toml has no [replay] table"
    cfg = parse_build([], launch)  # every key must name a field, every value must validate
    sched = launch.get("runtime", {}).get("scheduler", {})
    for key, value in sched.items():
        assert getattr(cfg.runtime.scheduler, key) == value
    assert parse_build(["--decode", "target-only"], launch).runtime.decode == "target-only"


@pytest.mark.parametrize("text, key", [
    ("[replay]\nfoo = 1\n", "foo"),
    ("[replay.runtime.scheduler]\nbudgetms = 7.0\n", "budgetms"),
    ("[replay.control.limits]\nqd_max = 1.0\n", "qd_max"),
])
def test_unknown_launch_key_raises_naming_it(tmp_path, text, key):
    launch = load_launch(write_launch(tmp_path, text), "replay")
    with pytest.raises(ValueError, match=key):
        parse_build([], launch)


@pytest.mark.parametrize("argv, match", [
    (["--k-max", "65"], "k_max"),
    (["--budget-ms", "0"], "budget_ms"),
    (["--deadline-ms", "-1"], "deadline_ms"),
    (["--phase-ms", "1000"], "phase_ms"),
    (["--q-min-rad", "1", "1", "1", "1", "1", "1", "--q-max-rad", "0", "0", "0", "0", "0", "0"], "below"),
])
def test_invalid_option_values_raise_the_dataclass_error(argv, match):
    with pytest.raises(ValueError, match=match):
        parse_build(argv)


def test_invalid_launch_value_raises_the_dataclass_error(tmp_path):
    launch = load_launch(write_launch(tmp_path, '[replay.runtime]\ndecode = "fast"\n'), "replay")
    with pytest.raises(ValueError, match="decode"):
        parse_build([], launch)


def test_ambiguous_option_names_are_rejected():
    with pytest.raises(ValueError, match=r"--policy is ambiguous: \(.runtime., .policy.\) and \(.policy.,\)"):
        add_options(argparse.ArgumentParser(), ReplayConfig, RuntimeConfig)


def test_cli_replay_help_lists_generated_options():
    res = subprocess.run([sys.executable, "-m", "edgeinfer", "replay", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    for opt in ("--decode", "--budget-ms", "--launch", "--q-min-rad", "--phase-ms"):
        assert opt in res.stdout


def test_choices_are_checked_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        parse_build(["--decode", "fast"])
    assert "invalid choice: 'fast'" in capsys.readouterr().err


@pytest.mark.parametrize("text, match", [
    ('[replay.runtime.scheduler]\nbudget_ms = "16"\n', r"ReplayConfig.runtime.scheduler.budget_ms: expected float"),
    ("[replay.runtime]\nthreads = 1.5\n", r"ReplayConfig.runtime.threads: expected int"),
    ("[replay.runtime.scheduler]\nk_max = true\n", r"k_max: expected int"),
    ("[replay]\nruntime = 3\n", r"ReplayConfig.runtime: expected a table"),
])
def test_launch_values_of_the_wrong_type_name_the_key(tmp_path, text, match):
    launch = load_launch(write_launch(tmp_path, text), "replay")
    with pytest.raises(ValueError, match=match):
        parse_build([], launch)


def test_launch_table_typo_is_an_error_not_silent_defaults(tmp_path):
    with pytest.raises(ValueError, match=r"unknown table\(s\) \['replya'\]"):
        load_launch(write_launch(tmp_path, "[replya]\ndeadline_ms = 5.0\n"), "replay")


def test_launch_relative_paths_resolve_against_the_launch_file(tmp_path):
    path = write_launch(tmp_path, '[replay]\nlog = "data/run1"\nout = "/abs/out"\n')
    cfg = build(ReplayConfig, replay_parser().parse_args([]), load_launch(path, "replay"), tmp_path)
    assert cfg.log == tmp_path / "data" / "run1"
    assert cfg.out == Path("/abs/out")
    # a path given on the command line stays relative to the working directory
    cfg = build(ReplayConfig, replay_parser().parse_args(["--log", "here"]), load_launch(path, "replay"), tmp_path)
    assert cfg.log == Path("here")


# ------------------------------------------------------------------------------------- one loader, one --help

def test_field_docs_are_the_trailing_comment_or_the_block_above():
    docs = field_docs(ReplayConfig)
    assert docs["garbage_per_row"].startswith("fault drill: malformed messages")  # trailing
    assert docs["pin_cpus"].startswith("Pin the replayer and control loop to CPU 0")  # block above, joined
    assert docs["time_scale"].startswith("Replay speed")  # inherited from PacingConfig
    assert first_sentence("A (b. c; d). E") == "A (b. c; d)" and first_sentence("x e.g. y. z") == "x e.g. y"


def test_load_names_the_file_and_the_key(tmp_path):
    @dataclasses.dataclass
    class Item:
        name: str
        size_m: float = 1.0

    @dataclasses.dataclass
    class Doc:
        items: list[Item]
        where: Path | None = None

    assert load(Doc, {"items": [{"name": "a", "size_m": 2}], "where": "x"}, base_dir=tmp_path) == \
        Doc([Item("a", 2.0)], tmp_path / "x")  # int accepted for float; a relative path joins base_dir
    for data, match in [({"items": [{"name": "a", "size": 2}]}, r"f.toml: items\[0\]: unknown keys \['size'\]"),
                        ({"items": [{}]}, r"f.toml: items\[0\]\.name: missing"),
                        ({"items": [{"name": "a", "size_m": "2"}]}, r"f.toml: items\[0\]\.size_m: expected float, "
                                                                    r"got str '2'"),
                        ({"items": {}}, r"f.toml: items: expected a list, got dict")]:
        with pytest.raises(ValueError, match=match):
            load(Doc, data, file="f.toml")


def test_replay_and_hil_share_their_robot_side_fields_and_defaults():
    """One SessionConfig behind both: same fields, same defaults (the handshake timeout is 300 s for both);
    only the output folder differs on purpose (a hil run must not overwrite a replay's report)."""
    from edgeinfer.control.safety import CommandConfig
    from edgeinfer.node.controller import ControllerConfig
    from edgeinfer.sim.hil import HilConfig
    from edgeinfer.sim.run_config import SessionConfig

    hil, replay = HilConfig(endpoint="tcp://127.0.0.1:40000"), ReplayConfig()
    for f in dataclasses.fields(SessionConfig):
        if f.name != "out":
            assert getattr(hil, f.name) == getattr(replay, f.name), f.name
    assert hil.handshake_timeout_s == replay.handshake_timeout_s == 300.0
    assert (hil.out, replay.out) == (Path("out/hil"), Path("out"))
    for cfg in (ControlConfig(), ControllerConfig()):  # the control loop and the embedded controller
        assert isinstance(cfg, CommandConfig) and (cfg.blend_ms, cfg.limits) == (10.0, SafetyLimits())
    with pytest.raises(ValueError, match="HilConfig.time_scale"):
        HilConfig(endpoint="tcp://127.0.0.1:40000", time_scale=50)


@pytest.mark.parametrize("argv, said", [
    (["replay", "--budget-ms", "0.01"], "replay: error: --budget-ms (0.01) must exceed --margin-ms (0.5)"),
    (["replay", "--k-max", "99"], "replay: error: --k-max must be in 0..64, got 99"),
    (["replay", "--duration-s", "-1"], "replay: error: --duration-s must be > 0, got -1.0"),
    (["replay", "--margin-ms", "-1"], "replay: error: --margin-ms must be >= 0, got -1.0"),
    (["replay", "--spin-us", "nan"], "replay: error: --spin-us must be in [0, 10000], got nan"),
    (["replay", "--control-cpus", "99"], "replay: error: --control-cpus [99]: not among the CPUs this process may run"),
    (["replay", "--restart-runtime-after-ms", "100"],
     "replay: error: --restart-runtime-after-ms needs --kill-runtime-at-tick and must be >= 0, got 100.0"),
    (["replay", "--phase-ms", "2000"], "replay: error: --phase-ms must be in [0, 1000), got 2000.0"),
    # the budget a replay derives (20 ms at 250 Hz), refused before any process starts
    (["replay", "--margin-ms", "1000"], "replay: error: the budget, 20 ms (the time between two chunk starts; "
                                        "--budget-ms sets another) must exceed --margin-ms (1000.0)"),
    (["train", "--batch-size", "0", "--lr", "-1"], "train: error: --batch-size must be >= 1, got 0; --lr must be > 0"),
    (["bench", "engines", "--n-obs", "0"], "bench engines: error: --n-obs must be >= 1, got 0"),
    (["fleet-replay", "--margin-ms", "-1"], "fleet-replay: error: --margin-ms must be >= 0, got -1.0"),
    (["fleet-replay", "--k", "5", "--k-max", "2"], "fleet-replay: error: --k (5) and --k-max (2): need"),
])
def test_a_bad_value_on_the_command_line_is_named_by_its_option(argv, said, capsys, tmp_path):
    from edgeinfer import cli

    out = ["--out", str(tmp_path)] if argv[0] in ("replay", "fleet-replay", "train") else []
    assert cli.main([*argv, *out]) == 2
    assert f"edgeinfer {said}" in " ".join(capsys.readouterr().err.split())


def test_a_bad_value_from_a_launch_file_keeps_its_key(capsys, tmp_path):
    from edgeinfer import cli

    (tmp_path / "run.toml").write_text("[replay.runtime.scheduler]\nk_max = 99\n")
    assert cli.main(["replay", "--launch", str(tmp_path / "run.toml"), "--out", str(tmp_path)]) == 2
    assert "SchedulerConfig.k_max must be in 0..64, got 99" in capsys.readouterr().err  # the file's key, no option
