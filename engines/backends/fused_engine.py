"""Fused CPU backend: the whole ActionTransformer pass (engines/models/model.py) as one numba-compiled call.

For a small policy on a CPU, framework dispatch sets the time of a pass, not arithmetic: the default
policy needs about 0.1 M multiply-adds per token, while torch eager spends ~190 us and onnxruntime ~55 us
per pass launching ~50 small operators. Here one numba call runs the pass top to bottom: embeddings (the
observation at position 0), then per layer LayerNorm -> qkv -> attention over the static KV cache -> proj
-> LayerNorm -> MLP with the exact (erf) GELU, then the final LayerNorm and head.

Numerics: the weights are the torch state dict's float32 values, copied once into one contiguous array in
torch's layout; every activation, sum and the KV cache are float64, and logits are rounded to float32 at
the end. The logits are those of the model in exact arithmetic up to float32 rounding, so they differ from
torch fp32's by torch's own rounding error (max 4.6e-5 over 1000 held-out chunks) and greedy tokens
equal torch fp32's unless a top-2 logit margin is below that (1000 of 1000 held-out chunks identical; the
smallest margin there was 1.9e-6). Float64 costs about 2x float32's SIMD width; the policy is small.

The KV cache (2, n_layers, n_heads, seq_len, head_dim) float64 is written by position (gpt-fast), so
rollback is a no-op, as in the other engines. Work buffers are preallocated; a pass is ONE numba call, and
`greedy_chunk` decodes a whole target-only chunk in one call.

Compile cost: the kernels compile on first use (cold: ~25 s on a loaded 2-core VM) and numba caches them
on disk (warm: ~1 s to load). An engine compiles (or loads) its kernels when it is made, taking turns with other
processes that start together (engines/backends/kernel_cache.py: where the cache lives, the compile lock, what
happens to an unreadable cache file).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from edgeinfer.engines.backends.kernel_cache import cached_njit, kernels_ready
from edgeinfer.engines.models.model import ActionTransformer

# tensors of the flat weight array, in order; per-layer ones repeat for each block (_pack)
_GLOBAL = ("obs_w", "obs_b", "tok_emb", "pos_emb", "lnf_w", "lnf_b", "head_w", "head_b")
_LAYER = ("ln1_w", "ln1_b", "qkv_w", "qkv_b", "proj_w", "proj_b", "ln2_w", "ln2_b", "fc1_w", "fc1_b",
          "fc2_w", "fc2_b")
OBS_W, OBS_B, TOK_EMB, POS_EMB, LNF_W, LNF_B, HEAD_W, HEAD_B = range(len(_GLOBAL))
LN1_W, LN1_B, QKV_W, QKV_B, PROJ_W, PROJ_B, LN2_W, LN2_B, FC1_W, FC1_B, FC2_W, FC2_B = range(len(_LAYER))
_TORCH_NAME = {"obs_w": "obs_proj.weight", "obs_b": "obs_proj.bias", "tok_emb": "tok_emb.weight",
               "pos_emb": "pos_emb.weight", "lnf_w": "ln_f.weight", "lnf_b": "ln_f.bias", "head_w": "head.weight",
               "head_b": "head.bias", "ln1_w": "ln1.weight", "ln1_b": "ln1.bias", "qkv_w": "qkv.weight",
               "qkv_b": "qkv.bias", "proj_w": "proj.weight", "proj_b": "proj.bias", "ln2_w": "ln2.weight",
               "ln2_b": "ln2.bias", "fc1_w": "mlp.0.weight", "fc1_b": "mlp.0.bias", "fc2_w": "mlp.2.weight",
               "fc2_b": "mlp.2.bias"}
N_GLOBAL, N_LAYER = len(_GLOBAL), len(_LAYER)
# dims: the config as an int64 array, for the kernel
D_OBS, D_MODEL, D_HEADS, D_LAYERS, D_BINS, D_SEQ = range(6)


def _pack(state: dict, n_layers: int) -> tuple[np.ndarray, np.ndarray]:
    """(weights (n,) float32, offsets (N_GLOBAL + N_LAYER * n_layers + 1,) int64) from a torch state dict:
    tensor i is weights[offsets[i]:offsets[i + 1]], in torch's layout (nn.Linear: (out, in), row-major)."""
    names = [_TORCH_NAME[n] for n in _GLOBAL]
    names += [f"blocks.{i}.{_TORCH_NAME[n]}" for i in range(n_layers) for n in _LAYER]
    parts = [state[name].detach().cpu().float().numpy().ravel() for name in names]
    offsets = np.cumsum([0] + [p.size for p in parts]).astype(np.int64)
    return np.concatenate(parts).astype(np.float32), offsets


# --- the kernel: float64 arithmetic on float32 weights ---------------------------------------------

# reassociation and FMA contraction let LLVM vectorise the float64 dot products (3x faster); no nnan/ninf/afn,
# so the attention's -inf start and exp/erf stay exact
_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}


def _kernel(fn=None, **options):
    """kernel_cache.cached_njit with this engine's fastmath flags; options: more njit options
    (`@_kernel(error_model="numpy")`)."""
    if fn is None:
        return lambda f: _kernel(f, **options)
    return cached_njit(fn, fastmath=_FASTMATH, **options)


@_kernel
def _linear(x, t, w, off, wi, y):
    """y[:t] = x[:t] @ W.T + b: W (n_out, n_in) is tensor wi of the flat weights, b (n_out,) tensor wi + 1.
    Four outputs at a time share each load of x (measured 15-25 % faster than one at a time)."""
    n_in, n_out = x.shape[1], y.shape[1]
    wm = w[off[wi]:off[wi + 1]].reshape((n_out, n_in))
    b = w[off[wi + 1]:off[wi + 2]]
    o = 0
    while o + 4 <= n_out:
        w0, w1, w2, w3 = wm[o], wm[o + 1], wm[o + 2], wm[o + 3]
        for r in range(t):  # r inner: the four weight rows stay in L1 for all t rows
            xr = x[r]
            s0 = s1 = s2 = s3 = 0.0
            for i in range(n_in):
                s0 += xr[i] * w0[i]
                s1 += xr[i] * w1[i]
                s2 += xr[i] * w2[i]
                s3 += xr[i] * w3[i]
            y[r, o], y[r, o + 1], y[r, o + 2], y[r, o + 3] = s0 + b[o], s1 + b[o + 1], s2 + b[o + 2], s3 + b[o + 3]
        o += 4
    for o in range(o, n_out):
        for r in range(t):
            s0 = 0.0
            for i in range(n_in):
                s0 += x[r, i] * wm[o, i]
            y[r, o] = s0 + b[o]


@_kernel
def _layer_norm(x, t, w, off, wi, eps, y):
    """y[:t] = LayerNorm(x[:t]) (biased variance, as torch), weight at off[wi], bias at off[wi + 1]."""
    n = x.shape[1]
    gb, bb = off[wi], off[wi + 1]
    for r in range(t):
        mean = 0.0
        for i in range(n):
            mean += x[r, i]
        mean /= n
        var = 0.0
        for i in range(n):
            var += (x[r, i] - mean) ** 2
        inv = 1.0 / math.sqrt(var / n + eps)
        for i in range(n):
            y[r, i] = (x[r, i] - mean) * inv * w[gb + i] + w[bb + i]


@_kernel
def _attention(qkv, t, start, layer, n_heads, kv, scores, y):
    """Write this pass's keys and values into the cache at positions start.., then causal attention:
    the query at position p attends to cache positions <= p (the mask of model.Block)."""
    d = y.shape[1]
    hd = d // n_heads
    scale = 1.0 / math.sqrt(hd)
    for h in range(n_heads):
        kc, vc = kv[0, layer, h], kv[1, layer, h]  # (seq_len, head_dim) each
        for r in range(t):
            kc[start + r] = qkv[r, d + h * hd:d + (h + 1) * hd]
            vc[start + r] = qkv[r, 2 * d + h * hd:2 * d + (h + 1) * hd]
        for r in range(t):
            p = start + r
            q = qkv[r, h * hd:(h + 1) * hd]
            top = -np.inf
            for j in range(p + 1):
                kj = kc[j]
                s = 0.0
                for e in range(hd):
                    s += q[e] * kj[e]
                scores[j] = s * scale
                top = max(top, scores[j])
            softmax_mix(scores, p, top, vc, y[r, h * hd:(h + 1) * hd])


@_kernel(error_model="numpy")
def softmax_mix(scores, p, top, vc, out):
    """out[:] = sum over j <= p of softmax(scores[:p + 1])[j] * vc[j], the attention's value mix in float64;
    top: max(scores[:p + 1]) (subtracted before exp); scores[:p + 1] become the unnormalised weights. One kernel
    for the fused and the packed engine."""
    total = 0.0
    for j in range(p + 1):
        scores[j] = math.exp(scores[j] - top)
        total += scores[j]
    out[:] = 0.0
    for j in range(p + 1):
        pj = scores[j] / total
        vj = vc[j]
        for e in range(out.shape[0]):
            out[e] += pj * vj[e]


@_kernel
def _add(x, t, h):
    """The residual: x[:t] += h[:t]."""
    for r in range(t):
        for o in range(x.shape[1]):
            x[r, o] += h[r, o]


@_kernel
def _feed_forward(x, t, w, off, lw, eps, h, mlp):
    """A block's second half on rows 0..t-1 (lw: the block's first tensor): x += FC2(GELU(FC1(LayerNorm2(x)))),
    nn.GELU() in its exact, erf form. h, mlp: work buffers."""
    _layer_norm(x, t, w, off, lw + LN2_W, eps, h)
    _linear(h, t, w, off, lw + FC1_W, mlp)
    for r in range(t):
        for o in range(mlp.shape[1]):
            v = mlp[r, o]
            mlp[r, o] = 0.5 * v * (1.0 + math.erf(v * 0.7071067811865476))
    _linear(mlp, t, w, off, lw + FC2_W, h)
    _add(x, t, h)


@_kernel
def _head(x, t, w, off, eps, h, out, logits):
    """The final LayerNorm and head on rows 0..t-1 -> logits[:t] (rounded to float32). h, out: work buffers."""
    _layer_norm(x, t, w, off, LNF_W, eps, h)
    _linear(h, t, w, off, HEAD_W, out)
    for r in range(t):
        for o in range(logits.shape[1]):
            logits[r, o] = np.float32(out[r, o])


@_kernel
def _pass(w, off, dims, eps, kv, x, h, qkv, att, mlp, out, scores, obs, tokens, start, t, logits):
    """One cached pass over positions start..start+t-1 -> logits[:t] (float32). Position 0 embeds obs."""
    d, n_heads, n_layers, n_bins, seq_len = dims[D_MODEL], dims[D_HEADS], dims[D_LAYERS], dims[D_BINS], dims[D_SEQ]
    if t < 1 or start < 0 or start + t > seq_len:
        raise ValueError("fused engine: the pass does not fit the sequence (start + T > seq_len)")
    for r in range(t):
        if start + r == 0:  # the observation embedding (obs_proj) instead of a token
            _linear(obs, 1, w, off, OBS_W, x)
        else:
            tok = tokens[r]
            if tok < 0 or tok >= n_bins:
                raise ValueError("fused engine: token id out of range 0..n_bins-1")
            for o in range(d):
                x[r, o] = w[off[TOK_EMB] + tok * d + o]
        for o in range(d):
            x[r, o] += w[off[POS_EMB] + (start + r) * d + o]
    for layer in range(n_layers):
        lw = N_GLOBAL + layer * N_LAYER  # this layer's first tensor index (_pack's order)
        _layer_norm(x, t, w, off, lw + LN1_W, eps, h)
        _linear(h, t, w, off, lw + QKV_W, qkv)
        _attention(qkv, t, start, layer, n_heads, kv, scores, att)
        _linear(att, t, w, off, lw + PROJ_W, h)
        _add(x, t, h)
        _feed_forward(x, t, w, off, lw, eps, h, mlp)
    _head(x, t, w, off, eps, h, out, logits)


@_kernel
def _greedy(w, off, dims, eps, kv, x, h, qkv, att, mlp, out, scores, obs, tokens, first, last, logits):
    """Target-only greedy decoding of positions first..last-1: tokens[p] = argmax of the float32 logits of the
    pass at position p (first index on ties, as numpy), fed back as the next pass's token (tokens[:first] are
    the committed tokens; position 0 embeds obs)."""
    for p in range(first, last):
        # t = 1 read from the logits buffer, not a literal: with a constant t, LLVM specialised the inlined pass
        # into slower code (measured 1.95 ms per chunk against 1.25 ms pass by pass)
        _pass(w, off, dims, eps, kv, x, h, qkv, att, mlp, out, scores, obs, tokens[max(p - 1, 0):], p,
              logits.shape[0], logits)
        best = 0
        for o in range(1, logits.shape[1]):
            if logits[0, o] > logits[0, best]:
                best = o
        tokens[p] = best


# --- the engine ---------------------------------------------------------------------------------------

class OneCallEngine:
    """What the fused and packed engines share: a pass, a whole greedy chunk or a target-only stretch is ONE numba
    call. A subclass sets cfg, backend, _obs (1, obs_dim) float32, _tokens (seq_len,) int64, _run_tokens (n_tokens,)
    int64 and _logits1 (1, n_bins) float32, and runs its kernels in _run_pass(tokens, start, t, logits) (logits (t,
    n_bins) of positions start..start+t-1; position 0 embeds _obs) and _run_greedy(tokens, first, last) (tokens[p]
    for p in first..last-1, each the argmax of its pass, first on ties)."""

    def forward(self, obs: np.ndarray | None, tokens: Sequence[int], start: int) -> np.ndarray:
        """logits (T, n_bins) float32 for positions start.. (see engines/backends/engine.py)."""
        t = len(tokens)
        if start == 0:
            self._obs[0] = np.asarray(obs, np.float32)
            self._tokens[1:1 + t] = tokens  # position 0 embeds obs; its token id is ignored
            t += 1
        else:
            self._tokens[:t] = tokens
        logits = np.empty((t, self.cfg.n_bins), np.float32)
        self._run_pass(self._tokens, start, t, logits)
        return logits

    def rollback(self, n: int) -> None:
        """Nothing to do: the cache is written by position (see engines/backends/engine.py)."""

    def _first_calls(self) -> None:
        """One pass and one greedy pass (a subclass's constructor runs them in kernels_ready): the kernels for the
        argument types every later call has. Their cache rows are overwritten by the first real pass."""
        self._run_pass(self._tokens, 0, 1, self._logits1)
        self._run_greedy(self._run_tokens, 0, 1)

    def greedy_chunk(self, obs: np.ndarray) -> list[int]:
        """Target-only greedy decoding of a whole chunk in ONE numba call: obs (obs_dim,) float32 -> n_tokens
        ints, the same tokens as a pass-by-pass decode (argmax of the same float32 logits, first on ties)."""
        self._obs[0] = np.asarray(obs, np.float32)
        tokens = np.zeros(self.cfg.n_tokens, np.int64)
        self._run_greedy(tokens, 0, len(tokens))
        return tokens.tolist()

    def greedy_run(self, committed: Sequence[int], m: int) -> list[int]:
        """m target-only greedy passes in ONE numba call after the committed tokens (>= 1: the prefill has run):
        the m next tokens, each the argmax of its pass's float32 logits, as m forward calls would give
        (core/speculative.py runs a planner's target-only stretch here). Raises ValueError past n_tokens."""
        n = len(committed)
        if n < 1 or n + m > self.cfg.n_tokens:
            raise ValueError(f"{self.backend} engine: greedy_run of {m} after {n} tokens does not fit "
                             f"{self.cfg.n_tokens}")
        tokens = self._run_tokens
        tokens[:n] = committed
        self._run_greedy(tokens, n, n + m)
        return tokens[n:n + m].tolist()


class FusedEngine(OneCallEngine):
    """Engine (see engines/backends/engine.py) running an ActionTransformer as one numba call per pass, fp32 weights,
    float64 arithmetic (see the module docstring), on the CPU, single-threaded.

    model: the fp32 ActionTransformer (its weights are copied; the model is not kept). Raises ValueError for
    another model class, a precision other than fp32 or a device other than cpu; forward raises ValueError
    for a pass that does not fit seq_len or a token id outside 0..n_bins-1.
    """

    backend = "fused"

    def __init__(self, model, precision: str = "fp32", device: str = "cpu"):
        _check(precision, device)
        if not isinstance(model, ActionTransformer):
            raise ValueError(f"the fused backend runs the ActionTransformer of engines/models/model.py only, not "
                             f"{type(model).__name__}: use torch or onnxruntime")
        c = self.cfg = model.cfg
        self.precision, self.device = precision, device
        eps = {m.eps for m in model.modules() if hasattr(m, "eps") and hasattr(m, "normalized_shape")}
        if len(eps) != 1:
            raise ValueError(f"fused engine: expected one LayerNorm eps, got {sorted(eps)}")
        self._eps = float(eps.pop())
        self._w, self._off = _pack(model.state_dict(), c.n_layers)
        self._dims = np.array([c.obs_dim, c.d_model, c.n_heads, c.n_layers, c.n_bins, c.seq_len], np.int64)
        d, s = c.d_model, c.seq_len
        self._kv = np.zeros((2, c.n_layers, c.n_heads, s, d // c.n_heads))  # float64, written by position
        # work buffers for passes of up to seq_len positions: x, LayerNorm out / residual branch, qkv, attention,
        # MLP hidden, head out, attention scores
        self._work = (np.zeros((s, d)), np.zeros((s, d)), np.zeros((s, 3 * d)), np.zeros((s, d)),
                      np.zeros((s, 4 * d)), np.zeros((s, c.n_bins)), np.zeros(s))
        self._obs = np.zeros((1, c.obs_dim))  # float32-rounded, as torch casts obs to float32 first
        self._tokens = np.zeros(s, np.int64)
        self._run_tokens = np.zeros(c.n_tokens, np.int64)  # greedy_run's committed and new tokens
        self._logits1 = np.empty((1, c.n_bins), np.float32)  # the logits of one greedy pass
        self.plan = None  # no plan file: the weights are copied at start-up
        kernels_ready(self.backend, self._first_calls, (_pass, _greedy))

    @classmethod
    def from_policy(cls, policy, precision: str = "fp32", device: str = "cpu", threads: int = 1) -> "FusedEngine":
        """Engine for policy.model. threads is accepted for the common signature and unused (one thread)."""
        _check(precision, device)
        return cls(policy.model, precision, device)

    def _run_pass(self, tokens: np.ndarray, start: int, t: int, logits: np.ndarray) -> None:
        _pass(self._w, self._off, self._dims, self._eps, self._kv, *self._work, self._obs, tokens, start, t, logits)

    def _run_greedy(self, tokens: np.ndarray, first: int, last: int) -> None:
        _greedy(self._w, self._off, self._dims, self._eps, self._kv, *self._work, self._obs, tokens, first, last,
                self._logits1)


def _check(precision: str, device: str, backend: str = "fused") -> None:
    if precision != "fp32":
        raise ValueError(f"precision={precision!r}: the {backend} backend builds fp32 only")
    if device != "cpu":
        raise ValueError(f"device={device!r}: the {backend} backend runs on cpu only")
