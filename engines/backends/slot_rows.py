"""Passes -> fixed-shape rows: how the batched engines stay batch-invariant (engines/backends/torch_batched.py,
ort_batched.py).

fp32 matrix products may round a row differently with the matrix's shape or the row's place in it (BLAS picks
kernels and blocking by shape). So a pass's rows always run in the same shape, whatever else shares the call:
every step is (n_slots, width), slot s is always row s, a pass's tokens fill the first places of its row, and
the rest is padding (token 0 at position 0, writing to scratch cache columns seq_len + i that no real query
attends to; engines/backends/batched_step.py). The width is the smallest of `widths` (default 1 and max_pass) that holds
the pass, a choice that depends on the pass alone, so a call runs one step per width its passes need (a decode
pass, T = 1, never pays for a verify pass's max_pass places). A pass longer than max_pass runs in rounds of
max_pass tokens (its split again depends on itself only).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from edgeinfer.core.protocols import Pass


class SlotRows:
    """The host arrays of the fixed-shape steps, reused by every call: obs (n_slots, obs_dim) float32, and per
    width w: tokens[w], pos[w], write[w] (n_slots, w) int64 (batched_step's inputs).

    widths: the step widths, each in 1..max_pass (max_pass is always one). Raises ValueError for n_slots or
    max_pass < 1 or a width out of range."""

    def __init__(self, cfg, n_slots: int, max_pass: int, widths: Sequence[int] = (1,)):
        if n_slots < 1 or max_pass < 1:
            raise ValueError(f"n_slots={n_slots} and max_pass={max_pass} must be >= 1")
        if any(not 1 <= w <= max_pass for w in widths):
            raise ValueError(f"widths={tuple(widths)} must be in 1..max_pass={max_pass}")
        self.cfg, self.n_slots, self.max_pass = cfg, n_slots, max_pass
        self.widths = tuple(sorted({*widths, max_pass}))
        self.cache_len = cfg.seq_len + max_pass  # S: the positions, then one scratch column per place
        self.obs = np.zeros((n_slots, cfg.obs_dim), np.float32)
        self.tokens = {w: np.zeros((n_slots, w), np.int64) for w in self.widths}
        self.pos = {w: np.zeros((n_slots, w), np.int64) for w in self.widths}
        self.write = {w: np.zeros((n_slots, w), np.int64) for w in self.widths}

    def forward(self, passes: Sequence[Pass], step: Callable[[int], np.ndarray]) -> list[np.ndarray]:
        """Logits (T_i, n_bins) float32 per pass, in order. step(w) runs one (n_slots, w) step on the arrays of width
        w and returns its logits (n_slots, w, n_bins). Raises ValueError naming the pass and field that is invalid."""
        rows = [self._ids(i, p) for i, p in enumerate(passes)]
        slots = [p.slot for p in passes]
        if len(set(slots)) != len(slots):
            dup = next(i for i, s in enumerate(slots) if s in slots[:i])
            raise ValueError(f"passes[{dup}].slot={slots[dup]}: a slot may have one pass per call")
        out: list[list[np.ndarray]] = [[] for _ in passes]
        m = self.max_pass
        for r in range(-(-max((len(ids) for ids in rows), default=0) // m)):
            by_width: dict[int, list[tuple[int, Pass, list[int]]]] = {}
            for i, (p, ids) in enumerate(zip(passes, rows)):
                if piece := ids[r * m:(r + 1) * m]:
                    by_width.setdefault(next(w for w in self.widths if w >= len(piece)), []).append((i, p, piece))
            for w, placed in sorted(by_width.items()):
                tokens, pos, write = self.tokens[w], self.pos[w], self.write[w]
                tokens[:] = pos[:] = 0
                write[:] = self.cfg.seq_len + np.arange(w)
                for _, p, piece in placed:
                    first = p.start + r * m
                    tokens[p.slot, :len(piece)] = piece
                    pos[p.slot, :len(piece)] = write[p.slot, :len(piece)] = range(first, first + len(piece))
                    if first == 0:
                        self.obs[p.slot] = p.obs
                logits = step(w)
                for i, p, piece in placed:
                    out[i].append(np.array(logits[p.slot, :len(piece)], np.float32))
        return [np.concatenate(pieces) for pieces in out]

    def _ids(self, i: int, p: Pass) -> list[int]:
        """The token ids of pass i at positions start.. (position 0 carries a placeholder id 0), checked."""
        c = self.cfg
        if not 0 <= p.slot < self.n_slots:
            raise ValueError(f"passes[{i}].slot={p.slot} not in 0..{self.n_slots - 1}")
        if p.start == 0:
            if p.obs is None or np.shape(p.obs) != (c.obs_dim,):
                raise ValueError(f"passes[{i}].obs must be ({c.obs_dim},) at start 0, got "
                                 f"{None if p.obs is None else np.shape(p.obs)}")
            ids = [0, *p.tokens]
        else:
            ids = list(p.tokens)
        if not ids or p.start < 0 or p.start + len(ids) > c.seq_len:
            raise ValueError(f"passes[{i}]: {len(ids)} positions from start={p.start} do not fit seq_len={c.seq_len}")
        if min(ids) < 0 or max(ids) >= c.n_bins:
            raise ValueError(f"passes[{i}].tokens must be in 0..{c.n_bins - 1}, got {p.tokens}")
        return ids
