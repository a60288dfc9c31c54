"""Action-chunk buffer: which chunk covers a control tick, and the interpolated joint target there.

A chunk's `steps_rad` (H+1, D) holds the observed joint positions at t_obs (row 0, the anchor) followed
by H targets at t_obs + h * step_ns. It covers [t_obs, t_obs + H * step_ns]; between rows the target is
linearly interpolated. The newest chunk that covers a tick wins; falling back to an older one is the
"continue" rung.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from edgeinfer.wire import ActionChunk


class ChunkBuffer:
    def __init__(self, keep: int = 4):
        self._chunks: deque[ActionChunk] = deque(maxlen=keep)  # newest first

    def push(self, chunk: ActionChunk) -> bool:
        """Add a chunk; chunks with no target beyond the anchor, or older than the newest, are ignored (False)."""
        if len(chunk.steps_rad) < 2:
            return False
        if self._chunks and chunk.t_obs_ns <= self._chunks[0].t_obs_ns:
            return False
        self._chunks.appendleft(chunk)
        return True

    def clear(self) -> None:
        """Forget every chunk (their runtime is gone: nothing it planned is trusted any more)."""
        self._chunks.clear()

    def sample(self, t_ns: int) -> tuple[np.ndarray, str, int] | None:
        """(q_rad (D,), rung, chunk obs_seq) at t_ns, or None when no chunk covers t_ns (watchdog)."""
        for i, c in enumerate(self._chunks):
            u = (t_ns - c.t_obs_ns) / c.step_ns  # position in chunk steps
            if 0 <= u <= len(c.steps_rad) - 1:
                lo = min(int(u), len(c.steps_rad) - 2)
                w = u - lo
                q = (1 - w) * c.steps_rad[lo] + w * c.steps_rad[lo + 1]
                return q, (c.rung if i == 0 else "continue"), c.obs_seq
        return None
