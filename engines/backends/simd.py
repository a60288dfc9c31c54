"""Explicit-SIMD fp32 matrix products for numba kernels: y[:t] = x[:t] @ W.T + b with weights packed once.

A target pass over t tokens reads every weight once whatever t is (t <= TILE_ROWS), so a verify pass of k + 1
tokens costs little more than a single-token pass while weights dominate (the case of speculative decoding on a
CPU: a single-token pass of the 3.2 M-parameter policy streams 12.6 MB of weights from L3 and is bound by that).

Packing: W (n_out, n_in) in torch's nn.Linear layout is stored as panels of PANEL = 32 outputs, each panel
(n_in, 32) contiguous, outputs padded with zeros to a multiple of 32 (`pack_linear`). The micro-kernel (`_tile`)
keeps R rows x 32 outputs of accumulators in vector registers (R x 2 vectors of 16 float32), streams the
panel once, and for each input i does acc[r] = fma(x[r, i], W[:, i], acc[r]).

Exactness: every output is bias + sum over i in increasing order, one fused multiply-add (single rounding) per
step, whatever the number of rows, their grouping into tiles or the CPU (llvm.fma is exactly rounded and LLVM
splits a 16-lane vector into the lanes this CPU has; no reassociation). Row r of a t-row product is therefore
bitwise the product of row r alone: a verify pass gives the logits of single-token passes, bit for bit, and
greedy speculative decoding the same tokens as target-only decoding on this engine.

Numba has no vector types, so the micro-kernel is LLVM IR built with llvmlite in a numba @intrinsic (the way
numba's own intrinsics are written); the rest is plain numba. Measured on a 2-core AMD EPYC (Zen 4) VM, the
16 linears of the large policy (3.1 M weights) take ~175 us for one row (memory bound, ~70 GB/s from L3) and
~55 us more per further row (compute bound, ~115 GFLOP/s): see `edgeinfer bench engines`' pass-cost curve.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

LANES = 16  # float32 lanes of one LLVM vector (one AVX-512 register; two AVX2 or four NEON ones)
VECTORS = 2  # vectors per panel row
PANEL = LANES * VECTORS  # outputs per panel
TILE_ROWS = 9  # rows per micro-kernel call: 9 x 2 accumulators + 2 weights + 1 broadcast fit 32 zmm registers


def _make_tile(rows: int):
    """The micro-kernel for `rows` rows: y[yoff + r*ystride + o] = b[boff + o] + sum_i x[xoff + r*xstride + i] *
    w[woff + i*PANEL + o] for r < rows, o < PANEL (one panel), the sum in increasing i with one fma per step."""

    @intrinsic
    def tile(typingctx, x, xoff, xstride, w, woff, n_in, b, boff, y, yoff, ystride):
        i64t = types.int64
        sig = types.void(x, i64t, i64t, w, i64t, i64t, b, i64t, y, i64t, i64t)

        def codegen(context, builder, signature, args):
            x_a, xoff_v, xstride_v, w_a, woff_v, n_in_v, b_a, boff_v, y_a, yoff_v, ystride_v = args
            ptrs = [context.make_array(signature.args[k])(context, builder, a).data
                    for k, a in ((0, x_a), (3, w_a), (6, b_a), (8, y_a))]
            xp, wp, bp, yp = ptrs
            i64 = ir.IntType(64)
            vec = ir.VectorType(ir.FloatType(), LANES)
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec, vec, vec]),
                                                 f"llvm.fma.v{LANES}f32")

            def const(v):
                return ir.Constant(i64, v)

            def vec_at(ptr, off):
                return builder.bitcast(builder.gep(ptr, [off]), vec.as_pointer())

            bias = [builder.load(vec_at(bp, builder.add(boff_v, const(v * LANES))), align=4) for v in range(VECTORS)]
            entry = builder.block
            loop, done = builder.append_basic_block("tile_loop"), builder.append_basic_block("tile_done")
            builder.cbranch(builder.icmp_signed(">", n_in_v, const(0)), loop, done)

            builder.position_at_end(loop)
            i = builder.phi(i64)
            i.add_incoming(const(0), entry)
            acc = []
            for _ in range(rows):
                for v in range(VECTORS):
                    phi = builder.phi(vec)
                    phi.add_incoming(bias[v], entry)
                    acc.append(phi)
            wrow = builder.add(woff_v, builder.mul(i, const(PANEL)))
            wv = [builder.load(vec_at(wp, builder.add(wrow, const(v * LANES))), align=4) for v in range(VECTORS)]
            undef = ir.Constant(vec, ir.Undefined)
            splat = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES)
            new = []
            for r in range(rows):
                xr = builder.add(builder.add(xoff_v, builder.mul(const(r), xstride_v)), i)
                xs = builder.load(builder.gep(xp, [xr]))
                xb = builder.shuffle_vector(builder.insert_element(undef, xs, ir.Constant(ir.IntType(32), 0)),
                                            undef, splat)
                new += [builder.call(fma, [xb, wv[v], acc[r * VECTORS + v]]) for v in range(VECTORS)]
            i_next = builder.add(i, const(1))
            i.add_incoming(i_next, loop)
            for phi, value in zip(acc, new):
                phi.add_incoming(value, loop)
            builder.cbranch(builder.icmp_signed("<", i_next, n_in_v), loop, done)

            builder.position_at_end(done)
            outs = []  # every phi first: LLVM wants them at the top of the block
            for k, value in enumerate(new):
                outs.append(builder.phi(vec))
                outs[-1].add_incoming(bias[k % VECTORS], entry)
                outs[-1].add_incoming(value, loop)
            for r in range(rows):
                for v in range(VECTORS):
                    off = builder.add(builder.add(yoff_v, builder.mul(const(r), ystride_v)), const(v * LANES))
                    builder.store(outs[r * VECTORS + v], vec_at(yp, off), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return tile


_T1, _T2, _T3, _T4, _T5, _T6, _T7, _T8, _T9 = (_make_tile(r) for r in range(1, TILE_ROWS + 1))


@njit(cache=True, nogil=True, boundscheck=False)
def linear(x, t, wp, b, y, part, parts):
    """y[:t, cols] = x[:t] @ W[cols].T + b[cols] for the packed W of `pack_linear`, cols: share `part` of `parts`
    of its panels (0, 1 for all of them; 0, 2 and 1, 2 for two threads' halves).

    x (>= t, >= n_in) float32 C-contiguous (columns past n_in ignored); wp (n_pad * n_in,) float32 panels; b (n_pad,)
    float32 (n_pad a multiple of PANEL); y (>= t, >= n_pad) float32 C-contiguous. Rows run in tiles of up to
    TILE_ROWS, each tile streaming its panels once. Raises ValueError when the shapes do not match."""
    n_pad = b.shape[0]
    n_in = wp.shape[0] // n_pad
    xs, ys = x.shape[1], y.shape[1]
    if ys < n_pad or wp.shape[0] != n_pad * n_in or xs < n_in or x.shape[0] < t or y.shape[0] < t:
        raise ValueError("simd.linear: shapes of x, packed weights, bias and y do not match")
    n_panels = n_pad // PANEL
    for panel in range(n_panels * part // parts, n_panels * (part + 1) // parts):
        o0 = panel * PANEL
        woff = o0 * n_in
        r = 0
        while r < t:
            rows = min(t - r, TILE_ROWS)
            a = (x, r * xs, xs, wp, woff, n_in, b, o0, y, r * ys + o0, ys)
            if rows == 1:
                _T1(*a)
            elif rows == 2:
                _T2(*a)
            elif rows == 3:
                _T3(*a)
            elif rows == 4:
                _T4(*a)
            elif rows == 5:
                _T5(*a)
            elif rows == 6:
                _T6(*a)
            elif rows == 7:
                _T7(*a)
            elif rows == 8:
                _T8(*a)
            else:
                _T9(*a)
            r += rows


@njit(cache=True, nogil=True)
def panel_columns(n_pad: int, part: int, parts: int) -> tuple[int, int]:
    """The output columns [begin, end) that `linear(..., part, parts)` writes for a packed width n_pad."""
    n_panels = n_pad // PANEL
    return n_panels * part // parts * PANEL, n_panels * (part + 1) // parts * PANEL


def padded(n: int) -> int:
    """n rounded up to a multiple of PANEL: the width of a packed linear's output buffer."""
    return -(-n // PANEL) * PANEL


def pack_linear(weight: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(wp (n_pad * n_in,) float32, b (n_pad,) float32) from nn.Linear's weight (n_out, n_in) and bias (n_out,):
    panels of PANEL outputs, each (n_in, PANEL) row-major, zero-padded past n_out (their outputs are the zero
    bias: ignored by the caller)."""
    weight = np.asarray(weight, np.float32)
    n_out, n_in = weight.shape
    n_pad = padded(n_out)
    w = np.zeros((n_pad, n_in), np.float32)
    w[:n_out] = weight
    b = np.zeros(n_pad, np.float32)
    b[:n_out] = np.asarray(bias, np.float32)
    panels = w.reshape(n_pad // PANEL, PANEL, n_in).transpose(0, 2, 1)  # (n_panels, n_in, PANEL)
    return np.ascontiguousarray(panels).ravel(), b
