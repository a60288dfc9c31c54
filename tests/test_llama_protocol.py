"""The llama-style model (engines/models/llama.py) against Hugging Face's LlamaForCausalLM with the same weights,
and speculative decoding of token-prefix models through the bring-your-own-model adapter."""
import numpy as np
import pytest
import torch

from edgeinfer.core.scheduler import SchedulerConfig, TickPlanner
from edgeinfer.core.speculative import speculative_decode
from edgeinfer.engines.models.llama import Llama, LlamaConfig, early_exit
from edgeinfer.engines.models.model_protocol import EngineDrafter, TorchModuleEngine
from edgeinfer.engines.peers.hf_peer import HfDecoder, peer_pair

pytestmark = pytest.mark.background  # CPU-bound, no real-time bound (tests/conftest.py)

LOGIT_ATOL = 1e-4


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # batch-1 passes; 2 threads on a busy 2-core machine stall on each op
    yield
    torch.set_num_threads(threads)


def _planner(k: int) -> TickPlanner:
    planner = TickPlanner(SchedulerConfig(k_max=k))
    planner.unlimited()
    return planner


def _prompts(n: int, vocab: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, rng.integers(1, 9)) for _ in range(n)]


def _hf_model(tie: bool = False):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    # initializer_range 0.1 rather than 0.02: N(0, 0.02) weights greedy-decode a constant token after a few steps
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=96,
                                      rms_norm_eps=1e-6, initializer_range=0.1, tie_word_embeddings=tie,
                                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("tie", [False, True])
def test_logits_match_hf(tie):
    hf = _hf_model(tie)
    ours = Llama.from_hf(hf)
    assert (ours.cfg.n_heads, ours.cfg.n_kv_heads) == (4, 2)  # grouped-query attention
    ids = torch.randint(0, 64, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = hf(ids).logits
        got = ours(ids)
        back = ours.to_hf()(ids).logits  # and back: our weights exported under HF names
        k, v = ours.empty_cache()  # cached: a 20-token prefill, then 1-token and 5-token passes
        cached = torch.cat([ours.step(None, ids[:1, a:b], torch.arange(a, b), k, v)
                            for a, b in ((0, 20), (20, 21), (21, 26))], dim=1)
    assert want.abs().max() > 1.0  # logits large enough that 1e-4 means something
    torch.testing.assert_close(got, want, rtol=0, atol=LOGIT_ATOL)
    torch.testing.assert_close(back, want, rtol=0, atol=LOGIT_ATOL)
    torch.testing.assert_close(cached, want[:1, :26], rtol=0, atol=LOGIT_ATOL)


def test_greedy_tokens_match_hf_generate():
    hf = _hf_model()
    engine = TorchModuleEngine(Llama.from_hf(hf))
    n_new = 40
    for prompt in _prompts(6, 64):
        ids = torch.as_tensor(prompt)[None]
        with torch.inference_mode():
            want = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n_new)
        res = speculative_decode(engine, prompt, n_new, None, _planner(0))
        assert res.tokens == want[0, len(prompt):].tolist(), f"prompt {prompt.tolist()}"
        assert len(set(res.tokens)) > 5  # not a degenerate constant continuation


def test_speculative_with_llama_draft_equals_target_greedy():
    """Target: 4-layer llama; draft: a 1-layer llama (the target's early exit), same vocab. k = 1..16."""
    target, draft = peer_pair()
    engine, drafter = TorchModuleEngine(target), EngineDrafter(TorchModuleEngine(draft))
    n_new = 40
    prompts = _prompts(3, target.cfg.vocab_size)
    greedy = [speculative_decode(engine, p, n_new, None, _planner(0)).tokens for p in prompts]
    drafted = accepted = 0
    for k in range(1, 17):
        for prompt, want in zip(prompts, greedy):
            drafter.start(prompt)
            res = speculative_decode(engine, prompt, n_new, drafter, _planner(k))
            assert res.complete and res.tokens == want, f"k={k}, prompt {prompt.tolist()}"
            drafted, accepted = drafted + res.drafted, accepted + res.accepted
    assert 0.2 < accepted / drafted < 1.0  # both the accept and the reject paths ran


def test_append_cache_adapter_matches_static():
    """HF's DynamicCache through the adapter (cache kind "append": truncated on rollback) passes the load
    self-test and decodes the same logits as our static cache, over passes that write junk then roll back;
    and speculative decoding with an appending target and an appending draft equals target-only greedy."""
    hf = _hf_model()
    ours = Llama.from_hf(hf)
    static, append = TorchModuleEngine(ours), TorchModuleEngine(HfDecoder(hf))
    assert (append.prefix_kind, append.cache_kind) == ("tokens", "append")
    for e in (static, append):  # both passed the load self-test (engines/models/protocol_check.py) by rounding only
        assert len(e.selftest_report.worst) == 4 and max(e.selftest_report.worst.values()) < 1e-5
    rng = np.random.default_rng(2)
    prompt = rng.integers(0, 64, 5)
    real = rng.integers(0, 64, 60).tolist()
    for e in (static, append):
        e.forward(prompt, real[:3], 0)
    n = 4
    while n < 50:
        t = int(rng.integers(1, 10))
        a = int(rng.integers(0, t + 1))
        fed = real[n - 1:n - 1 + a] + rng.integers(0, 64, t - a).tolist()
        got = [e.forward(None, fed, n) for e in (static, append)]
        np.testing.assert_allclose(got[1], got[0], rtol=0, atol=LOGIT_ATOL)
        for e in (static, append):
            e.rollback(n + a)
        n += a
    hf_draft = early_exit(ours, 1).to_hf()
    drafter = EngineDrafter(TorchModuleEngine(HfDecoder(hf_draft)))
    for k in (1, 3, 8):
        for prompt in _prompts(2, 64, seed=k):
            want = speculative_decode(static, prompt, 32, None, _planner(0)).tokens
            drafter.start(prompt)
            assert speculative_decode(append, prompt, 32, drafter, _planner(k)).tokens == want


def test_adapter_rejects_bad_kinds_and_empty_prompt():
    model = Llama(LlamaConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=16))
    with pytest.raises(ValueError, match="prefix kind"):
        TorchModuleEngine(model, prefix="image")
    with pytest.raises(ValueError, match="cache kind"):
        TorchModuleEngine(model, cache="paged")
    with pytest.raises(ValueError, match="truncate_cache"):
        TorchModuleEngine(model, cache="append")
    with pytest.raises(ValueError, match="prompt"):
        TorchModuleEngine(model).forward(np.array([], np.int64), (), 0)
    with pytest.raises(ValueError, match="n_kv_heads"):
        LlamaConfig(n_heads=4, n_kv_heads=3)


def test_compare_with_hf_assisted_smoke():
    """The peer comparison's plumbing on a tiny run (its timings mean nothing at this size)."""
    pytest.importorskip("transformers")
    from edgeinfer.engines.peers.hf_peer import compare_with_hf_assisted

    result = compare_with_hf_assisted(n_prompts=2, max_new_tokens=12, repeats=1, ks=(2, 3))
    rows = {r["name"]: r for r in result["rows"]}
    assert len(rows) == 5 and result["settings"]["all_exact"]
    for r in rows.values():
        assert set(r) >= {"name", "tokens_per_s", "target_passes_per_chunk", "acceptance_rate", "exact"}
        assert r["tokens_per_s"] > 0
    assert rows["edgeinfer target-only"]["target_passes_per_chunk"] == 12
    assert rows["transformers target-only"]["target_passes_per_chunk"] == 12
    k = result["settings"]["edgeinfer_k"]
    assert 0 < rows[f"edgeinfer speculative (k={k})"]["acceptance_rate"] <= 1
