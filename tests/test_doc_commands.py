"""Every command block of README.md and docs/*.md runs as written on a fresh clone: the cheap ones
here, the long ones by `python scripts/doc_commands.py --long` with their smallest documented options (not in
CI: about 25 min), the rest listed with where they are checked instead."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("doc_commands", ROOT / "scripts" / "doc_commands.py")
doc_commands = importlib.util.module_from_spec(_spec)
sys.modules["doc_commands"] = doc_commands
_spec.loader.exec_module(doc_commands)


def test_blocks_are_read_as_the_shell_reads_them():
    page = ("intro\n```bash\nedgeinfer a --x 1 \\\n    --y \"p#q\"   # a comment\n# only a comment\nedgeinfer b\n```\n"
            "```toml\n[replay]\n```\n```\nedgeinfer c   # untagged, but commands\n```\n```\nnot a command\n```\n")
    assert [c.text for c in doc_commands.commands("x.md", page)] == ['edgeinfer a --x 1 --y "p#q"', "edgeinfer b",
                                                                     "edgeinfer c"]


def test_every_documented_command_is_run_here_or_says_where_it_is():
    found = doc_commands.every_command()
    assert len(found) >= 40  # README and the guides: the extraction found them
    unknown = [f"{c.page}:{c.line}: {c.text}" for c in found if c.text not in
               doc_commands.CHEAP | set(doc_commands.LONG) | set(doc_commands.ELSEWHERE)]
    assert not unknown, "commands in the docs that scripts/doc_commands.py does not classify:\n" + "\n".join(unknown)
    texts = {c.text for c in found}
    stale = [t for t in (*doc_commands.CHEAP, *doc_commands.LONG, *doc_commands.ELSEWHERE) if t not in texts]
    assert not stale, f"classified but no longer in the docs: {stale}"
    tiers = [doc_commands.CHEAP, set(doc_commands.LONG), set(doc_commands.ELSEWHERE)]
    assert sum(len(t) for t in tiers) == len(set().union(*tiers))  # each command in one tier
    assert all(why for _, why in doc_commands.LONG.values()) and all(doc_commands.ELSEWHERE.values())
    assert set(doc_commands.VERDICT_EXIT) <= set(doc_commands.LONG)


@pytest.mark.slow
def test_cheap_commands_run_as_written_on_a_fresh_clone(tmp_path):
    clone = doc_commands.make_clone(tmp_path)
    results = doc_commands.run(clone, say=lambda text: None, timeout_s=300)
    ran = [r for r in results if r["ran"]]
    failed = [f"{r['page']}: {r['ran']}: exit {r['returncode']}\n{r['output']}" for r in ran if not r["ok"]]
    assert not failed, "\n".join(failed)
    assert {r["command"] for r in ran} == doc_commands.CHEAP  # each once
    report = json.loads((clone / "out" / "spec" / "report.json").read_text()) if (
        ROOT.parent / "shared" / "data" / "schunk_lwa4p").is_dir() else None
    if report is not None:  # the main job on the real log
        assert report["observations_sent"] == 937
    assert "[replay]" in (clone / "my_replay.toml").read_text()
    assert (tmp_path / "home" / ".edgeinfer" / "keys").is_dir()
