"""The batched fused engine (engines/backends/fused_batched.py) is batch-invariant: a sequence's logits are
bit-identical alone, in any batch (its number, slots, positions, verify lengths) and in FusedEngine, on held-out Schunk
observations; its greedy tokens equal FusedEngine's and torch fp32's; it computes the model's pass for other
shapes; bad passes are refused with errors that name the slot."""
import dataclasses

import numpy as np
import pytest
import torch

pytest.importorskip("numba")

from edgeinfer.core.protocols import Pass  # noqa: E402
from edgeinfer.engines.backends.batched import open_batched  # noqa: E402
from edgeinfer.engines.backends.fused_batched import BatchedFusedEngine  # noqa: E402
from edgeinfer.engines.backends.fused_engine import FusedEngine  # noqa: E402
from edgeinfer.engines.models.model import ActionTransformer  # noqa: E402
from edgeinfer.engines.training.evaluate import greedy_decode_batch  # noqa: E402

N_CHUNKS = 120
N_SLOTS = 32


@pytest.fixture(scope="module")
def obs(policy, held_out):
    """N_CHUNKS held-out observations, normalised (N, obs_dim) float32."""
    feats, _ = held_out
    feats = feats[np.random.default_rng(19).choice(len(feats), N_CHUNKS, replace=False)]
    return policy.normalise(feats).astype(np.float32)


@pytest.fixture(scope="module")
def alone(policy, obs):
    """Each chunk decoded greedily, target-only, alone (one T = 1 pass per call, slot 0): its logits
    (N, seq_len - 1 + 1, n_bins) float32 (row p: the pass at position p) and tokens (N, n_tokens)."""
    n = policy.cfg.n_tokens
    engine = BatchedFusedEngine(policy.model, 1)
    logits = np.zeros((len(obs), n, policy.cfg.n_bins), np.float32)
    tokens = np.zeros((len(obs), n), np.int64)
    for i, o in enumerate(obs):
        row = engine.forward_batch([Pass(0, o, (), 0)])[0]
        for p in range(n):
            logits[i, p] = row[-1]
            tokens[i, p] = row[-1].argmax()
            if p + 1 < n:
                row = engine.forward_batch([Pass(0, None, (int(tokens[i, p]),), p + 1)])[0]
    return logits, tokens


def test_a_sequence_alone_has_the_single_engines_logits_bit_for_bit(policy, obs, alone):
    """The batched engine runs FusedEngine's own kernels per row: a chunk alone in it has the single-sequence
    engine's logits exactly (teacher-forced on the same greedy tokens), so a robot's tokens are the same served by
    a fleet runtime or by its own runtime."""
    ref_logits, ref_tokens = alone
    single = FusedEngine(policy.model)
    for i in range(0, len(obs), 6):
        np.testing.assert_array_equal(single.forward(obs[i], ref_tokens[i, :-1].tolist(), 0), ref_logits[i])


def test_logits_are_bit_identical_alone_and_in_batches(policy, obs, alone):
    """Every chunk again, now many at once: each step a random 2..32 of the chunks in flight run one verify pass
    each (the last committed token + 0..8 drafts, some drafts wrong), chunks join as slots free (prefills mixed
    with verify passes) and leave when complete. Every row whose inputs are the committed tokens (the accepted
    drafts and the correction) must equal the alone run's logits bit for bit, and every chunk its tokens."""
    ref_logits, ref_tokens = alone
    n = policy.cfg.n_tokens
    rng = np.random.default_rng(7)
    engine = BatchedFusedEngine(policy.model, N_SLOTS)
    waiting = list(range(len(obs)))
    flight: dict[int, tuple[int, list[int]]] = {}  # slot -> (chunk, committed tokens)
    tokens = np.full((len(obs), n), -1)
    sizes, lengths, rows_checked = set(), set(), 0
    while waiting or flight:
        for slot in range(N_SLOTS):
            if slot not in flight and waiting:
                flight[slot] = (waiting.pop(0), [])
        batch = rng.choice(sorted(flight), min(len(flight), int(rng.integers(2, N_SLOTS + 1))), replace=False)
        passes, drafts = [], []
        for slot in batch:
            chunk, done = flight[slot]
            k = int(min(rng.integers(0, 9), n - len(done) - 1))
            d = [int(t) for t in ref_tokens[chunk, len(done):len(done) + k]]
            if k and rng.random() < 0.3:  # a wrong draft: rejected, its cache rows overwritten later by position
                j = int(rng.integers(0, k))
                d[j] = (d[j] + 1) % policy.cfg.n_bins
            drafts.append(d)
            passes.append(Pass(int(slot), obs[chunk], tuple(d), 0) if not done else
                          Pass(int(slot), None, (done[-1], *d), len(done)))
        sizes.add(len(passes))
        for p, d, out in zip(passes, drafts, engine.forward_batch(passes)):
            chunk, done = flight[p.slot]
            lengths.add(len(out))
            accepted = 0
            while accepted < len(d) and out[accepted].argmax() == d[accepted]:
                accepted += 1
            start = len(done)
            np.testing.assert_array_equal(out[:accepted + 1], ref_logits[chunk, start:start + accepted + 1],
                                          err_msg=f"chunk {chunk} at {start}.., batch {len(passes)}")
            rows_checked += accepted + 1
            done += d[:accepted] + [int(out[accepted].argmax())]
            if len(done) >= n:
                tokens[chunk] = done[:n]
                del flight[p.slot]
    assert (tokens == ref_tokens).all()
    assert rows_checked >= len(obs) * n and max(sizes) >= 16 and {1, 9} <= lengths  # it did mix shapes


def test_tokens_equal_fused_single_and_torch_fp32(policy, obs, alone, one_torch_thread):
    _, tokens = alone
    single = FusedEngine(policy.model)
    fused = np.array([single.greedy_chunk(o) for o in obs])
    torch_fp32 = greedy_decode_batch(policy.model, torch.as_tensor(obs))
    assert (tokens == fused).all(), f"{np.sum(tokens != fused)} tokens differ from FusedEngine"
    assert (tokens == torch_fp32).all(), f"{np.sum(tokens != torch_fp32)} tokens differ from torch fp32"


@pytest.mark.parametrize("shape", [dict(d_model=96, n_layers=3, n_heads=6, n_bins=66),  # n_bins: not a multiple of 4
                                   dict(d_model=256, n_layers=4, n_heads=8)])
def test_other_configs_match_fused_single(policy, shape):
    """Per pass in a batch of three (a prefill and verify passes of 1 and 5 tokens), the logits of FusedEngine
    running that sequence alone, bit for bit (the same kernels, on other shapes too)."""
    torch.manual_seed(0)
    model = ActionTransformer(dataclasses.replace(policy.cfg, **shape)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    cfg = model.cfg
    rng = np.random.default_rng(1)
    obs = rng.standard_normal((3, cfg.obs_dim)).astype(np.float32)
    seqs = rng.integers(0, cfg.n_bins, (3, cfg.n_tokens)).tolist()
    batched, singles = BatchedFusedEngine(model, 3), [FusedEngine(model) for _ in range(3)]
    for s in (1, 2):  # slots 1 and 2 hold a prefill of 4 positions
        batched.forward_batch([Pass(s, obs[s], tuple(seqs[s][:3]), 0)])
        singles[s].forward(obs[s], seqs[s][:3], 0)
    steps = [(0, obs[0], seqs[0][:2], 0), (1, None, seqs[1][3:4], 4), (2, None, seqs[2][3:8], 4)]
    got = batched.forward_batch([Pass(s, o, tuple(t), start) for s, o, t, start in steps])
    for (s, o, t, start), out in zip(steps, got):
        np.testing.assert_array_equal(out, singles[s].forward(o, t, start), err_msg=f"slot {s}")
    # and batch-invariant at this shape too (d_model 256: matrix products over 1024 inputs): each pass alone
    for (s, o, t, start), out in zip(steps, got):
        np.testing.assert_array_equal(batched.forward_batch([Pass(s, o, tuple(t), start)])[0], out)


@pytest.mark.parametrize("passes, match", [
    ([Pass(3, None, (1,), 1)], "slot 3"),
    ([Pass(0, None, (1,), 1), Pass(0, None, (2,), 2)], "slot 0 has two passes"),
    ([Pass(1, None, (1, 2), 48)], "does not fit seq_len 49"),
    ([Pass(1, None, (), 5)], "has no tokens"),
    ([Pass(2, None, (1,), 0)], "prefill of slot 2 needs obs"),
    ([Pass(0, None, (64,), 3)], "token id out of range"),
])
def test_bad_passes_are_refused(policy, passes, match):
    engine = BatchedFusedEngine(policy.model, 3)
    with pytest.raises(ValueError, match=match):
        engine.forward_batch(passes)


def test_open_batched(policy):
    engine = open_batched(policy, "fused", n_slots=4)
    assert isinstance(engine, BatchedFusedEngine)
    assert (engine.backend, engine.precision, engine.device, engine.n_slots) == ("fused", "fp32", "cpu", 4)
    assert engine.cfg == policy.cfg and engine.forward_batch([]) == []
    with pytest.raises(ValueError, match=r"unknown batched backend 'tensorrt'; known: \[.*'fused'"):
        open_batched(policy, "tensorrt", n_slots=4)
    with pytest.raises(ValueError, match="n_slots must be >= 1"):
        open_batched(policy, "fused", n_slots=0)


def test_greedy_runs_give_the_tokens_of_pass_by_pass_decoding(policy, obs, alone):
    """greedy_runs (the fleet scheduler's target-only rows in one call): sequences at different positions, runs of
    different lengths, refilled as they end, give each chunk's alone tokens."""
    n = policy.cfg.n_tokens
    engine = BatchedFusedEngine(policy.model, 8)
    rng = np.random.default_rng(3)
    todo, live, got = list(range(40)), {}, {}
    while todo or live:
        for slot in [s for s in range(8) if s not in live][: len(todo)]:  # refill free slots: a prefill each
            i = todo.pop()
            first = engine.forward_batch([Pass(slot, obs[i], (), 0)])[0][-1]
            live[slot], got[i] = i, [int(first.argmax())]
        runs = [(s, len(got[i]), got[i][-1], int(rng.integers(1, 9))) for s, i in live.items()]
        runs = [(s, start, last, min(m, n - start)) for s, start, last, m in runs]
        for (s, _, _, _), new in zip(runs, engine.greedy_runs(runs)):
            got[live[s]] += new
            if len(got[live[s]]) == n:
                del live[s]
    _, tokens = alone
    assert all(got[i] == tokens[i].tolist() for i in range(40))
    with pytest.raises(ValueError, match="two runs"):
        engine.greedy_runs([(0, 1, 0, 1), (0, 2, 0, 1)])
    with pytest.raises(ValueError, match="do not fit"):
        engine.greedy_runs([(0, n, 0, 2)])
