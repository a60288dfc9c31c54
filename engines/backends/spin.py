"""Atomics for numba kernels that share one pass between two threads (engines/backends/packed_engine.py).

Numba has no atomics on the CPU, so these are LLVM atomic instructions in @intrinsic functions on an int64 array:
`load(a, i)` (acquire), `store(a, i, v)` (release) and `cas(a, i, expected, new)` (sequentially consistent compare
and swap, returns the old value). A spinning reader must use `load`: a plain read may be hoisted out of its loop.
"""
from __future__ import annotations

from numba import types
from numba.extending import intrinsic

LINE = 8  # int64 slots per 64-byte cache line: a slot two threads write to on a line of its own


def _slot(context, builder, signature, array, index):
    data = context.make_array(signature.args[0])(context, builder, array).data
    return builder.gep(data, [index])


@intrinsic
def load(typingctx, a, i):
    """a[i] (int64) with acquire ordering."""
    def codegen(context, builder, signature, args):
        return builder.load_atomic(_slot(context, builder, signature, *args), "acquire", 8)

    return types.int64(a, types.intp), codegen


@intrinsic
def store(typingctx, a, i, v):
    """a[i] = v (int64) with release ordering."""
    def codegen(context, builder, signature, args):
        builder.store_atomic(args[2], _slot(context, builder, signature, args[0], args[1]), "release", 8)
        return context.get_dummy_value()

    return types.void(a, types.intp, types.int64), codegen


@intrinsic
def cas(typingctx, a, i, expected, new):
    """Compare and swap a[i] from `expected` to `new` (int64, sequentially consistent); returns the old value (the
    swap happened iff it equals `expected`)."""
    def codegen(context, builder, signature, args):
        ptr = _slot(context, builder, signature, args[0], args[1])
        pair = builder.cmpxchg(ptr, args[2], args[3], "seq_cst", "seq_cst")
        return builder.extract_value(pair, 0)

    return types.int64(a, types.intp, types.int64, types.int64), codegen
