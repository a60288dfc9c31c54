"""The Runtime seam (core/protocols.py): every runtime declares and satisfies the protocol, and the runtime node
(node/serve.py) serves each kind through it alone: the action-token policy, the null policy, a bring-your-own spec,
and a fault drill's wrapper around each."""
import inspect
import typing
from pathlib import Path

import numpy as np
import pytest
from test_serve import _next, _obs, node_and_peers  # noqa: F401  (the fixture)

from edgeinfer.core.protocols import Runtime
from edgeinfer.core.transport import send
from edgeinfer.core.wire import ActionChunk
from edgeinfer.node.faults import FaultConfig, NonFiniteRuntime, inject
from edgeinfer.node.runtime import NullRuntime, PolicyRuntime, RuntimeConfig

ROOT = Path(__file__).resolve().parents[1]
UR10_SPEC = ROOT / "launch" / "ur10_reach_policy.toml"
UR10_MODEL = ROOT.parent / "shared" / "data" / "ur10_reach_policy" / "policy.onnx"

# what serve.py and its handshake use of a runtime, and nothing else
MEMBERS = {"n_joints", "n_chunks", "engine_choice", "engine", "warmup_observation", "warmup", "chunk_timing",
           "set_budget_ms", "reset", "observe_costs", "step"}
METHODS = MEMBERS - {"n_joints", "n_chunks", "engine_choice", "engine"}
# a policy that is quick to open and to warm up: the torch engine, not backend auto's start-up measurement
POLICY = dict(backend="torch", warmup_chunks=3)


def _byo_runtime():
    if not UR10_MODEL.is_file():
        pytest.skip(f"UR10 policy not found at {UR10_MODEL}")
    pytest.importorskip("onnxruntime")
    from edgeinfer.engines.models.byo import ByoRuntime

    return ByoRuntime(UR10_SPEC)


MAKERS = {
    "null": lambda: NullRuntime(RuntimeConfig(null_policy=True)),
    "policy": lambda: PolicyRuntime(RuntimeConfig(**POLICY)),
    "byo": _byo_runtime,
}


def test_the_protocol_names_what_the_node_uses():
    declared = set(typing.get_type_hints(Runtime)) | {n for n, v in vars(Runtime).items()
                                                     if inspect.isfunction(v) and not n.startswith("_")}
    assert declared == MEMBERS


@pytest.mark.parametrize("kind", sorted(MAKERS))
@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "nonfinite"])
def test_every_runtime_declares_and_satisfies_the_protocol(kind, wrapped):
    runtime = MAKERS[kind]()
    if wrapped:
        runtime = NonFiniteRuntime(runtime, every=2)
    assert Runtime in type(runtime).__mro__  # declared, not only shaped alike
    assert isinstance(runtime, Runtime)
    for name in METHODS:  # implemented, not the protocol's empty body
        assert getattr(type(runtime), name) is not getattr(Runtime, name), name
        assert callable(getattr(runtime, name)), name
    assert runtime.n_joints is None or runtime.n_joints >= 1
    assert runtime.engine_choice is None  # only backend auto chooses
    assert (runtime.engine is not None) == (kind == "policy")
    inspect.signature(runtime.step).bind(_obs(0), None, 20_000_000, on_first_step=print)
    replan_every, step_ns = runtime.chunk_timing(4_000_000)
    assert replan_every >= 1 and step_ns > 0
    runtime.set_budget_ms(15.0)
    runtime.observe_costs(lambda name, ns: None)
    runtime.warmup(runtime.warmup_observation())
    assert runtime.n_chunks == 0
    obs = runtime.warmup_observation() or _obs(1)
    chunk = runtime.step(obs, None, step_ns)
    assert isinstance(chunk, ActionChunk) and chunk.steps_rad.shape[1] == len(obs.q_rad)
    assert runtime.n_chunks == 1
    runtime.reset()


def test_a_pass_delay_needs_a_target_engine():
    null = NullRuntime(RuntimeConfig(null_policy=True))
    with pytest.raises(ValueError, match="no target engine to slow"):
        inject(null, FaultConfig(fault_pass_delay_ms=1.0))


def _serve(node, obs_pub, chunks, n: int) -> list[ActionChunk]:
    """Every chunk the node publishes for n observations, one replan apart (a first step streamed ahead included)."""
    got = []
    for i in range(n):
        send(obs_pub, _obs(i * node.replan_every))
        for _ in range(20):
            node.step()
            while (chunk := _next(chunks, ActionChunk, 20)) is not None:
                got.append(chunk)
            if got and got[-1].obs_seq == i * node.replan_every:
                break
    return got


@pytest.mark.parametrize("cfg", [
    dict(null_policy=True),
    dict(POLICY),
    dict(POLICY, faults=FaultConfig(fault_pass_delay_ms=0.1, fault_nonfinite_every=2)),
    dict(byo_spec=UR10_SPEC),
], ids=["null", "policy", "policy-faults", "byo"])
def test_the_node_serves_each_kind_of_runtime(node_and_peers, cfg):  # noqa: F811
    if "byo_spec" in cfg:
        _byo_runtime()  # skips without the UR10 policy
    node, obs_pub, chunks = node_and_peers(RuntimeConfig(replan_every_ticks=1, **cfg))
    assert isinstance(node.runtime, Runtime)
    got = _serve(node, obs_pub, chunks, 3)
    assert {c.obs_seq for c in got} == {i * node.replan_every for i in range(3)}, got
    assert all(np.all(np.isfinite(c.steps_rad)) for c in got)  # a corrupted chunk goes out as the continue rung
    counters = node.telemetry.telemetry.counters
    assert counters.get("error.nonfinite_action", 0) == (1 if "faults" in cfg else 0)
    policy = "null_policy" not in cfg and "byo_spec" not in cfg
    # the planner's cost samples reach the node's histograms (observe_costs), from a policy runtime only
    assert any(name.startswith(("prefill.", "verify.")) for name in node.telemetry.telemetry.histograms) == policy
