"""The architecture holds: the import-linter layers contract in pyproject.toml, and no import cycle between any
two modules (a cycle inside one layer is as hard to read as one across layers)."""
import graphlib
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_layers_contract_in_pyproject_is_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        pytest.skip("import-linter is not installed (it comes with the test extra)")
    result = subprocess.run([str(lint), "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "1 kept, 0 broken" in result.stdout


def test_no_module_imports_another_in_a_cycle():
    graph = grimp.build_graph("edgeinfer")
    imports = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    try:
        graphlib.TopologicalSorter(imports).prepare()
    except graphlib.CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")


def test_the_graph_sees_every_subpackage():
    # engines/, control/ and sim/ are linked into edgeinfer/ so that tools see them (a package-dir mapping hid
    # them); without the links the contract above would pass on a third of the code
    graph = grimp.build_graph("edgeinfer")
    for sub in ("core", "logs", "engines", "control", "node", "procs", "sim", "bench"):
        assert graph.find_children(f"edgeinfer.{sub}"), sub
    assert "edgeinfer.engines.models.policy" in graph.modules
