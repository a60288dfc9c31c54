"""The torch and onnxruntime batched targets are batch-invariant on real held-out observations: a sequence's logits
are bit-identical whether its passes run alone or with others (2..n_slots per call, mixed positions, multi-token
verify passes), so its greedy tokens are too."""
import json
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.core.acceptance import Greedy
from edgeinfer.core.protocols import Pass
from edgeinfer.core.speculative import ChunkDecode
from edgeinfer.engines.backends.cache import EngineCache
from edgeinfer.engines.backends.torch_batched import TorchBatchedEngine
from edgeinfer.engines.backends.torch_engine import TorchEngine
from edgeinfer.engines.models.drafters import KinematicDrafter

pytestmark = pytest.mark.background  # CPU-bound, no real-time bound (tests/conftest.py)

N_SLOTS = 8
N_CHUNKS = 100
K_MAX = 8  # drafts per verify pass: with the last committed token, a pass fills max_pass = 9 places


@pytest.fixture(scope="module")
def observations(held_out):
    feats, _ = held_out
    return feats[np.random.default_rng(19).choice(len(feats), N_CHUNKS, replace=False)]


@pytest.fixture(scope="module")
def batched(policy, tmp_path_factory, one_torch_thread):
    """{backend: a BatchedEngine with N_SLOTS slots} for torch and (when installed) onnxruntime."""
    engines = {"torch": TorchBatchedEngine(policy.model, N_SLOTS)}
    if _has_onnxruntime():
        from edgeinfer.engines.backends.ort_batched import OrtBatchedEngine

        cache = EngineCache(tmp_path_factory.mktemp("engines"))
        engines["onnxruntime"] = OrtBatchedEngine.from_policy(policy, N_SLOTS, cache=cache, log=lambda line: None)
    return engines


def _has_onnxruntime() -> bool:
    try:
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        return False
    return True


def _chunk(policy, feats, robot: int) -> tuple[ChunkDecode, np.random.Generator]:
    """Robot `robot`'s greedy chunk decode (kinematic drafter) and the generator of its k per pass."""
    d = policy.cfg.n_joints
    drafter = KinematicDrafter(policy.tokenizer)
    q = np.zeros(d)
    drafter.reset(q, feats[d:2 * d], q - feats[2 * d:3 * d])
    return ChunkDecode(policy.normalise(feats), policy.cfg.n_tokens, drafter, Greedy()), np.random.default_rng(robot)


def _decode(engine, policy, observations, window_sizes) -> tuple[list, list, set]:
    """Decode every observation's chunk, robot i in slot i % N_SLOTS, robots in consecutive windows of sizes
    cycling through `window_sizes`; in a window robot j joins at call j (mixed positions) and leaves when done.
    Returns (tokens per robot, logits of each of its passes per robot, the batch sizes the calls had)."""
    tokens, logits, sizes = [None] * len(observations), [[] for _ in observations], set()
    first, w = 0, 0
    while first < len(observations):
        size = window_sizes[w % len(window_sizes)]
        robots = range(first, min(first + size, len(observations)))
        live = {}
        call = 0
        while call < len(robots) or live:
            if call < len(robots):
                live[robots[call]] = _chunk(policy, observations[robots[call]], robots[call])
            passes = [dec.next_pass(r % N_SLOTS, int(rng.integers(0, K_MAX + 1))) for r, (dec, rng) in live.items()]
            sizes.add(len(passes))
            for (r, (dec, _)), out in zip(list(live.items()), engine.forward_batch(passes)):
                logits[r].append(out)
                dec.commit(out)
                if dec.done:
                    tokens[r] = dec.res.tokens
                    del live[r]
            call += 1
        first, w = robots[-1] + 1, w + 1
    return tokens, logits, sizes


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_logits_do_not_depend_on_the_batch(policy, batched, observations, backend):
    if backend not in batched:
        pytest.skip("onnxruntime/onnxscript not installed")
    engine = batched[backend]
    alone_tokens, alone_logits, alone_sizes = _decode(engine, policy, observations, [1])
    tokens, logits, sizes = _decode(engine, policy, observations, list(range(2, N_SLOTS + 1)))
    assert alone_sizes == {1} and sizes == set(range(1, N_SLOTS + 1))  # every batch size 2..n_slots did occur
    assert tokens == alone_tokens
    for robot, (mine, ref) in enumerate(zip(logits, alone_logits)):
        assert len(mine) == len(ref) and all(np.array_equal(a, b) for a, b in zip(mine, ref)), f"robot {robot}"
    assert sum(len(passes) for passes in logits) < N_CHUNKS * policy.cfg.n_tokens  # verify passes did accept drafts


def test_tokens_match_single_sequence_torch(policy, batched, observations):
    """Against TorchEngine (batch 1, fp32; another shape, so other rounding): the same greedy tokens on this
    sample, logits within 1e-4."""
    single = TorchEngine(policy.model)
    tokens, logits, _ = _decode(batched["torch"], policy, observations[:20], list(range(2, N_SLOTS + 1)))
    worst = 0.0
    for robot, feats in enumerate(observations[:20]):
        obs, ref = policy.normalise(feats), []
        for n in range(policy.cfg.n_tokens):
            row = single.forward(obs, (), 0) if n == 0 else single.forward(None, (ref[-1],), n)
            ref.append(int(row[-1].argmax()))
        assert tokens[robot] == ref, f"robot {robot}"
        worst = max(worst, float(np.abs(logits[robot][0] - single.forward(obs, (), 0)).max()))
    assert worst < 1e-4


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_a_pass_longer_than_max_pass_runs_in_rounds(policy, batched, observations, backend):
    if backend not in batched:
        pytest.skip("onnxruntime/onnxscript not installed")
    engine, obs = batched[backend], policy.normalise(observations[:3])
    prefix = tuple(range(20))  # 21 positions: three rounds of max_pass = 9
    alone = engine.forward_batch([Pass(3, obs[0], prefix, 0)])[0]
    mixed = engine.forward_batch([Pass(1, obs[1], (), 0), Pass(3, obs[0], prefix, 0), Pass(5, obs[2], (4,), 0)])
    assert alone.shape == (21, policy.cfg.n_bins) and [m.shape[0] for m in mixed] == [1, 21, 2]
    assert np.array_equal(mixed[1], alone)
    np.testing.assert_allclose(alone, TorchEngine(policy.model).forward(obs[0], prefix, 0), atol=1e-4)


@pytest.mark.parametrize("bad, field", [
    (Pass(N_SLOTS, None, (1,), 3), "passes[1].slot=8"),
    (Pass(0, None, (1,), 3), "passes[1].slot=0"),  # the slot of passes[0]
    (Pass(2, None, (1, 2), 48), "do not fit seq_len=49"),
    (Pass(2, None, (64,), 3), "passes[1].tokens"),
    (Pass(2, None, (), 0), "passes[1].obs"),
])
def test_invalid_passes_are_refused_naming_the_field(policy, batched, bad, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        batched["torch"].forward_batch([Pass(0, None, (1,), 3), bad])


def test_batched_plan_is_cached_with_its_shape(policy, batched):
    if "onnxruntime" not in batched:
        pytest.skip("onnxruntime/onnxscript not installed")
    from edgeinfer.engines.backends.onnx_export_batched import GRAPH
    from edgeinfer.engines.backends.ort_batched import OrtBatchedEngine

    plan = Path(batched["onnxruntime"].plan["path"])
    fields = json.loads((plan.parent / "meta.json").read_text())["key_fields"]
    assert (fields["graph"], fields["n_slots"], fields["max_pass"]) == (GRAPH, N_SLOTS, 9)  # the shape is in the key
    again = OrtBatchedEngine.from_policy(policy, N_SLOTS, cache=EngineCache(plan.parents[1]), log=lambda line: None)
    assert again.plan["cached"] and again.plan["path"] == str(plan)
    with pytest.raises(ValueError, match="precision"):
        OrtBatchedEngine.from_policy(policy, N_SLOTS, precision="int8", cache=EngineCache(plan.parents[1]))


def test_open_batched_opens_torch_and_onnxruntime(policy, batched, monkeypatch):
    from edgeinfer.engines.backends.batched import open_batched

    engine = open_batched(policy, "torch", 3)
    assert isinstance(engine, TorchBatchedEngine) and (engine.backend, engine.n_slots) == ("torch", 3)
    if "onnxruntime" in batched:  # from the module's engine cache: no second export
        monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(Path(batched["onnxruntime"].plan["path"]).parents[1]))
        engine = open_batched(policy, "onnxruntime", N_SLOTS)
        assert (engine.backend, engine.n_slots, engine.plan["cached"]) == ("onnxruntime", N_SLOTS, True)
