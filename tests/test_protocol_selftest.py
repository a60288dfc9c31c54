"""The load-time self-test of bring-your-own models (engines/models/protocol_check.py): small torch modules that break
the model protocol in one way each are refused with the clause they break; conforming ones load, and
decode speculatively token for token as target-only."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from edgeinfer.core.scheduler import SchedulerConfig, TickPlanner
from edgeinfer.core.speculative import speculative_decode
from edgeinfer.engines.models.llama import Llama, LlamaConfig
from edgeinfer.engines.models.model_protocol import EngineDrafter, TorchModuleEngine
from edgeinfer.engines.models.protocol_check import ProtocolViolation, self_test

VOCAB, D = 32, 32
CLAUSES = {"fresh cache", "multi-token pass", "rollback", "prefill"}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _init(module: nn.Module, seed: int) -> nn.Module:
    """N(0, 0.3) weights: logits that a stale cache entry moves visibly. Eval mode."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.3)
    return module.eval()


class TinyAttention(nn.Module):
    """One attention layer over token ids with an append cache (k, v), each (B, S, D), cut by truncate_cache:
    conforming."""

    prefix_kind, cache_kind = "tokens", "append"

    def __init__(self, seed: int = 0):
        super().__init__()
        self.emb, self.pos = nn.Embedding(VOCAB, D), nn.Embedding(64, D)
        self.qkv, self.head = nn.Linear(D, 3 * D), nn.Linear(D, VOCAB)
        _init(self, seed)

    def empty_cache(self, batch, dtype, device):
        z = torch.zeros(batch, 0, D, dtype=dtype, device=device)
        return z, z.clone()

    def mask(self, t: int, s: int) -> torch.Tensor | None:
        """(t, s): the pass's query i sees the s - t cached entries and the pass up to itself."""
        return torch.ones(t, s, dtype=torch.bool).tril(s - t)

    def step(self, prefix, tokens, input_pos, k_cache, v_cache):
        x = self.emb(tokens) + self.pos(input_pos)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        k, v = torch.cat([k_cache, k], 1), torch.cat([v_cache, v], 1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask(tokens.shape[1], k.shape[1]))
        return self.head(x + y), k, v

    def truncate_cache(self, cache, n):
        return tuple(c[:, :n] for c in cache)


class NoCausalMask(TinyAttention):
    """Drops the mask (one-token passes need none): a verify pass's rows see the drafts after them."""

    def mask(self, t, s):
        return None


class TruncateKeeps(TinyAttention):
    """An append cache whose truncate does nothing: rejected drafts stay in the attention."""

    def truncate_cache(self, cache, n):
        return cache


class TruncateZeroKeepsAll(TinyAttention):
    """Cuts with `[:n or None]`: rollback works, but truncate_cache(cache, 0) at a new prefill keeps it all."""

    def truncate_cache(self, cache, n):
        return tuple(c[:, :n or None] for c in cache)


class LastRowOnly(TinyAttention):
    """Returns the last position's logits only (all a sampling loop reads)."""

    def step(self, prefix, tokens, input_pos, k_cache, v_cache):
        logits, k, v = super().step(prefix, tokens, input_pos, k_cache, v_cache)
        return logits[:, -1:], k, v


class Recurrent(nn.Module):
    """A GRU over token ids; its state (h,) (B, D) is the cache, zeroed at position 0, returned by step
    (cache kind "functional"): a state cannot rewind, so a rejected draft stays in it."""

    prefix_kind, cache_kind = "tokens", "functional"

    def __init__(self, seed: int = 0):
        super().__init__()
        self.emb, self.cell, self.head = nn.Embedding(VOCAB, D), nn.GRUCell(D, D), nn.Linear(D, VOCAB)
        _init(self, seed)

    def empty_cache(self, batch, dtype, device):
        return (torch.zeros(batch, D, dtype=dtype, device=device),)

    def step(self, prefix, tokens, input_pos, h):
        if int(input_pos[0]) == 0:
            h = torch.zeros_like(h)
        rows = []
        for t in range(tokens.shape[1]):
            h = self.cell(self.emb(tokens[:, t]), h)
            rows.append(self.head(h))
        return torch.stack(rows, 1), h


class RecurrentAppend(Recurrent):
    """The same state declared an append cache, with a truncate that cannot cut a state (as a port of a
    recurrent cache that cannot be trimmed would)."""

    cache_kind = "append"

    def truncate_cache(self, cache, n):
        return cache


class StateInModule(Recurrent):
    """The state kept in the module, not in the cache, never reset: a recurrent TorchScript policy's way."""

    cache_kind = "static"

    def __init__(self, seed: int = 0):
        super().__init__(seed)
        self.h = torch.zeros(1, D)

    def empty_cache(self, batch, dtype, device):
        return ()

    def step(self, prefix, tokens, input_pos):
        logits, self.h = super().step(prefix, tokens, torch.ones_like(input_pos), self.h)
        return logits


def _tiny_llama() -> Llama:
    return _init(Llama(LlamaConfig(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=64,
                                   max_seq_len=64)), 0)


@pytest.mark.parametrize("make", [TinyAttention, _tiny_llama], ids=["append", "llama-static"])
def test_conforming_modules_pass(make):
    engine = TorchModuleEngine(make())
    report = engine.selftest_report
    assert set(report.worst) == CLAUSES and report.passes == 2 * 8 + 5 and report.rtol == 1e-3  # 8 tokens
    assert max(report.worst.values()) < 1e-5  # fp32: pass splits differ by rounding only


def test_low_precision_tolerance():
    """bf16: the tolerance widens to 3e-2 of the largest logit; a conforming llama still loads, a cache that
    keeps rejected drafts is still refused."""
    engine = TorchModuleEngine(_tiny_llama().to(torch.bfloat16))
    assert engine.selftest_report.rtol == 3e-2 and max(engine.selftest_report.worst.values()) < 3e-2
    with pytest.raises(ProtocolViolation, match="rollback") as err:
        TorchModuleEngine(TruncateKeeps().to(torch.bfloat16))
    assert err.value.clause == "rollback"


def test_builtin_policy_adapters_pass(policy):
    """The built-in policy's module through the adapter, static and functional ("obs" prefix: a random
    observation of cfg.obs_dim)."""
    for engine in (TorchModuleEngine(policy.model, "obs", "static"),
                   TorchModuleEngine(policy.model, "obs", "functional", step_kwargs={"inplace": False})):
        assert set(engine.selftest_report.worst) == CLAUSES
        assert max(engine.selftest_report.worst.values()) < 1e-5


@pytest.mark.parametrize("module, clause, message", [
    (Recurrent, "rollback", r"rollback\(p\) did not forget positions >= p \(a pass does not overwrite .*a "
                            r"recurrent state.*decoding 8 tokens with a rejected draft of up to 7 tokens after each "
                            r"position p and rollback\(p\) before the next pass, logits at engine position 2 differ"),
    (RecurrentAppend, "rollback", r"rollback\(p\) did not forget .* \(truncate_cache\(cache, n\) kept.* position 2 "),
    (TruncateKeeps, "rollback", r"rollback\(p\) did not forget .* \(truncate_cache\(cache, n\) kept.* position 2 "),
    (NoCausalMask, "multi-token pass", r"a pass of 8 tokens at engine positions 1\.\.8 differs from 8 single-token "
                                       r"passes, logits at engine position 1 differ"),
    (TruncateZeroKeepsAll, "prefill", r"a new prefill did not forget the previous sequence"),
    (StateInModule, "fresh cache", r"state kept outside the cache"),
    (LastRowOnly, "logits", r"the pass at engine position 0 gave logits of shape \(0, 32\).*one finite row"),
])
def test_broken_module_refused_naming_the_clause(module, clause, message):
    with pytest.raises(ProtocolViolation, match=message) as err:
        TorchModuleEngine(module())
    assert err.value.clause == clause
    text = str(err.value)
    assert text.startswith(f"{module.__name__} breaks the model protocol ({clause})")
    if clause != "logits":
        rel = float(text.split("(")[-1].split(" of the largest")[0])
        assert rel > 1e-3  # the difference reported is over the fp32 tolerance


@pytest.mark.parametrize("module", [Recurrent, TruncateKeeps, NoCausalMask])
def test_refused_modules_decode_wrong_speculatively(module):
    """What the refusal prevents: loaded without the self-test, each decodes speculatively with no error and
    drifts from its own target-only decoding; a conforming module of the same shape does not."""
    prompt, n = np.array([3, 7, 1]), 24

    def decode(target: nn.Module, k: int) -> list[int]:
        drafter = EngineDrafter(TorchModuleEngine(TinyAttention(seed=1)))  # another model: many rejections
        drafter.start(prompt)
        engine = TorchModuleEngine(target, selftest=False)
        return speculative_decode(engine, prompt, n, drafter if k else None, _planner(k)).tokens

    assert decode(TinyAttention(), 4) == decode(TinyAttention(), 0)
    assert decode(module(), 4) != decode(module(), 0)


def test_obs_prefix_needs_a_probe_without_cfg_obs_dim():
    with pytest.raises(ValueError, match=r"cfg\.obs_dim: pass probe="):
        TorchModuleEngine(TinyAttention(), prefix="obs")
    engine = TorchModuleEngine(TinyAttention(), prefix="obs", probe=np.zeros(5, np.float32))
    assert set(engine.selftest_report.worst) == CLAUSES
    assert TorchModuleEngine(TruncateKeeps(), selftest=False).selftest_report is None


def test_selftest_leaves_a_fresh_cache():
    """After the self-test (which ends on a used cache, then resets), the first decode equals one on an
    engine that never ran it."""
    prompt = np.array([5, 9])
    got = [speculative_decode(TorchModuleEngine(TinyAttention(), selftest=s), prompt, 12, None,
                              _planner(0)).tokens for s in (True, False)]
    assert got[0] == got[1] and len(set(got[0])) > 2


def test_selftest_argument_errors():
    engine = TorchModuleEngine(TinyAttention(), selftest=False)
    with pytest.raises(ValueError, match="n_tokens must be an int >= 4, got 3"):
        self_test(engine, n_tokens=3)
    with pytest.raises(ValueError, match="k must be >= 1"):
        self_test(engine, k=0)
    assert self_test(engine, n_tokens=4).passes == 13


def _planner(k: int) -> TickPlanner:
    planner = TickPlanner(SchedulerConfig(k_max=k))
    planner.unlimited()
    return planner


def test_sliding_window_cache_is_refused_where_a_rejected_draft_reaches_into_its_window():
    """A rotating cache (mlx-lm's RotatingKVCache: a ring of WINDOW = 8 slots whose trim cannot restore what a
    draft overwrote, tests/factory_policies.py) decodes exactly for 6 tokens: a short probe passed it. The
    self-test decodes the whole chunk (12 tokens here) with rejected drafts of k tokens after every position and
    names the first position that differs: none for k = 1 (the overwritten slot has left the window), WINDOW - 1
    for k = 2, earlier for longer drafts."""
    from factory_policies import WINDOW, sliding_window_cache

    from edgeinfer.engines.models.factory import FactoryPolicyConfig

    model = sliding_window_cache(FactoryPolicyConfig(n_joints=6, horizon=2, stride_ticks=5, n_bins=16)).model
    probe = np.random.default_rng(0).standard_normal(18).astype(np.float32)
    engine = TorchModuleEngine(model, probe=probe, n_tokens=6)  # the old probe's reach: passes
    assert max(engine.selftest_report.worst.values()) < 1e-5
    assert max(self_test(engine, probe, n_tokens=12, k=1).worst.values()) < 1e-5
    for k, position in ((2, WINDOW - 1), (4, WINDOW - 3), (None, 2)):
        with pytest.raises(ProtocolViolation, match=rf"SlidingWindowCache breaks the model protocol \(rollback\): "
                                                    rf"rollback\(p\) did not forget positions >= p .* decoding 12 "
                                                    rf"tokens .* logits at engine position {position} differ") as e:
            self_test(engine, probe, n_tokens=12, k=k)
        assert e.value.clause == "rollback"
    with pytest.raises(ProtocolViolation, match=r"\(rollback\).* engine position 2 differ"):
        TorchModuleEngine(model, probe=probe, n_tokens=12)  # by default every k the chunk allows
