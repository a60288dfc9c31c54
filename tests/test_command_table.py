"""The one command table (edgeinfer/cli.py): every command, bench suites included, parsed from its *Config
dataclasses by core.config.add_options; the table registered into core from the top down; and the links that
were "module:Class" strings now imports the layers contract sees."""
import argparse
import re
from pathlib import Path

import grimp
import pytest

from edgeinfer import cli
from edgeinfer.core import commands
from edgeinfer.core.config import _leaves, parse, to_argv


def _paths():
    for name, command in cli.COMMANDS.items():
        yield (name,)
        for suite in command.suites:
            yield (name, suite)


PATHS = [p for p in _paths() if p != ("fork-server",)]


def _help(path, monkeypatch, capsys) -> tuple[argparse.ArgumentParser, str]:
    seen = {}

    def record(self, parser, namespace, values, option_string=None):
        seen["parser"] = parser
        parser.print_help()
        parser.exit()

    monkeypatch.setattr(argparse._HelpAction, "__call__", record)
    with pytest.raises(SystemExit) as e:
        cli.main([*path, "--help"])
    assert e.value.code == 0
    return seen["parser"], " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("path", PATHS, ids=" ".join)
def test_every_command_help_lists_every_field_of_its_configs(path, monkeypatch, capsys):
    command = cli.COMMANDS[path[0]] if len(path) == 1 else cli.COMMANDS[path[0]].suites[path[1]]
    parser, text = _help(path, monkeypatch, capsys)
    assert text.startswith(f"usage: edgeinfer {' '.join(path)}")
    by_option = {a.option_strings[0]: a for a in parser._actions if a.option_strings}
    for cls in command.config_classes():
        for dotted, _, default, _, _ in _leaves(cls):
            option = "--" + dotted[-1].replace("_", "-")
            assert option in text, f"edgeinfer {' '.join(path)}: {option} not in -h"
            action = by_option[option]
            assert action.help and "\n" not in action.help, option  # its field's documentation, one line
            if default != "required" and default is not None:
                assert "(default: " in action.help, option
    for option, action in by_option.items():  # the options that are no config field's too (--policy, --out, ...)
        if not isinstance(action, argparse._HelpAction):
            text = re.sub(r"\((default: .*|required)\)$", "", action.help or "").strip()
            assert text and "\n" not in text, f"edgeinfer {' '.join(path)} {option}: no one-line description"


def test_the_commands_that_had_hand_written_parsers_keep_their_option_names_and_defaults():
    from edgeinfer.bench.engines import EnginesBenchConfig
    from edgeinfer.bench.speculation import KS, SpecBenchConfig
    from edgeinfer.bench.transport_costs import TransportBenchConfig
    from edgeinfer.entry_points import CompareConfig

    assert parse(SpecBenchConfig, ["--ks", "2,3", "--no-peer", "--drafters", "early-exit"], "t") == SpecBenchConfig(
        ks=(2, 3), no_peer=True, drafters=("early-exit",))
    assert SpecBenchConfig().ks == KS and SpecBenchConfig().backend == ("torch", "packed")
    assert SpecBenchConfig().per_run == 12 and SpecBenchConfig().repeats == 3
    cfg = parse(EnginesBenchConfig, ["--policy", "engines/weights/schunk_target.json", "--policy",
                                     "engines/weights/schunk_target.json", "--compile", "--rows", "ultrafast"], "t")
    assert len(cfg.policy) == 2 and cfg.compile and cfg.backends == ("torch", "onnxruntime", "fused", "packed")
    assert TransportBenchConfig() == parse(TransportBenchConfig, [], "t")
    assert (TransportBenchConfig().n, TransportBenchConfig().rate_hz) == (2000, 250.0)
    assert parse(CompareConfig, ["--fail-on-regression"], "t") == CompareConfig(fail_on_regression=True)


def test_a_tuple_option_is_one_comma_separated_value_and_round_trips(capsys):
    from edgeinfer.bench.speculation import SpecBenchConfig

    cfg = SpecBenchConfig(ks=(1, 4), drafters=("kinematic", "learned"))
    argv = to_argv(cfg)
    assert argv[argv.index("--ks") + 1] == "1,4" and argv[argv.index("--drafters") + 1] == "kinematic,learned"
    assert parse(SpecBenchConfig, argv, "t") == cfg
    for bad, message in ((["--ks", "1,x"], "--ks must be comma separated integers, got '1,x'"),
                         (["--drafters", "a,,b"], "--drafters must be comma separated names"),
                         (["--backend", "nope"], "unknown ['nope']")):
        with pytest.raises(SystemExit) as e:
            parse(SpecBenchConfig, bad, "t")
        assert e.value.code == 2 and message in capsys.readouterr().err


def test_the_transformers_peer_parses_from_its_config():
    pytest.importorskip("torch")
    from edgeinfer.engines.peers.hf_peer import HfPeerConfig

    assert parse(HfPeerConfig, ["--max-new-tokens", "16", "--json", "x.json"], "t") == HfPeerConfig(
        max_new_tokens=16, json=Path("x.json"))
    with pytest.raises(SystemExit):
        parse(HfPeerConfig, ["--prompts", "0"], "t")


def test_the_table_is_registered_from_the_top_down():
    saved = dict(commands.registered())
    try:
        commands.register({})
        with pytest.raises(RuntimeError, match="register_commands"):
            commands.node_commands()
        cli.register_commands()
        assert set(commands.node_commands()) == {"replay", "serve", "fleet", "fleet-robots", "control", "hil"}
        assert "bench" in commands.config_tables() and "keys" not in commands.config_tables()
        assert [c.__name__ for c in commands.config_classes("serve")] == ["RuntimeConfig", "Endpoints"]
        with pytest.raises(ValueError, match="not an edgeinfer node"):
            commands.node("train")
    finally:
        commands.register(saved)


def test_the_layers_contract_sees_every_command_link():
    """What were "module:Class" strings in core/commands.py and module names in procs/forkserver.py are imports
    now: the graph has them, and none of core, procs or launch names a module above it in a string."""
    graph = grimp.build_graph("edgeinfer")
    imported = graph.find_modules_directly_imported_by("edgeinfer.entry_points")
    for module in ("edgeinfer.sim.run_config", "edgeinfer.node.runtime", "edgeinfer.core.transport", "edgeinfer.launch",
                   "edgeinfer.control.loop", "edgeinfer.engines.training.fit_config",
                   "edgeinfer.engines.backends.build", "edgeinfer.sim.hil", "edgeinfer.sim.sweep",
                   "edgeinfer.bench.suite", "edgeinfer.bench.speculation", "edgeinfer.bench.engines",
                   "edgeinfer.bench.transport_costs", "edgeinfer.bench.anytime", "edgeinfer.bench.fleet_capacity",
                   "edgeinfer.node.serve"):
        assert module in imported, module
    assert "edgeinfer.entry_points" in graph.find_modules_directly_imported_by("edgeinfer.cli")
    root = Path(cli.__file__).parent
    for path in [root / "core" / "commands.py", root / "core" / "config.py", root / "launch.py",
                 *(root / "procs").glob("*.py")]:
        text = path.read_text()
        assert not re.search(r"\"edgeinfer\.(cli|entry_points|launch|bench|sim|node|control|engines)[.:\w]*\"",
                             text), path

