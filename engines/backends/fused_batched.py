"""Batched fused CPU backend: one numba call runs a target pass over many sequences (a fleet, core/fleet_batching.py),
each in its own KV-cache slot, with logits that do not depend on the batch (batch invariance, by construction).

forward_batch(passes) takes one `Pass` per sequence (core/protocols.py: slot, obs (obs_dim,) float32 for a
prefill, tokens, start) and returns its logits, (T_i, n_bins) float32, T_i = len(tokens) (+1 for the prefill's
observation row), as FusedEngine.forward would for that sequence alone. The passes' rows (R = sum T_i) are
stacked into (R, d_model) float64 activations and run layer by layer in ONE call: LayerNorm -> qkv -> per
pass, fused_engine's attention on its own slot -> proj -> LayerNorm -> exact (erf) GELU MLP, then the final
LayerNorm and head.

Batch invariance, and why it holds: each row's arithmetic is the same whatever shares the call, and the same as
FusedEngine's for that sequence alone, because it is FusedEngine's code:
- Matrix products: fused_engine._linear over the call's rows, the fp32 weights in torch's layout (the single
  engine's own array): each output element of each row is its own dot product over the row's inputs, in an order
  fixed by n_in, four outputs at a time sharing the row's loads; no row's sum involves another row.
- LayerNorm, attention, GELU, embeddings: per row, fused_engine's own kernels; their reductions run over the
  row's own features (LayerNorm) or its slot's positions <= its own (attention), the same code for every row.
So a pass's logits are bit-identical alone, in any batch, and to FusedEngine.forward for that sequence;
tests/test_fused_batched.py checks both on held-out chunks (batches of 1..32, mixed slots, positions and verify
lengths).

Numerics, as fused_engine.py: fp32 weights widened exactly in float64 arithmetic, float64 activations, sums and
KV cache, logits rounded to float32: the model's logits in exact arithmetic up to float32 rounding, so greedy
tokens equal torch fp32's unless a top-2 margin falls below torch fp32's own rounding error (~5e-5).

KV cache (n_slots, 2, n_layers, n_heads, seq_len, head_dim) float64: slot s is FusedEngine's cache, written by
position (rollback is a no-op). Work buffers are preallocated for every slot's full sequence in one call.

Cost: batching shares the Python and call overhead of a pass, not its arithmetic (the kernel is compute-bound per
row: matrix products, GELU's erf, attention). The matrix products are fused_engine._linear, not BLAS: OpenBLAS
re-packs the whole weight matrix on every call, which on blocks of a few rows doubles a sequence's cost. A
48-token chunk costs 0.57-1.09 ms of kernel per robot at B = 1-16, against 0.74-0.93 ms on FusedEngine alone
(2-core AMD EPYC VM, quiet; scripts/fleet_kernel_cost.py, docs/fleet.md "The batched kernel").
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from edgeinfer.core.protocols import Pass
from edgeinfer.engines.backends import fused_engine as fe
from edgeinfer.engines.backends.kernel_cache import kernels_ready

_kernel = fe._kernel  # njit with the on-disk cache, fused_engine's flags


@_kernel
def _batch_pass(w, off, dims, eps, kv, x, h, qkv, att, mlp, out, scores, obs, pos, tok, slots, starts, first,
                logits):
    """One batched pass -> logits (rows, n_bins) float32. Pass i is rows first[i]..first[i+1]-1, at positions
    starts[i].., of sequence slots[i] (its KV cache kv[slots[i]]); row r's token is tok[r]. The k-th row at
    position 0 (a prefill) embeds obs[k]. pos: work buffer, each row's position."""
    d, n_heads, n_layers, n_bins = dims[fe.D_MODEL], dims[fe.D_HEADS], dims[fe.D_LAYERS], dims[fe.D_BINS]
    n_passes, rows = len(slots), logits.shape[0]
    n_pre = 0
    for i in range(n_passes):
        n_pre += starts[i] == 0
        for r in range(first[i], first[i + 1]):
            pos[r] = starts[i] + r - first[i]
            if pos[r] > 0 and (tok[r] < 0 or tok[r] >= n_bins):
                raise ValueError("fused batched engine: token id out of range 0..n_bins-1")
    if n_pre > 0:  # the observation embeddings (obs_proj) of the prefill rows
        fe._linear(obs, n_pre, w, off, fe.OBS_W, h)
    k = 0
    for r in range(rows):
        if pos[r] == 0:
            x[r, :] = h[k]
            k += 1
        else:
            x[r, :] = w[off[fe.TOK_EMB] + tok[r] * d:off[fe.TOK_EMB] + (tok[r] + 1) * d]
        pe = off[fe.POS_EMB] + pos[r] * d
        for o in range(d):
            x[r, o] += w[pe + o]
    for layer in range(n_layers):
        lw = fe.N_GLOBAL + layer * fe.N_LAYER  # this layer's first tensor index (fused_engine._pack's order)
        fe._layer_norm(x, rows, w, off, lw + fe.LN1_W, eps, h)
        fe._linear(h, rows, w, off, lw + fe.QKV_W, qkv)
        for i in range(n_passes):  # each pass on its own slot: fused_engine's attention, row by row
            a, b = first[i], first[i + 1]
            fe._attention(qkv[a:b], b - a, pos[a], layer, n_heads, kv[slots[i]], scores, att[a:b])
        fe._linear(att, rows, w, off, lw + fe.PROJ_W, h)
        fe._add(x, rows, h)
        fe._feed_forward(x, rows, w, off, lw, eps, h, mlp)
    fe._head(x, rows, w, off, eps, h, out, logits)


@_kernel
def _batch_greedy(w, off, dims, eps, kv, x, h, qkv, att, mlp, out, scores, obs, pos, slots, starts, last, m, tokens,
                  tok, sl, st, first, logits):
    """Target-only greedy passes of several sequences in ONE call: sequence i (slot slots[i]) runs m[i] passes at
    positions starts[i].., the first fed last[i] (its last committed token), each next one the argmax of the
    float32 logits before (first index on ties, as numpy) -> tokens[i, :m[i]]. Pass j is one _batch_pass over
    the sequences with j < m[i], so every token is the one that pass-by-pass forward_batch calls give.
    tok, sl, st, first, logits: work buffers of len(slots) (+1 for first) rows."""
    n_bins = dims[fe.D_BINS]
    for j in range(m.max()):
        a = 0
        for i in range(len(slots)):
            if j < m[i]:
                tok[a], sl[a], st[a], first[a] = last[i], slots[i], starts[i] + j, a
                a += 1
        first[a] = a
        _batch_pass(w, off, dims, eps, kv, x, h, qkv, att, mlp, out, scores, obs, pos, tok[:a], sl[:a], st[:a],
                    first[:a + 1], logits[:a])
        a = 0
        for i in range(len(slots)):
            if j < m[i]:
                best = 0
                for o in range(1, n_bins):
                    if logits[a, o] > logits[a, best]:
                        best = o
                tokens[i, j] = best
                last[i] = best
                a += 1


class BatchedFusedEngine:
    """BatchedEngine (core/protocols.py) running an ActionTransformer over up to n_slots sequences per call,
    one numba call per forward_batch, fp32 weights, float64 arithmetic, batch-invariant logits (module
    docstring), on the CPU, single-threaded.

    model: the fp32 ActionTransformer (weights copied). n_slots >= 1 KV-cache slots. Raises ValueError for
    another model class, precision other than fp32, device other than cpu or n_slots < 1; forward_batch
    raises ValueError for a slot outside 0..n_slots-1 or used twice in one call, a pass that does not fit
    seq_len, a prefill without obs (or obs of the wrong size), an empty pass or a token id out of range.
    """

    backend = "fused"

    def __init__(self, model, n_slots: int, precision: str = "fp32", device: str = "cpu"):
        fe._check(precision, device)
        if n_slots < 1:
            raise ValueError(f"fused batched engine: n_slots must be >= 1, got {n_slots}")
        single = fe.FusedEngine(model, precision, device)  # checks the model class and its LayerNorm eps
        c = self.cfg = single.cfg
        self.precision, self.device, self.n_slots = precision, device, n_slots
        self._eps, self._dims = single._eps, single._dims
        self._w, self._off = single._w, single._off  # fp32, torch's layout: the single engine's own
        d, s, hd = c.d_model, c.seq_len, c.d_model // c.n_heads
        self._kv = np.zeros((n_slots, 2, c.n_layers, c.n_heads, s, hd))  # float64, written by position
        rows = n_slots * s  # every slot's full sequence in one call
        # x, LayerNorm out / residual branch, qkv, attention, MLP hidden, head out, attention scores
        self._work = (np.zeros((rows, d)), np.zeros((rows, d)), np.zeros((rows, 3 * d)), np.zeros((rows, d)),
                      np.zeros((rows, 4 * d)), np.zeros((rows, c.n_bins)), np.zeros(s))
        self._obs = np.zeros((n_slots, c.obs_dim))  # float32-rounded, as torch casts
        self._pos = np.zeros(rows, np.int64)
        kernels_ready("fused_batched", self._first_calls, (_batch_pass, _batch_greedy))

    def _first_calls(self) -> None:
        """A prefill of slot 0 and one greedy pass after it (kernel_cache.kernels_ready): the kernels for the argument
        types every later call has; slot 0's cache rows are overwritten by its first real prefill."""
        self.forward_batch([Pass(0, np.zeros(self.cfg.obs_dim, np.float32), (), 0)])
        self.greedy_runs([(0, 1, 0, 1)])

    @classmethod
    def from_policy(cls, policy, n_slots: int, threads: int = 1) -> "BatchedFusedEngine":
        """Engine for policy.model. threads is accepted for the common signature and unused (one thread)."""
        return cls(policy.model, n_slots)

    def forward_batch(self, passes: Sequence[Pass]) -> list[np.ndarray]:
        """Logits per pass, (T_i, n_bins) float32, in order (see core/protocols.BatchedEngine): views of one
        new (sum T_i, n_bins) array per call."""
        if not passes:
            return []
        c = self.cfg
        seen: set[int] = set()
        tokens, slots, starts, first = [], [], [], [0]
        n_pre = 0
        for p in passes:
            if not 0 <= p.slot < self.n_slots or p.start < 0:
                raise ValueError(f"fused batched engine: slot {p.slot} (0..{self.n_slots - 1}) at start {p.start}")
            if p.slot in seen:
                raise ValueError(f"fused batched engine: slot {p.slot} has two passes in one call")
            seen.add(p.slot)
            if p.start == 0:
                if p.obs is None or np.size(p.obs) != c.obs_dim:
                    raise ValueError(f"fused batched engine: the prefill of slot {p.slot} needs obs ({c.obs_dim},)")
                self._obs[n_pre] = np.asarray(p.obs, np.float32)
                n_pre += 1
                tokens.append(0)  # position 0 embeds obs; its token id is ignored
            elif len(p.tokens) == 0:
                raise ValueError(f"fused batched engine: the pass of slot {p.slot} at {p.start} has no tokens")
            tokens += p.tokens
            if p.start + len(tokens) - first[-1] > c.seq_len:
                raise ValueError(f"fused batched engine: the pass of slot {p.slot} ({len(tokens) - first[-1]} rows "
                                 f"at {p.start}) does not fit seq_len {c.seq_len}")
            slots.append(p.slot)
            starts.append(p.start)
            first.append(len(tokens))
        logits = np.empty((len(tokens), c.n_bins), np.float32)
        _batch_pass(self._w, self._off, self._dims, self._eps, self._kv, *self._work, self._obs, self._pos,
                    np.array(tokens, np.int64), np.array(slots, np.int64), np.array(starts, np.int64),
                    np.array(first, np.int64), logits)
        return [logits[a:b] for a, b in zip(first, first[1:])]

    def greedy_runs(self, runs: Sequence[tuple[int, int, int, int]]) -> list[list[int]]:
        """Target-only greedy decoding of several sequences in ONE numba call (core/fleet_batching.py runs a batch's
        target-only stretches here): runs of (slot, start >= 1, last, m): m passes of slot at positions start..,
        the first fed `last` (the token committed at start - 1); returns each run's m tokens, those of m
        forward_batch calls taking the argmax of each pass's float32 logits (first on ties). Raises ValueError for
        a slot outside 0..n_slots-1 or used twice, a start < 1, m < 1, a run past seq_len or a token out of range."""
        c = self.cfg
        if len({r[0] for r in runs}) != len(runs):
            raise ValueError("fused batched engine: a slot has two runs in one call")
        for slot, start, last, m in runs:
            if not 0 <= slot < self.n_slots or start < 1 or m < 1 or start + m > c.seq_len or not 0 <= last < c.n_bins:
                raise ValueError(f"fused batched engine: run of slot {slot} (0..{self.n_slots - 1}): {m} passes at "
                                 f"{start} after token {last} do not fit seq_len {c.seq_len} / n_bins {c.n_bins}")
        b = len(runs)
        slots, starts, last, m = (np.array([r[i] for r in runs], np.int64) for i in range(4))
        tokens = np.zeros((b, int(m.max())), np.int64)
        _batch_greedy(self._w, self._off, self._dims, self._eps, self._kv, *self._work, self._obs, self._pos, slots,
                      starts, last, m, tokens, np.zeros(b, np.int64), np.zeros(b, np.int64), np.zeros(b, np.int64),
                      np.zeros(b + 1, np.int64), np.empty((b, c.n_bins), np.float32))
        return [tokens[i, :m[i]].tolist() for i in range(b)]
