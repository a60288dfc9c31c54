"""KV-cache correctness, property-based: any interleaving of passes (1..17 tokens, i.e. k up to 16 drafts),
rejections at every position and rollbacks gives the logits of a cache-free forward over the same tokens.

Each engine runs a random program (hypothesis draws its structure, a seeded numpy generator the tokens):
    pass(t, a)    feed t tokens at positions n..n+t-1: the first a are the real sequence's, the rest junk
                  (a rejected draft); check every row against the cache-free forward of exactly those
                  tokens; then commit the a real ones: rollback(n + a) (skipped half the time: the caches
                  here are written by position, so re-feeding real tokens at those positions rolls back)
    rollback(m)   forget positions >= m (m <= n)
    prefill(j)    a new prefix (observation or prompt) and j tokens at position 0..j: the old cache is stale
Engines: (a) the default policy through TorchEngine, (b) through OrtEngine (explicit KV inputs/outputs),
(c) a llama-style model through the bring-your-own-model adapter, (d) the default policy's module through
the adapter, static and functional, (e) the default policy through FusedEngine (numba).
"""
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgeinfer.engines.backends.fused_engine import FusedEngine
from edgeinfer.engines.backends.torch_engine import TorchEngine
from edgeinfer.engines.models.llama import Llama, LlamaConfig
from edgeinfer.engines.models.model_protocol import TorchModuleEngine

pytestmark = pytest.mark.background  # CPU-bound, no real-time bound (tests/conftest.py)

MAX_PASS = 17
ATOL = RTOL = 1e-4


@dataclass
class Case:
    """engine; n_positions: engine positions 0..n_positions-1; vocab; new_prefix(rng) -> prefix;
    reference(prefix, tokens) -> logits (1 + len(tokens), vocab): row p for engine position p."""

    engine: object
    n_positions: int
    vocab: int
    new_prefix: Callable[[np.random.Generator], np.ndarray]
    reference: Callable[[np.ndarray, list[int]], np.ndarray]


def _policy_case(policy, engine) -> Case:
    model, cfg = policy.model, policy.cfg

    @torch.inference_mode()
    def reference(obs, tokens):
        return model(torch.as_tensor(obs)[None], torch.tensor([tokens], dtype=torch.long))[0].numpy()

    return Case(engine, cfg.seq_len, cfg.n_bins, lambda rng: rng.standard_normal(cfg.obs_dim).astype(np.float32),
                reference)


def _llama_case() -> Case:
    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=48, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96,
                              max_seq_len=72)).eval()
    with torch.no_grad():  # larger than the N(0, 0.02) init, so that a stale cache entry moves the logits a lot
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.normal_(0, 0.1)
    max_prompt = 6

    @torch.inference_mode()
    def reference(prompt, tokens):
        ids = [*prompt.tolist(), *tokens]
        return model(torch.tensor([ids]))[0, len(prompt) - 1:].numpy()

    # engine positions: the prompt is position 0, so a prompt of P tokens leaves max_seq_len - P + 1
    return Case(TorchModuleEngine(model), model.cfg.max_seq_len - max_prompt + 1, model.cfg.vocab_size,
                lambda rng: rng.integers(0, 48, rng.integers(1, max_prompt + 1)), reference)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Batch-1 passes on 1 torch thread, as the engines run (TorchEngine.from_policy): with 2 threads on a
    busy 2-core machine, each small op can wait milliseconds for the second thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def cases(policy):
    """name -> Case, built once."""
    return {"torch": _policy_case(policy, TorchEngine(policy.model)),
            "llama-adapter": _llama_case(),
            "policy-adapter-static": _policy_case(policy, TorchModuleEngine(policy.model, "obs", "static")),
            "policy-adapter-functional": _policy_case(policy, TorchModuleEngine(
                policy.model, "obs", "functional", step_kwargs={"inplace": False})),
            "fused": _policy_case(policy, FusedEngine(policy.model))}


@pytest.fixture(scope="module")
def ort_case(policy, tmp_path_factory):
    """The onnxruntime engine, exported once (a few seconds) into a temporary engine cache."""
    for lib in ("onnxruntime", "onnx", "onnxscript"):
        pytest.importorskip(lib)
    from edgeinfer.engines.backends.cache import EngineCache
    from edgeinfer.engines.backends.ort_engine import OrtEngine

    cache = EngineCache(tmp_path_factory.mktemp("engines"))
    return _policy_case(policy, OrtEngine.from_policy(policy, cache=cache, log=lambda line: None))


def _check(case: Case, got: np.ndarray, prefix, seq: list[int], start: int, what: str) -> None:
    """got: rows of engine positions start.. after feeding seq (tokens at positions 1..len(seq))."""
    want = case.reference(prefix, seq)[start:start + len(got)]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=what)


def _run_program(case: Case, data) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    e, n_pos, vocab = case.engine, case.n_positions, case.vocab

    def prefill():
        prefix = case.new_prefix(rng)
        real = rng.integers(0, vocab, n_pos - 1).tolist()  # the token at engine position p >= 1 is real[p - 1]
        j = data.draw(st.integers(0, MAX_PASS - 1), label="prefill tokens")
        _check(case, e.forward(prefix, real[:j], 0), prefix, real[:j], 0, f"prefill + {j}")
        return prefix, real, 1 + j

    prefix, real, n = prefill()  # positions < n hold the real sequence
    for _ in range(data.draw(st.integers(1, 24), label="ops")):
        op = data.draw(st.sampled_from(["pass"] * 6 + ["rollback", "prefill"]), label="op")
        if op == "prefill":
            prefix, real, n = prefill()
        elif op == "rollback" or n == n_pos:
            m = data.draw(st.integers(1, n), label="rollback to")
            e.rollback(m)
            n = m
        else:
            t = data.draw(st.integers(1, min(MAX_PASS, n_pos - n)), label="pass length")
            a = data.draw(st.integers(0, t), label="real tokens")
            junk = [(x + int(rng.integers(1, vocab))) % vocab for x in real[n - 1 + a:n - 1 + t]]  # != real
            seq = real[:n - 1 + a] + junk
            _check(case, e.forward(None, seq[n - 1:], n), prefix, seq, n, f"pass of {t} at {n}, {a} real")
            if data.draw(st.booleans(), label="call rollback"):
                e.rollback(n + a)
            n += a


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("name", ["torch", "llama-adapter", "policy-adapter-static", "policy-adapter-functional",
                                  "fused"])
@SETTINGS
@given(data=st.data())
def test_cache_equals_cache_free_forward(cases, name, data):
    _run_program(cases[name], data)


@SETTINGS
@given(data=st.data())
def test_onnxruntime_cache_equals_cache_free_forward(ort_case, data):
    _run_program(ort_case, data)
