"""Bring your own autoregressive policy through a factory manifest (engines/models/factory.py): the example llama-style
policy (examples/llama_policy/), trained here for a few steps on the embedded synthetic log, decodes
speculatively token for token as target-only, in-process and through `edgeinfer replay`; factories whose model
breaks the rollback contract are refused at load, naming the clause."""
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from edgeinfer.core.scheduler import SchedulerConfig
from edgeinfer.core.speculative import FixedK, speculative_decode
from edgeinfer.engines.models.drafters import make_drafter
from edgeinfer.engines.models.factory import PROBE_STATES, FactoryPolicy, probe_states
from edgeinfer.engines.models.model_protocol import TorchModuleEngine
from edgeinfer.engines.models.policy import load_policy
from edgeinfer.engines.models.protocol_check import ProtocolViolation, check_speculative
from edgeinfer.engines.models.served import load_served_policy
from edgeinfer.logs.arm_log import synthetic_log
from edgeinfer.node.controller import Controller, ControllerConfig
from edgeinfer.node.runtime import PolicyRuntime, RuntimeConfig
from edgeinfer.sim.schedule import observation_stream

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "llama_policy"
BROKEN = Path(__file__).resolve().parent / "factory_policies.py"
CONFIG = {"obs_dim": 18, "n_joints": 6, "horizon": 2, "stride_ticks": 5, "n_bins": 16}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> Path:
    """The example policy and its draft, trained 30 steps on the synthetic log (examples/llama_policy/train.py)."""
    spec = importlib.util.spec_from_file_location("llama_policy_train", EXAMPLE / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    return train.train(tmp_path_factory.mktemp("llama_policy"), data=None, steps=30, batch_size=64, threads=1)


@pytest.fixture(scope="module")
def held_out():
    """Observations of a synthetic log the policy never trained on (another seed), as the replayer sends them."""
    stream = observation_stream(synthetic_log(seconds=2.0, seed=5), stride=5)
    return [stream[i] for i in (40, 160, 300, 420)]


def _write(tmp_path: Path, factory: str, **extra) -> Path:
    """A manifest in tmp_path, with a copy of tests/factory_policies.py beside it (a factory's module is inside
    the manifest's folder)."""
    shutil.copyfile(BROKEN, tmp_path / BROKEN.name)
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"schema": "edgeinfer.policy/1", "factory": factory, "config": CONFIG,
                                "control_rate_hz": 250.0, **extra}))
    return path


def test_factory_policy_decodes_speculatively_as_target_only(manifest, held_out):
    policy = load_served_policy(manifest, trust_code=True)
    assert isinstance(policy, FactoryPolicy) and policy.drafters == ("kinematic", "model")
    engine = policy.open_engine()  # the load checks pass
    assert max(engine.selftest_report.worst.values()) < 1e-5
    drafters = {name: make_drafter(name, policy) for name in policy.drafters}
    drafted = accepted = 0
    for obs in held_out:
        feats = policy.features(obs.q_rad, obs.qd_rad_s, obs.q_prev_rad)
        want = speculative_decode(engine, feats, 48, None, FixedK(0))
        assert want.complete and want.target_passes == 48
        for drafter in drafters.values():
            for k in (1, 4, 16):
                drafter.reset(obs.q_rad, obs.qd_rad_s, obs.q_prev_rad)
                got = speculative_decode(engine, feats, 48, drafter, FixedK(k))
                assert got.tokens == want.tokens, (drafter.name, k)
                drafted, accepted = drafted + got.drafted, accepted + got.accepted
    assert 0 < accepted < drafted  # passes that kept drafts and passes that rolled rejected ones back


def test_runtime_and_controller_serve_a_factory_policy(manifest, held_out):
    """The one loading path: the runtime's chunks are the same, speculative or target-only, full and token-exact."""
    runs = {}
    for decode in ("speculative", "target-only"):
        rt = PolicyRuntime(RuntimeConfig(policy=manifest, trust_policy_code=True, decode=decode, drafter="auto",
                                         warmup_chunks=0, scheduler=SchedulerConfig(adaptive=False, k_max=4)))
        assert list(rt.drafters) == (["kinematic", "model"] if decode == "speculative" else [])
        runs[decode] = [rt.step(obs, budget=False) for obs in held_out]
    for spec, ref in zip(runs["speculative"], runs["target-only"]):
        assert spec.rung == ref.rung == "full" and spec.tokens == ref.tokens == 48
        np.testing.assert_array_equal(spec.steps_rad, ref.steps_rad)
        assert ref.target_passes == 48 and spec.target_passes <= 48
    assert sum(c.target_passes for c in runs["speculative"]) < 48 * len(held_out)  # drafts were kept
    runtime = RuntimeConfig(policy=manifest, trust_policy_code=True, warmup_chunks=1)
    with Controller(ControllerConfig(runtime=runtime)) as ctl:
        assert ctl.runtime.policy.cfg.n_joints == 6


def test_factory_breaking_rollback_is_refused_at_load(tmp_path):
    path = _write(tmp_path, f"{BROKEN.name}:recurrent")
    policy = load_served_policy(path, trust_code=True)  # built, not yet checked
    with pytest.raises(ProtocolViolation, match=r"RecurrentPolicy breaks the model protocol \(rollback\)") as err:
        policy.open_engine()
    assert err.value.clause == "rollback"
    with pytest.raises(ProtocolViolation, match=r"\(rollback\)"):  # the runtime (serve, replay, hil, launch)
        PolicyRuntime(RuntimeConfig(policy=path, trust_policy_code=True))
    with pytest.raises(ProtocolViolation, match=r"\(rollback\)"):  # the embedded Controller
        Controller(ControllerConfig(runtime=RuntimeConfig(policy=path, trust_policy_code=True))).open()


@pytest.mark.parametrize("factory, position", [("late_stale_cache", 8), ("sliding_window_cache", 2)])
def test_caches_that_break_late_in_the_chunk_are_refused_by_the_self_test(tmp_path, factory, position):
    """A cache that keeps rejected drafts only from position 7 on, and a rotating (sliding-window) cache, decode
    exactly over the 6 tokens a short probe covered; the self-test decodes the whole chunk (12 tokens) with
    rejected drafts and names the clause and the position."""
    policy = load_served_policy(_write(tmp_path, f"{BROKEN.name}:{factory}"), trust_code=True)
    with pytest.raises(ProtocolViolation, match=r"breaks the model protocol \(rollback\): rollback\(p\) did not "
                                                rf"forget positions >= p .* decoding 12 tokens .* engine position "
                                                rf"{position} differ") as err:
        policy.open_engine()
    assert err.value.clause == "rollback"


def test_the_speculative_check_decodes_whole_chunks_against_target_only(tmp_path):
    """The check after the self-test: with the self-test skipped, a late stale cache commits another token than
    target-only decoding, named with the drafter, the probe observation and the token."""
    policy = load_served_policy(_write(tmp_path, f"{BROKEN.name}:late_stale_cache"), trust_code=True)
    engine = TorchModuleEngine(policy.model, selftest=False)
    cases = [(policy.features(*s), s) for s in probe_states(policy, PROBE_STATES)]
    with pytest.raises(ProtocolViolation, match=r"LateStaleCache breaks the model protocol \(speculative\): with the "
                                                r"\w+ drafter \(k=4\) on probe observation \d, speculative decoding "
                                                r"commits \[\d+\] as token \d+, target-only") as err:
        check_speculative(engine, cases, policy.cfg.n_tokens, {"kinematic": make_drafter("kinematic", policy)})
    assert err.value.clause == "speculative"
    assert PROBE_STATES == 3


def test_manifest_errors_name_the_file_and_key(tmp_path, manifest):
    with pytest.raises(ValueError, match=r"factory must be 'file.py:function'"):
        load_served_policy(_write(tmp_path, "no_function_here"), trust_code=True)
    with pytest.raises(ValueError, match=r"has no function 'nope'"):
        load_served_policy(_write(tmp_path, f"{BROKEN.name}:nope"), trust_code=True)
    with pytest.raises(ValueError, match=r"manifest.json: config.n_bins must be >= 2, got 1"):
        path = _write(tmp_path, f"{BROKEN.name}:recurrent")
        path.write_text(path.read_text().replace('"n_bins": 16', '"n_bins": 1'))
        load_served_policy(path, trust_code=True)
    good = json.loads(manifest.read_text())
    for name in ("target.pt", "draft.pt", "policy.py"):
        shutil.copy(manifest.parent / name, tmp_path / name)
    (tmp_path / "bad.json").write_text(json.dumps(good | {"config": good["config"] | {"n_bins": 16}}))
    with pytest.raises(ValueError, match=r"bad.json: factory policy.py:build returned a tokenizer with "
                                         r"\{'n_bins': 64, 'n_joints': 6\} .*config has "
                                         r"\{'n_bins': 16, 'n_joints': 6\}"):
        load_served_policy(tmp_path / "bad.json", trust_code=True)
    (tmp_path / "bad.json").write_text(json.dumps(good | {"sha256": "0" * 64}))
    with pytest.raises(ValueError, match=r"target.pt: sha256 .* does not match the manifest's 0000"):
        load_served_policy(tmp_path / "bad.json", trust_code=True)
    with pytest.raises(ValueError, match=r"is a factory policy .* takes the built-in policy only"):
        load_policy(manifest)  # build, distill, the benches
    with pytest.raises(ValueError, match=r"drafter 'early-exit' does not apply to this policy"):
        make_drafter("early-exit", load_served_policy(manifest, trust_code=True))


def test_module_factory_and_safetensors_weights(tmp_path, manifest):
    """"module:function" imports module.py of the manifest's folder by its path (sys.path untouched); .safetensors
    weights load as the .pt ones."""
    st = pytest.importorskip("safetensors.torch")
    shutil.copy(EXAMPLE / "policy.py", tmp_path / "llama_example_policy.py")
    m = json.loads(manifest.read_text())
    state = torch.load(manifest.parent / "target.pt", weights_only=True)
    st.save_file(state, tmp_path / "target.safetensors")
    sha = __import__("hashlib").sha256((tmp_path / "target.safetensors").read_bytes()).hexdigest()
    m |= {"factory": "llama_example_policy:build", "weights": "target.safetensors", "sha256": sha}
    del m["draft"]
    (tmp_path / "m.json").write_text(json.dumps(m))
    path_before = list(sys.path)
    policy = load_served_policy(tmp_path / "m.json", trust_code=True)
    assert sys.path == path_before and policy.drafters == ("kinematic",)
    for name, value in policy.model.state_dict().items():
        torch.testing.assert_close(value, state[name], rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("decode, drafter", [("speculative", "kinematic"), ("speculative", "model"),
                                             ("target-only", "kinematic")])
def test_replay_serves_the_factory_policy_token_exact(manifest, tmp_path, decode, drafter):
    """`edgeinfer replay --policy <factory manifest>` with real processes: every token a chunk it received holds as
    verified is the target-only greedy token of its observation (run.mcap's chunks against an in-process decode).
    A 500 ms budget: whole chunks on a loaded host (latency is not what is tested)."""
    mcap_reader = pytest.importorskip("mcap.reader")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "edgeinfer", "replay", "--policy", str(manifest),
                           "--trust-policy-code", "--decode", decode,
                           "--drafter", drafter, "--duration-s", "2", "--adaptive", "false", "--k-max", "4",
                           "--budget-ms", "500", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["decode"] == decode and report["observations_sent"] == 500
    rungs = report["chunks"]["rungs"]
    assert set(rungs) <= {"full", "partial", "draft", "continue"} and rungs.get("full", 0) >= 5
    spec = report["spec"]
    if decode == "target-only":
        assert spec["tokens_per_target_pass"] == 1.0 and spec["acceptance_rate"] is None
    else:
        assert spec["tokens_per_target_pass"] > 1.0 and 0 < spec["acceptance_rate"] <= 1
    policy = load_served_policy(manifest, trust_code=True)
    engine = policy.open_engine()
    stream = observation_stream(synthetic_log(seconds=3.0), stride=5)
    chunks = tokens = 0
    with open(out / "run.mcap", "rb") as f:
        for _, _, message in mcap_reader.make_reader(f).iter_messages(topics=["/action_chunk"]):
            chunk = json.loads(message.data)
            obs = stream[chunk["row"]]
            want = speculative_decode(engine, policy.features(obs.q_rad, obs.qd_rad_s, obs.q_prev_rad), 48, None,
                                      FixedK(0)).tokens
            steps = np.array([s["q_rad"] for s in chunk["steps"]])[1:] - obs.q_rad  # (steps, 6) offsets
            # offset (h, j) is the sum of joint j's tokens of steps 0..h: it holds verified tokens only while
            # h * 6 + j < the chunk's verified token count (a draft rung's are drafted after those)
            offsets = policy.tokenizer.decode(np.array(want))[:len(steps)]
            verified = (np.arange(offsets.size) < chunk["tokens"]).reshape(offsets.shape)
            np.testing.assert_allclose(steps[verified], offsets[verified], rtol=0, atol=1e-9)
            assert chunk["rung"] != "full" or (chunk["tokens"] == 48 and len(steps) == 8)
            chunks, tokens = chunks + 1, tokens + int(verified.sum())
    assert chunks == report["chunks"]["received"] and tokens >= 5 * 48


@pytest.mark.slow
def test_replay_refuses_a_factory_breaking_rollback_at_start_up(tmp_path):
    path = _write(tmp_path, f"{BROKEN.name}:recurrent")
    proc = subprocess.run([sys.executable, "-m", "edgeinfer", "replay", "--policy", str(path), "--trust-policy-code",
                           "--duration-s", "1",
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "runtime process exited with code 2 during start-up" in proc.stderr
    assert "RecurrentPolicy breaks the model protocol (rollback)" in proc.stderr
