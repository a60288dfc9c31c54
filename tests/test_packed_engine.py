"""The packed backend (SIMD panels, fp32 fma; one or two threads) computes the torch model's pass, and its
rows do not depend on the pass: a t-token pass gives bitwise the logits of t single-token passes, two threads the
bits of one, so speculative decoding on it gives exactly its own target-only tokens.

Tolerance against torch fp32: both round in float32 in different orders (atol 1e-4, as for onnxruntime)."""
import dataclasses
import os
import threading
import time

import numpy as np
import pytest
import torch

pytest.importorskip("numba")

from edgeinfer.core.speculative import FixedK, speculative_decode  # noqa: E402
from edgeinfer.engines.backends.build import load_engine  # noqa: E402
from edgeinfer.engines.backends.engine import unavailable_reason  # noqa: E402
from edgeinfer.engines.backends.packed_engine import PackedEngine  # noqa: E402
from edgeinfer.engines.backends.quality import greedy_chunk  # noqa: E402
from edgeinfer.engines.backends.simd import PANEL, TILE_ROWS, linear, pack_linear, padded, panel_columns  # noqa: E402
from edgeinfer.engines.models.drafters import make_drafter  # noqa: E402
from edgeinfer.engines.models.model import POLICY_SIZES, ActionTransformer  # noqa: E402
from edgeinfer.engines.training.evaluate import greedy_decode_batch  # noqa: E402

FP32_ATOL = 1e-4


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    """The torch references on one thread."""


def _model(cfg, **shape) -> ActionTransformer:
    torch.manual_seed(0)
    model = ActionTransformer(dataclasses.replace(cfg, **shape)).eval()
    with torch.no_grad():  # larger than the default init, so that every part moves the logits
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def large(policy):
    """A model of the large policy's shape (3.2 M parameters) and its engines on one and two threads."""
    model = _model(policy.cfg, **POLICY_SIZES["large"])
    one, two = PackedEngine(model), PackedEngine(model, threads=2)
    yield model, one, two
    two.close()


def test_linear_is_the_product_and_rows_do_not_depend_on_the_pass():
    rng = np.random.default_rng(0)
    for n_out, n_in in ((70, 40), (64, 18), (256, 1024)):  # 70: padded to 96, 18: the observation width
        w, b = rng.standard_normal((n_out, n_in)).astype(np.float32), rng.standard_normal(n_out).astype(np.float32)
        wp, bp = pack_linear(w, b)
        t = 2 * TILE_ROWS + 3  # three tiles: 9, 9, 3 rows
        x = rng.standard_normal((t, n_in)).astype(np.float32)
        y = np.full((t, padded(n_out)), np.nan, np.float32)
        linear(x, t, wp, bp, y, 0, 1)
        np.testing.assert_allclose(y[:, :n_out], x.astype(np.float64) @ w.T.astype(np.float64) + b, atol=2e-5 * n_in)
        assert (y[:, n_out:] == 0).all()  # the padding's outputs: zero weights and bias
        for r in range(t):  # one row alone: the same bits
            one = np.zeros((1, padded(n_out)), np.float32)
            linear(x[r:r + 1].copy(), 1, wp, bp, one, 0, 1)
            assert np.array_equal(one[0], y[r])
        halves = np.full_like(y, np.nan)  # two parts: disjoint panels that cover every column, same bits
        for part in (0, 1):
            linear(x, t, wp, bp, halves, part, 2)
        assert np.array_equal(halves, y)
        c = [panel_columns(padded(n_out), part, 2) for part in (0, 1)]
        assert c[0][0] == 0 and c[0][1] == c[1][0] and c[1][1] == padded(n_out) and c[0][1] % PANEL == 0


def _passes(engine, obs, seq, starts_lengths):
    """Logits of the prefill and the passes (start, t) over seq, after one rejected junk draft each."""
    n_bins = engine.cfg.n_bins
    out = {0: engine.forward(obs, (), 0)}
    for start, t in starts_lengths:
        engine.forward(None, [(x + 1) % n_bins for x in seq[start - 1:start - 1 + t]], start)  # rejected
        out[(start, t)] = engine.forward(None, seq[start - 1:start - 1 + t], start)
    return out


def test_logits_match_torch_and_rows_match_single_token_passes(large):
    model, one, two = large
    cfg = model.cfg
    rng = np.random.default_rng(1)
    obs = rng.standard_normal(cfg.obs_dim).astype(np.float32)
    seq = rng.integers(0, cfg.n_bins, cfg.n_tokens).tolist()
    with torch.inference_mode():
        want = model(torch.as_tensor(obs)[None], torch.tensor([seq]))[0].numpy()
    singles = _passes(one, obs, seq, [(p, 1) for p in range(1, cfg.n_tokens)])
    np.testing.assert_allclose(singles[0], want[:1], atol=FP32_ATOL)
    for p in range(1, cfg.n_tokens):
        np.testing.assert_allclose(singles[(p, 1)], want[p:p + 1], atol=FP32_ATOL, err_msg=f"position {p}")
    shapes = [(1, 5), (6, 9), (15, 12), (27, 2), (29, 19)]  # 12 and 19 rows: more than one tile
    for engine in (one, two):
        got = _passes(engine, obs, seq, shapes)
        assert np.array_equal(got[0], singles[0])
        for start, t in shapes:
            for i in range(t):
                assert np.array_equal(got[(start, t)][i], singles[(start + i, 1)][0]), \
                    f"{engine.threads} thread(s): row {i} of the pass of {t} at {start}"
    deadline = time.monotonic() + 20.0  # the worker thread takes halves once it runs (a busy host delays it)
    while two.halves_shared == 0 and time.monotonic() < deadline:
        two.greedy_chunk(obs)
    assert two.halves_shared > 0


def test_two_threads_decode_the_same_tokens_and_the_worker_sleeps_when_idle(large):
    model, one, two = large
    rng = np.random.default_rng(2)
    for _ in range(5):
        obs = rng.standard_normal(model.cfg.obs_dim).astype(np.float32)
        assert two.greedy_chunk(obs) == one.greedy_chunk(obs) == greedy_chunk(one, obs, model.cfg.n_tokens)
    time.sleep(0.05)  # idle: the worker naps between chunks instead of spinning
    cpu_s = _thread_cpu_s(two._worker.native_id)
    time.sleep(0.5)
    assert _thread_cpu_s(two._worker.native_id) - cpu_s < 0.1  # under 20 % of a core (~2 % measured)


def _thread_cpu_s(tid: int) -> float:
    """CPU time (user + system, s) of thread `tid` of this process, from /proc."""
    fields = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_greedy_equals_torch_fp32_on_held_out_observations(policy, held_out):
    feats, _ = held_out
    x = policy.normalise(feats[np.random.default_rng(3).choice(len(feats), 300, replace=False)]).astype(np.float32)
    engine = load_engine(policy, "packed")
    tokens = np.array([engine.greedy_chunk(o) for o in x])
    reference = greedy_decode_batch(policy.model, torch.as_tensor(x))
    assert (tokens == reference).all(), f"{np.sum(tokens != reference)} tokens differ"


@pytest.mark.parametrize("drafter_name", ["kinematic", "learned"])
def test_speculative_on_packed_equals_its_target_only_decoding(policy, held_out, drafter_name):
    feats, _ = held_out
    feats = feats[np.random.default_rng(4).choice(len(feats), 60, replace=False)]
    x = policy.normalise(feats).astype(np.float32)
    engine = load_engine(policy, "packed", threads=2)
    drafter = make_drafter(drafter_name, policy, **({"backend": "packed"} if drafter_name == "learned" else {}))
    d, accepted = policy.cfg.n_joints, 0
    for row, f in enumerate(feats):
        k = (1, 2, 4, 8)[row % 4]
        q = np.zeros(d)
        drafter.reset(q, f[d:2 * d], q - f[2 * d:3 * d])
        res = speculative_decode(engine, x[row], policy.cfg.n_tokens, drafter, FixedK(k))
        assert res.tokens == engine.greedy_chunk(x[row]), f"observation {row} with k={k}"
        accepted += res.accepted
    assert accepted > 0
    engine.close()


def test_close_stops_the_worker_and_the_engine_still_runs(policy):
    engine = PackedEngine(policy.model, threads=2)
    obs = np.zeros(policy.cfg.obs_dim, np.float32)
    tokens = engine.greedy_chunk(obs)
    engine.close()
    engine.close()  # idempotent
    assert not any(t.name == "packed-engine-worker" and t.is_alive() for t in threading.enumerate()
                   if t is engine._worker)
    assert engine._worker is None
    assert engine.greedy_chunk(obs) == tokens


def test_refuses_what_it_cannot_run(policy):
    assert unavailable_reason("packed", "cpu") is None
    assert unavailable_reason("packed", "cuda") == "packed runs on the CPU only (a numba-compiled pass)"
    with pytest.raises(ValueError, match="packed backend builds fp32 only"):
        load_engine(policy, "packed", "bf16")
    with pytest.raises(ValueError, match="threads must be 1 or 2"):
        PackedEngine(policy.model, threads=3)
    with pytest.raises(ValueError, match="ActionTransformer of engines/models/model.py only, not Linear"):
        PackedEngine(torch.nn.Linear(2, 2))
    engine = load_engine(policy, "packed")
    n = policy.cfg.seq_len
    with pytest.raises(ValueError, match="does not fit"):
        engine.forward(None, [1, 2], n - 1)
    with pytest.raises(ValueError, match="token id out of range"):
        engine.forward(None, [policy.cfg.n_bins], 5)
