"""Packed CPU backend: the ActionTransformer pass (engines/models/model.py) as one numba call, fp32 weights packed once
into SIMD panels (engines/backends/simd.py), so a verify pass of k + 1 tokens reads every weight once.

This is the engine for policies whose weights, not framework dispatch, set the time of a pass (the 3.2 M-parameter
`schunk_large_target`: 12.6 MB of weights a pass). The fused backend (engines/backends/fused_engine.py) computes in
float64 and re-reads a weight row per token; here the linears are fp32 fused multiply-adds over register tiles of up to
9 rows, so a pass of 5 tokens costs about 1.5 single-token passes instead of 5 (measured curve: `edgeinfer bench
engines`, pass_cost_us).

Numerics, per row (each row's arithmetic is independent of how many rows the pass has, so a t-token pass gives
bitwise the logits of t single-token passes, and greedy speculative decoding the target-only tokens of this
engine):
    linears        float32, one fma per input in increasing order (engines/backends/simd.py)
    LayerNorm      mean and variance in float64 (biased, as torch), output rounded to float32
    attention      scores, softmax and the weighted sum of values in float64, output rounded to float32
    GELU           the erf form in float64 with a rational erf (max abs error 6.5e-8), rounded to float32
    residuals, KV  float32, as torch's fp32 model
Tokens agree with torch fp32 up to float32 rounding: a top-2 logit margin below ~1e-5 can flip (`edgeinfer bench
engines` reports token_agreement; auto checks it on its probes before choosing this engine for an exact preset).

Threads: one. The second core of a 2-core machine stays with the control loop and the replayer.
Compile cost: like the fused engine's (numba, cached on disk; a cold compile takes ~20 s on a 2-core VM).
"""
from __future__ import annotations

import math
import os
import sys
import threading
import time

import numpy as np

from edgeinfer.engines.backends.fused_engine import (
    _GLOBAL,
    _LAYER,
    _TORCH_NAME,
    D_BINS,
    D_HEADS,
    D_LAYERS,
    D_MODEL,
    D_SEQ,
    FC1_W,
    FC2_W,
    HEAD_W,
    LN1_W,
    LN2_W,
    LNF_W,
    N_GLOBAL,
    N_LAYER,
    OBS_W,
    POS_EMB,
    PROJ_W,
    QKV_W,
    TOK_EMB,
    OneCallEngine,
    _check,
    _kernel,
    _layer_norm,
    softmax_mix,
)
from edgeinfer.engines.backends.kernel_cache import kernels_ready
from edgeinfer.engines.backends.simd import linear, pack_linear, padded, panel_columns
from edgeinfer.engines.backends.spin import LINE, cas, load, store
from edgeinfer.engines.models.model import ActionTransformer

_LINEARS = {"obs_w", "qkv_w", "proj_w", "fc1_w", "fc2_w", "head_w"}  # packed into panels with their biases


def _pack(state: dict, n_layers: int) -> tuple[np.ndarray, np.ndarray]:
    """(weights (n,) float32, offsets (N_GLOBAL + N_LAYER * n_layers + 1,) int64), tensor i at
    weights[offsets[i]:offsets[i + 1]] in fused_engine's order: a linear's weight as SIMD panels and its bias
    zero-padded to the panels' width (simd.pack_linear); every other tensor flat in torch's layout."""
    names = list(_GLOBAL) + [name for _ in range(n_layers) for name in _LAYER]
    torch_names = [_TORCH_NAME[n] for n in _GLOBAL]
    torch_names += [f"blocks.{i}.{_TORCH_NAME[n]}" for i in range(n_layers) for n in _LAYER]
    tensors = [state[t].detach().cpu().float().numpy() for t in torch_names]
    parts = []
    for k, (name, tensor) in enumerate(zip(names, tensors)):
        if name in _LINEARS:
            parts += pack_linear(tensor, tensors[k + 1])
        elif name.removesuffix("_b") + "_w" not in _LINEARS:  # a linear's bias went in with its weight
            parts.append(tensor.ravel())
    offsets = np.cumsum([0] + [p.size for p in parts]).astype(np.int64)
    return np.concatenate(parts).astype(np.float32), offsets


_vkernel = _kernel(error_model="numpy")  # numpy's float semantics (no ZeroDivisionError branch): loops vectorise

# The control array shared with the worker thread, one cache line per slot (engines/backends/spin.py). A pass runs as
# stages(n_layers) stages; each splits in two halves. Stage number `sid` counts stages over the engine's life.
STAGE = 0  # the sid the engine thread is working on (published with release ordering)
BASE, START, ROWS = LINE, 2 * LINE, 3 * LINE  # the current pass: its first stage's sid, start position, rows
CLAIM = 4 * LINE  # CLAIM + (sid & 1) * LINE: sid * 4 while half 1 of stage sid is free, | 1 claimed by the worker,
#                   | 2 taken by the engine thread itself
DONE = 6 * LINE  # DONE + (sid & 1) * LINE: the last sid whose half 1 the worker finished
STOPPED, SHARED = 8 * LINE, 9 * LINE  # 1: the worker must return; halves the worker computed
SPIN_LIMIT = 2_000_000  # idle spins before the worker naps (~1 ms: longer than the gaps between a chunk's passes)
SPIN_IDLE = 2_000  # idle spins after a nap during which the engine ran no stage (between chunks: ~2 % of a core)
NAP_S = 0.001  # a nap between chunks: the worker costs ~2 % of a core while the engine idles


@_vkernel
def stages(n_layers: int) -> int:
    """Stages of one pass: embeddings, 5 per block, final LayerNorm and head."""
    return 2 + 5 * n_layers


@_vkernel
def _linear(x, t, w, off, wi, y, part, parts):
    """y[:t, share] = x[:t] @ W.T + b, the share `part` of `parts` of the packed linear at tensor wi (bias wi + 1)."""
    linear(x, t, w[off[wi]:off[wi + 1]], w[off[wi + 1]:off[wi + 2]], y, part, parts)


@_kernel(error_model="numpy", inline="always")  # inlined, so that the GELU loop around it vectorises
def _erf(x):
    """erf(x), max absolute error 6.5e-8 (measured against math.erf on [-6, 6]): Eigen's rational approximation
    for float32 (generic_fast_erf_float), evaluated in float64. Unlike libm's erf it vectorises."""
    x = 4.0 if x > 4.0 else x  # |erf(x)| rounds to 1 in float32 beyond 4
    x = -4.0 if x < -4.0 else x
    x2 = x * x
    p = x2 * -2.72614225801306e-10 + 2.77068142495902e-08
    p = x2 * p - 2.10102402082508e-06
    p = x2 * p - 5.69250639462346e-05
    p = x2 * p - 7.34990630326855e-04
    p = x2 * p - 2.95459980854025e-03
    p = x2 * p - 1.60960333262415e-02
    q = x2 * -1.45660718464996e-05 - 2.13374055278905e-04
    q = x2 * q - 1.68282697438203e-03
    q = x2 * q - 7.37332916720468e-03
    q = x2 * q - 1.42647390514189e-02
    return x * p / q


@_vkernel
def _attention(qkv, t, start, d, n_heads, k_cache, v_cache, scores, acc, y, part, parts):
    """Heads `part` of `parts`: write this pass's keys (transposed: (head_dim, seq_len) per head, so that a
    query's scores vectorise over positions) and values ((seq_len, head_dim)) at positions start.. of one layer's
    cache, then causal attention in float64: the query at position p attends to positions <= p."""
    hd = d // n_heads
    scale = 1.0 / math.sqrt(hd)
    for h in range(n_heads * part // parts, n_heads * (part + 1) // parts):
        kt, vc = k_cache[h], v_cache[h]
        for r in range(t):
            for e in range(hd):
                kt[e, start + r] = qkv[r, d + h * hd + e]
                vc[start + r, e] = qkv[r, 2 * d + h * hd + e]
        for r in range(t):
            p = start + r
            scores[:p + 1] = 0.0
            for e in range(hd):
                q = np.float64(qkv[r, h * hd + e]) * scale
                ke = kt[e]
                for j in range(p + 1):
                    scores[j] += q * ke[j]
            top = scores[0]
            for j in range(1, p + 1):
                top = scores[j] if scores[j] > top else top
            softmax_mix(scores, p, top, vc, acc)
            for e in range(hd):
                y[r, h * hd + e] = np.float32(acc[e])


@_vkernel
def _gelu(mlp, t, c0, c1):
    """mlp[:t, c0:c1] = GELU(mlp[:t, c0:c1]), the erf form (nn.GELU()) in float64, rounded to float32."""
    for r in range(t):
        seg = mlp[r, c0:c1]  # indices from 0: no negative-index check, so the loop vectorises
        for o in range(c1 - c0):
            v = np.float64(seg[o])
            seg[o] = np.float32(0.5 * v * (1.0 + _erf(v * 0.7071067811865476)))


@_vkernel
def _residual(x, h, t, c0, c1):
    """x[:t, c0:c1] += h[:t, c0:c1]."""
    for r in range(t):
        xs, hs = x[r, c0:c1], h[r, c0:c1]
        for o in range(c1 - c0):
            xs[o] += hs[o]


@_vkernel
def _stage(k, part, w, off, dims, eps, k_cache, v_cache, x, ln, h, qkv, att, mlp, out, scores, acc, obs, ptok, start,
           t):
    """Half `part` (0 or 1) of stage k of the pass over positions start..start+t-1. Stage 0 embeds (rows split),
    each block runs LayerNorm1 + qkv (columns split by panels), attention (heads), proj + residual, LayerNorm2 +
    fc1 + GELU, fc2 + residual, and the last stage the final LayerNorm and head, leaving logits in out[:t]. A stage
    reads what the stage before wrote, both halves of it. The same code computes a half whichever thread runs it,
    so the bits do not depend on the threads. LayerNorms are computed by each half into its own ln[part] (a few
    hundred flops a row, cheaper than a stage)."""
    d, n_heads, n_layers = dims[D_MODEL], dims[D_HEADS], dims[D_LAYERS]
    mine = ln[part]
    c0, c1 = panel_columns(h.shape[1], part, 2)  # this half's columns of the d-wide outputs (proj, fc2)
    c1 = min(c1, d)
    if k == 0:
        for r in range(part, t, 2):
            if start + r == 0:  # the observation embedding (obs_proj) instead of a token
                _linear(obs, 1, w, off, OBS_W, mine, 0, 1)
                x[r, :d] = mine[0, :d]
            else:
                tok = ptok[r]
                x[r, :d] = w[off[TOK_EMB] + tok * d:off[TOK_EMB] + (tok + 1) * d]
            pos = w[off[POS_EMB] + (start + r) * d:off[POS_EMB] + (start + r + 1) * d]
            for o in range(d):
                x[r, o] += pos[o]
        return
    if k == stages(n_layers) - 1:
        _layer_norm(x, t, w, off, LNF_W, eps, mine)
        _linear(mine, t, w, off, HEAD_W, out, part, 2)
        return
    layer, j = (k - 1) // 5, (k - 1) % 5
    lw = N_GLOBAL + layer * N_LAYER  # this layer's first tensor index (_pack's order)
    if j == 0:
        _layer_norm(x, t, w, off, lw + LN1_W, eps, mine)
        _linear(mine, t, w, off, lw + QKV_W, qkv, part, 2)
    elif j == 1:
        _attention(qkv, t, start, d, n_heads, k_cache[layer], v_cache[layer], scores[part], acc[part], att, part, 2)
    elif j == 2:
        _linear(att, t, w, off, lw + PROJ_W, h, part, 2)
        _residual(x, h, t, c0, c1)
    elif j == 3:
        _layer_norm(x, t, w, off, lw + LN2_W, eps, mine)
        _linear(mine, t, w, off, lw + FC1_W, mlp, part, 2)
        f0, f1 = panel_columns(mlp.shape[1], part, 2)
        _gelu(mlp, t, f0, min(f1, 4 * d))
    else:
        _linear(mlp, t, w, off, lw + FC2_W, h, part, 2)
        _residual(x, h, t, c0, c1)


@_vkernel
def _pass(ctl, w, off, dims, eps, k_cache, v_cache, x, ln, h, qkv, att, mlp, out, scores, acc, obs, ptok, tokens,
          start, t, logits):
    """One cached pass over positions start..start+t-1 -> logits[:t] (float32); position 0 embeds obs, tokens[r]
    is the token at position start + r (copied to ptok, which the worker reads).

    Stage by stage: publish the stage, run half 0, then take half 1 unless the worker thread has claimed it, in
    which case wait for it. A worker that is napping, busy elsewhere or descheduled before it claims a half is
    never waited for: with no worker at all, this thread runs every half."""
    n_bins, seq_len = dims[D_BINS], dims[D_SEQ]
    if t < 1 or start < 0 or start + t > seq_len:
        raise ValueError("packed engine: the pass does not fit the sequence (start + T > seq_len)")
    for r in range(t):
        if start + r > 0 and (tokens[r] < 0 or tokens[r] >= n_bins):
            raise ValueError("packed engine: token id out of range 0..n_bins-1")
        ptok[r] = tokens[r]
    sid = ctl[STAGE]
    ctl[BASE], ctl[START], ctl[ROWS] = sid + 1, start, t  # published by the first stage's release below
    for k in range(stages(dims[D_LAYERS])):
        sid += 1
        claim = CLAIM + (sid & 1) * LINE
        store(ctl, claim, sid * 4)
        store(ctl, STAGE, sid)
        _stage(k, 0, w, off, dims, eps, k_cache, v_cache, x, ln, h, qkv, att, mlp, out, scores, acc, obs, ptok,
               start, t)
        if cas(ctl, claim, sid * 4, sid * 4 + 2) == sid * 4:
            _stage(k, 1, w, off, dims, eps, k_cache, v_cache, x, ln, h, qkv, att, mlp, out, scores, acc, obs, ptok,
                   start, t)
        else:  # the worker claimed half 1 and is computing it
            while load(ctl, DONE + (sid & 1) * LINE) != sid:
                pass
    logits[:t] = out[:t, :n_bins]


@_vkernel
def _worker(ctl, w, off, dims, eps, k_cache, v_cache, x, ln, h, qkv, att, mlp, out, scores, acc, obs, ptok, spins):
    """The second thread: claim half 1 of each stage the engine thread publishes and compute it; return after
    `spins` idle spins (to nap) with the halves computed, or -1 once STOPPED."""
    seen, idle, halves = load(ctl, STAGE), 0, 0
    while load(ctl, STOPPED) == 0:
        sid = load(ctl, STAGE)
        if sid == seen:
            idle += 1
            if idle > spins:
                return halves
            continue
        seen, idle = sid, 0
        base, start, t = ctl[BASE], ctl[START], ctl[ROWS]  # this pass's, unless the claim below fails
        claim = CLAIM + (sid & 1) * LINE
        if cas(ctl, claim, sid * 4, sid * 4 + 1) == sid * 4:  # the engine thread is still in stage sid
            _stage(sid - base, 1, w, off, dims, eps, k_cache, v_cache, x, ln, h, qkv, att, mlp, out, scores, acc,
                   obs, ptok, start, t)
            halves += 1
            ctl[SHARED] += 1
            store(ctl, DONE + (sid & 1) * LINE, sid)
    return -1


@_vkernel
def _greedy(ctl, w, off, dims, eps, k_cache, v_cache, x, ln, h, qkv, att, mlp, out, scores, acc, obs, ptok, tokens,
            first, last, logits):
    """Target-only greedy decoding of positions first..last-1: tokens[p] = argmax of the pass at position p
    (first index on ties, as numpy), fed back as the next pass's token (tokens[:first] are committed)."""
    for p in range(first, last):
        _pass(ctl, w, off, dims, eps, k_cache, v_cache, x, ln, h, qkv, att, mlp, out, scores, acc, obs, ptok,
              tokens[max(p - 1, 0):], p, 1, logits)
        best = 0
        for o in range(1, logits.shape[1]):
            if logits[0, o] > logits[0, best]:
                best = o
        tokens[p] = best


def _serve(ctl: np.ndarray, arrays: tuple) -> None:
    """The worker thread's body: follow the engine's stages (_worker, without the GIL), nap when it idles (spinning
    long after work or when the engine ran a stage during the nap, briefly otherwise); return once STOPPED."""
    spins = SPIN_LIMIT
    while (halves := _worker(ctl, *arrays, spins)) >= 0:
        seen = ctl[STAGE]
        time.sleep(NAP_S)
        spins = SPIN_LIMIT if halves or ctl[STAGE] != seen else SPIN_IDLE  # a chunk under way: catch its next stage


class PackedEngine(OneCallEngine):
    """Engine (see engines/backends/engine.py) running an ActionTransformer as one numba call per pass: fp32 weights
    packed into SIMD panels, fp32 fused multiply-adds (see the module docstring), on the CPU.

    model: the fp32 ActionTransformer (its weights are copied; the model is not kept). threads: 1, or 2 to share
    each pass with a worker thread (it follows the passes of a chunk and naps between chunks; any half it has not
    claimed runs on this thread, and the logits are the same bits either way). Raises ValueError for another model
    class, a precision other than fp32, a device other than cpu or threads outside 1..2; forward raises ValueError
    for a pass that does not fit seq_len or a token id outside 0..n_bins-1.
    """

    backend = "packed"

    def __init__(self, model, precision: str = "fp32", device: str = "cpu", threads: int = 1):
        _check(precision, device, "packed")
        if not isinstance(model, ActionTransformer):
            raise ValueError(f"the packed backend runs the ActionTransformer of engines/models/model.py only, not "
                             f"{type(model).__name__}: use torch or onnxruntime")
        if threads not in (1, 2):
            raise ValueError(f"packed engine: threads must be 1 or 2, got {threads}")
        if threads == 2 and len(os.sched_getaffinity(0)) < 2:  # pinned to one CPU: a worker would only take turns
            print("packed engine: this process may run on one CPU only (its affinity): one thread, not 2",
                  file=sys.stderr)
            threads = 1
        c = self.cfg = model.cfg
        self.precision, self.device, self.threads = precision, device, threads
        eps = {m.eps for m in model.modules() if hasattr(m, "eps") and hasattr(m, "normalized_shape")}
        if len(eps) != 1:
            raise ValueError(f"packed engine: expected one LayerNorm eps, got {sorted(eps)}")
        eps = float(eps.pop())
        w, off = _pack(model.state_dict(), c.n_layers)
        dims = np.array([c.obs_dim, c.d_model, c.n_heads, c.n_layers, c.n_bins, c.seq_len], np.int64)
        d, s, hd, f32 = c.d_model, c.seq_len, c.d_model // c.n_heads, np.float32
        self._ctl = np.zeros(SHARED + LINE, np.int64)
        # the arrays every pass reads and writes, in the kernels' order: weights, caches (keys transposed, written
        # by position), and work buffers as wide as the panels that write them
        self._arrays = (
            w, off, dims, eps,
            np.zeros((c.n_layers, c.n_heads, hd, s), f32), np.zeros((c.n_layers, c.n_heads, s, hd), f32),
            np.zeros((s, d), f32),  # x, the residual stream
            np.zeros((2, s, padded(d)), f32),  # each part's LayerNorm output
            np.zeros((s, padded(d)), f32),  # proj / fc2 output
            np.zeros((s, padded(3 * d)), f32), np.zeros((s, d), f32),  # qkv, attention output
            np.zeros((s, padded(4 * d)), f32), np.zeros((s, padded(c.n_bins)), f32),  # MLP hidden, head output
            np.zeros((2, s)), np.zeros((2, hd)),  # each part's attention scores and weighted sum, float64
            np.zeros((1, c.obs_dim), f32),  # the chunk's observation, float32-rounded as torch's fp32 model
            np.zeros(s, np.int64))  # the pass's tokens
        self._obs, self._ptok = self._arrays[-2], self._arrays[-1]
        self._tokens = np.zeros(s, np.int64)
        self._run_tokens = np.zeros(c.n_tokens, np.int64)
        self._logits1 = np.empty((1, c.n_bins), f32)
        self._worker = None
        self.plan = None  # no plan file: the weights are packed at start-up
        kernels_ready(self.backend, self._first_calls, (_pass, _greedy) + ((_worker,) if threads == 2 else ()))
        if threads == 2:
            self._worker = threading.Thread(target=_serve, args=(self._ctl, self._arrays), name="packed-engine-worker",
                                            daemon=True)
            self._worker.start()

    def _first_calls(self) -> None:
        """The pass, the greedy pass and the worker's stage loop (kernels_ready): each compiled now, not in a chunk."""
        super()._first_calls()
        if self.threads == 2:
            self._ctl[STOPPED] = 1
            _worker(self._ctl, *self._arrays, 0)  # returns at once: stopped
            self._ctl[STOPPED] = 0

    @classmethod
    def from_policy(cls, policy, precision: str = "fp32", device: str = "cpu", threads: int = 1) -> "PackedEngine":
        """Engine for policy.model on min(threads, 2) threads (a pass splits in two halves at most)."""
        _check(precision, device, "packed")
        return cls(policy.model, precision, device, min(max(threads, 1), 2))

    @property
    def halves_shared(self) -> int:
        """Stage halves so far that the worker thread computed (0 with threads=1; a pass has 2 * stages(n_layers)
        halves)."""
        return int(self._ctl[SHARED])

    def close(self) -> None:
        """Stop the worker thread (idempotent); passes run on this thread alone afterwards."""
        if getattr(self, "_worker", None) is not None:
            self._ctl[STOPPED] = 1  # the worker's next look (an atomic load) sees it
            self._worker.join()
            self._worker = None

    def __del__(self):
        self.close()

    def _run_pass(self, tokens: np.ndarray, start: int, t: int, logits: np.ndarray) -> None:
        _pass(self._ctl, *self._arrays, tokens, start, t, logits)

    def _run_greedy(self, tokens: np.ndarray, first: int, last: int) -> None:
        _greedy(self._ctl, *self._arrays, tokens, first, last, self._logits1)
