"""Action-chunk buffer: which chunk covers a control tick, and the interpolated joint target there.

A chunk's `steps_rad` (H+1, D) holds the observed joint positions at t_obs (row 0, the anchor) followed
by H targets at t_obs + h * step_ns. It covers [t_obs, t_obs + H * step_ns]; between rows the target is
linearly interpolated. The newest chunk that covers a tick wins; falling back to an older one is the
"continue" rung. A chunk published early with its first verified step only is replaced by the rest of
the same chunk (same observation, more steps) when that arrives.

Stitching across chunk boundaries: when a newer chunk takes over, its target at that tick differs from
the target the previous chunk would have given (the boundary jump: the two were planned from different
observations). With blend_ns > 0 the command moves from the previous chunk's target to the new one's
linearly over blend_ns (a cross-fade, the simplest form of real-time chunking's continuity constraint,
Black et al. 2025, arXiv 2506.07339), so the commanded jump at a boundary is a fraction of the raw one.
Every boundary's raw jump (max over joints, rad) is kept in `jumps_rad` for the report.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from edgeinfer.core.wire import ActionChunk


def end_ns(c: ActionChunk) -> int:
    """The last instant the chunk covers (monotonic ns): its anchor time plus H steps."""
    return c.t_obs_ns + (len(c.steps_rad) - 1) * c.step_ns


def target_at(c: ActionChunk, t_ns: int) -> np.ndarray | None:
    """The chunk's interpolated target (D,) at t_ns, None outside its span."""
    u = (t_ns - c.t_obs_ns) / c.step_ns  # position in chunk steps
    if not 0 <= u <= len(c.steps_rad) - 1:
        return None
    lo = min(int(u), len(c.steps_rad) - 2)
    w = u - lo
    return (1 - w) * c.steps_rad[lo] + w * c.steps_rad[lo + 1]


class ChunkBuffer:
    """keep: chunks kept, newest first. blend_ns: cross-fade at a chunk boundary (0: switch at once)."""

    def __init__(self, keep: int = 4, blend_ns: int = 0, max_jumps: int = 100_000):
        self._chunks: deque[ActionChunk] = deque(maxlen=keep)  # newest first
        self.blend_ns = blend_ns
        self.jumps_rad: deque[float] = deque(maxlen=max_jumps)
        self._serving: ActionChunk | None = None  # the chunk the last sample came from
        self._fade: tuple[ActionChunk, int] | None = None  # (previous chunk, t of the switch) while blending

    def push(self, chunk: ActionChunk) -> bool:
        """Add a chunk; chunks with no target beyond the anchor, or older than the newest, are ignored (False).
        A chunk of the newest one's observation with more steps replaces it (the rest of an early first step)."""
        if len(chunk.steps_rad) < 2:
            return False
        if self._chunks and chunk.t_obs_ns <= self._chunks[0].t_obs_ns:
            head = self._chunks[0]
            if chunk.t_obs_ns < head.t_obs_ns or len(chunk.steps_rad) <= len(head.steps_rad):
                return False
            self._chunks[0] = chunk
            self._serving = chunk if self._serving is head else self._serving
            return True
        self._chunks.appendleft(chunk)
        return True

    def covered_until_ns(self) -> int | None:
        """The last instant a kept chunk covers (monotonic ns); None when none is kept."""
        return max((end_ns(c) for c in self._chunks), default=None)

    def clear(self) -> None:
        """Forget every chunk (their runtime is gone: nothing it planned is trusted any more)."""
        self._chunks.clear()
        self._serving = self._fade = None

    def sample(self, t_ns: int) -> tuple[np.ndarray, str, int] | None:
        """(q_rad (D,), rung, chunk obs_seq) at t_ns, or None when no chunk covers t_ns (watchdog)."""
        for i, c in enumerate(self._chunks):
            q = target_at(c, t_ns)
            if q is None:
                continue
            if c is not self._serving:
                self._switch(c, t_ns, q)
            if self._fade is not None:
                q = self._blend(q, t_ns)
            return q, (c.rung if i == 0 else "continue"), c.obs_seq
        return None

    def _switch(self, c: ActionChunk, t_ns: int, q: np.ndarray) -> None:
        previous = self._serving
        self._serving, self._fade = c, None
        q_prev = target_at(previous, t_ns) if previous is not None else None
        if q_prev is None:
            return  # nothing was being followed here: no boundary to stitch
        self.jumps_rad.append(float(np.max(np.abs(q - q_prev))))
        if self.blend_ns > 0:
            self._fade = (previous, t_ns)

    def _blend(self, q: np.ndarray, t_ns: int) -> np.ndarray:
        previous, t_switch = self._fade
        w = (t_ns - t_switch) / self.blend_ns
        q_prev = target_at(previous, t_ns)
        if w >= 1 or q_prev is None:
            self._fade = None
            return q
        return (1 - w) * q_prev + w * q
