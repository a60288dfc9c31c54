"""The trust model of policy folders (engines/models/factory.py, engines/models/weights_io.py): a factory
manifest is code and runs only with the opt-in (RuntimeConfig.trust_policy_code, `--trust-policy-code`); its
module stays inside the manifest's folder and is imported by file path (sys.path untouched); weights are capped,
read once, and loaded from the bytes hashed. Each attack is refused by name."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from edgeinfer.engines.models import weights_io
from edgeinfer.engines.models.factory import PolicyCodeRefused, import_factory
from edgeinfer.engines.models.paths import DEFAULT_POLICY, MAX_WEIGHTS_MB
from edgeinfer.engines.models.policy import load_policy
from edgeinfer.engines.models.served import load_served_policy
from edgeinfer.engines.models.weights_io import inside, load_state_dict, read_checked
from edgeinfer.node.runtime import PolicyRuntime, RuntimeConfig

BROKEN = Path(__file__).resolve().parent / "factory_policies.py"
CONFIG = {"obs_dim": 18, "n_joints": 6, "horizon": 2, "stride_ticks": 5, "n_bins": 16}
# the file a test factory writes when its module runs (the json it imported): the side effect the opt-in guards
RAN = "ran.txt"


def _folder(tmp_path: Path, factory: str = "policy.py:recurrent", **extra) -> Path:
    """A policy folder: factory_policies.py, policy.py (writes RAN when run, then gives factory_policies'
    recurrent) and manifest.json naming `factory`."""
    shutil.copyfile(BROKEN, tmp_path / BROKEN.name)
    (tmp_path / "policy.py").write_text(
        "from pathlib import Path\nimport importlib.util, json\n"
        f"Path(__file__).with_name('{RAN}').write_text(json.__file__)  # which json it imported\n"
        "spec = importlib.util.spec_from_file_location('_fp', Path(__file__).with_name('factory_policies.py'))\n"
        "fp = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(fp)\nrecurrent = fp.recurrent\n")
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"schema": "edgeinfer.policy/1", "factory": factory, "config": CONFIG, **extra}))
    return path


def test_a_factory_manifest_runs_no_code_without_the_opt_in(tmp_path):
    path = _folder(tmp_path)
    for load in (lambda: load_served_policy(path), lambda: PolicyRuntime(RuntimeConfig(policy=path))):
        with pytest.raises(PolicyCodeRefused, match=rf"{path}: a factory manifest is code: loading it runs its "
                                                    r"factory 'policy.py:recurrent' .* pass --trust-policy-code"):
            load()
        assert not (tmp_path / RAN).exists()  # refused before importing anything
    assert RuntimeConfig().trust_policy_code is False
    policy = load_served_policy(path, trust_code=True)
    assert policy.cfg.n_tokens == 12 and (tmp_path / RAN).exists()


def test_the_cli_flag_opts_in(tmp_path):
    """`edgeinfer replay --policy <factory manifest>`: refused at start-up without the flag (exit 2, the message
    names the manifest and the flag); with --trust-policy-code the factory runs (its module writes RAN)."""
    path = _folder(tmp_path)
    cmd = [sys.executable, "-m", "edgeinfer", "replay", "--policy", str(path), "--duration-s", "1",
           "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "pass --trust-policy-code" in proc.stderr and str(path) in proc.stderr
    assert not (tmp_path / RAN).exists()
    proc = subprocess.run(cmd + ["--trust-policy-code"], capture_output=True, text=True, timeout=300)
    assert (tmp_path / RAN).exists()  # it ran (and was then refused by its load self-test: a recurrent state)
    assert proc.returncode == 2 and "RecurrentPolicy breaks the model protocol (rollback)" in proc.stderr


@pytest.mark.parametrize("factory, match", [
    ("../policy.py:recurrent", r"must be a path inside the manifest's folder .*no '\.\.'"),
    ("sub/../../policy.py:recurrent", r"must be a path inside the manifest's folder .*no '\.\.'"),
    ("{abs}:recurrent", r"must be a path inside the manifest's folder .*no absolute path"),
    ("link.py:recurrent", r"'link.py' resolves to .*outside the manifest's folder"),
    ("os.path:join", r"factory 'os.path:join': module .*os/path.py not found"),
])
def test_a_factory_module_outside_the_folder_is_refused(tmp_path, factory, match):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    _folder(outside)
    folder = tmp_path / "policy"
    folder.mkdir()
    (folder / "link.py").symlink_to(outside / "policy.py")
    path = _folder(folder, factory.format(abs=outside / "policy.py"))
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        load_served_policy(path, trust_code=True)
    assert not (outside / RAN).exists()


def test_a_module_in_the_folder_cannot_shadow_the_standard_library(tmp_path):
    """json.py beside the factory (and "module:function" names) are imported by file path: the factory's
    `import json` is the standard library's, and sys.path is as before."""
    path = _folder(tmp_path, "policy:recurrent")  # "module:function": policy.py of the folder
    (tmp_path / "json.py").write_text("raise SystemExit('the stdlib was shadowed')\n")
    before = list(sys.path)
    load_served_policy(path, trust_code=True)
    assert sys.path == before
    assert Path((tmp_path / RAN).read_text()) == Path(json.__file__)
    assert str(tmp_path.resolve()) not in sys.path


def _weights(tmp_path: Path, n_mb: float = 0.0) -> tuple[Path, str]:
    state = {"w": torch.arange(max(1, int(n_mb * 1e6 / 4)), dtype=torch.float32)}
    torch.save(state, tmp_path / "w.pt")
    return tmp_path / "w.pt", hashlib.sha256((tmp_path / "w.pt").read_bytes()).hexdigest()


def test_weights_must_be_a_regular_file_inside_the_folder(tmp_path):
    with pytest.raises(ValueError, match=r"/dev/zero: not a regular file"):
        read_checked(Path("/dev/zero"), "0" * 64)  # would grow memory to MemoryError if read whole
    (tmp_path / "zero.pt").symlink_to("/dev/zero")
    with pytest.raises(ValueError, match=r"weights: 'zero.pt' resolves to /dev/zero, outside the manifest's folder"):
        inside(tmp_path, "zero.pt", "weights")
    os.mkfifo(tmp_path / "fifo.pt")
    with pytest.raises(ValueError, match=r"fifo.pt: not a regular file"):
        read_checked(tmp_path / "fifo.pt", "0" * 64)
    path = _folder(tmp_path, weights="/dev/zero", sha256="0" * 64)
    with pytest.raises(ValueError, match=rf"{path}: weights: '/dev/zero' must be a path inside the manifest's"):
        load_served_policy(path, trust_code=True)


def test_weights_over_the_cap_are_refused_on_stat_and_while_read(tmp_path, monkeypatch):
    path, sha = _weights(tmp_path, n_mb=2.0)
    assert set(load_state_dict(path, sha, max_mb=3.0)) == {"w"}
    with pytest.raises(ValueError, match=r"w.pt: 2.0 MB, over the weights cap of 1 MB"):
        read_checked(path, sha, max_mb=1.0)
    real_fstat = os.fstat

    def growing(fd):  # the file was small when stat'ed and grew before it was read
        st = real_fstat(fd)
        return os.stat_result((*st[:6], 0, *st[7:]))
    monkeypatch.setattr(weights_io.os, "fstat", growing)
    with pytest.raises(ValueError, match=r"w.pt: over the weights cap of 1 MB while read"):
        read_checked(path, sha, max_mb=1.0)
    assert MAX_WEIGHTS_MB * 1e6 > 50 * (DEFAULT_POLICY.parent / "schunk_large_target.pt").stat().st_size


def test_weights_are_hashed_and_loaded_from_the_same_bytes(tmp_path, monkeypatch):
    """One open of the file; torch.load gets the bytes hashed, never the path (no check-to-use gap)."""
    path, sha = _weights(tmp_path)
    opened, loaded_from = [], []
    real_open, real_load = os.open, torch.load
    monkeypatch.setattr(weights_io.os, "open", lambda p, *a: opened.append(p) or real_open(p, *a))
    monkeypatch.setattr(weights_io.torch, "load", lambda f, **kw: loaded_from.append(f) or real_load(f, **kw))
    state = load_state_dict(path, sha)
    assert opened == [path] and len(loaded_from) == 1 and not isinstance(loaded_from[0], (str, Path))
    assert torch.equal(state["w"], torch.zeros(1))
    with pytest.raises(ValueError, match=r"w.pt: sha256 [0-9a-f]{64} does not match the manifest's 00"):
        load_state_dict(path, "0" * 64)


def test_the_built_in_policy_loads_through_the_same_reader(tmp_path):
    policy = load_policy(DEFAULT_POLICY)
    assert policy.cfg.n_tokens == 48
    with pytest.raises(ValueError, match=r"schunk_target.pt: 0.5 MB, over the weights cap of 0.1 MB"):
        load_policy(DEFAULT_POLICY, max_weights_mb=0.1)
    manifest = json.loads(DEFAULT_POLICY.read_text()) | {"weights": f"../{DEFAULT_POLICY.parent.name}/x.pt"}
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"weights: '\.\./weights/x.pt' must be a path inside the manifest's"):
        load_policy(tmp_path / "m.json")


def test_import_factory_reads_a_file_once_under_a_private_name(tmp_path):
    (tmp_path / "mod.py").write_text("CALLS = []\ndef build(*a):\n    CALLS.append(a)\n    return len(CALLS)\n")
    fn = import_factory("mod.py:build", tmp_path)
    assert fn is import_factory("mod:build", tmp_path) and fn.__module__.startswith("_edgeinfer_factory_")
    assert "mod" not in sys.modules
