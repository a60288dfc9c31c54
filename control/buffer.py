"""Action-chunk buffer: which chunk covers a control tick, and the interpolated joint target there.

A chunk's `steps_rad` (H+1, D) holds the observed joint positions at t_obs (row 0, the anchor) followed
by H targets at t_obs + h * step_ns. It covers [t_obs, t_obs + H * step_ns]; between rows the target is
linearly interpolated. The newest chunk that covers a tick wins; falling back to an older one is the
"continue" rung. A chunk published early with its first verified row only is replaced by the rest of
the same chunk when that arrives (same observation; more steps, or as many from more verified tokens: a DCT
chunk spans the whole horizon from its first row on, rung "coarse", and is refined in place). Every rung that
carries steps is interpolated and stitched alike: a coarse chunk is a whole-horizon chunk like a full one.

Stitching across chunk boundaries: when a newer chunk takes over, its target at that tick differs from
the target the previous chunk would have given (the boundary jump: the two were planned from different
observations). With blend_ns > 0 the command moves from the previous chunk's target to the new one's
linearly over blend_ns (a cross-fade, the simplest form of real-time chunking's continuity constraint,
Black et al. 2025, arXiv 2506.07339), so the commanded jump at a boundary is a fraction of the raw one.
Each boundary's raw jump (max over joints, rad) is measured in O(1) memory: `boundaries` counts them,
`jump_last_rad` and `jump_max_rad` keep the newest and the largest. Nothing is kept per boundary: a node runs
for hours at some 50 boundaries a second, and the report's distribution of jumps comes from the replayer's
recording (sim/boundaries.py).

Plausibility: a chunk decodes from a well-formed message, yet its times may still be nonsense (a bit flipped in
the observation it was planned from, which the runtime stamps into t_obs_ns). Ordered by anchor time, one chunk
anchored far in the future would become the newest for good and turn every later, correct chunk away while it
covers nothing, so `offer` refuses it first (`implausible`) and refuses chunks whose whole horizon has passed
(`expired`).
"""
from __future__ import annotations

from collections import deque
from typing import NamedTuple

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


def implausible(c: ActionChunk, t_ns: int | None, max_lead_ns: int | None = None) -> str | None:
    """Why chunk `c` cannot be a plan for a robot whose clock reads t_ns (monotonic ns; None: no clock yet, only
    step_ns is checked), or None when it can.

    A chunk is planned from an observation already taken, so its anchor t_obs_ns cannot lie ahead of the clock by
    more than a slack: max_lead_ns (None: the chunk's own horizon, H * step_ns: a chunk anchored later than that
    would only begin after its whole plan should have ended). step_ns must be > 0 (0 divides by zero in
    target_at; a negative one runs backwards)."""
    if c.step_ns <= 0:
        return f"chunk {c.seq} (observation {c.obs_seq}): step_ns {c.step_ns} is not > 0"
    if t_ns is None:
        return None
    lead_ns = c.t_obs_ns - t_ns
    limit_ns = max_lead_ns if max_lead_ns is not None else (len(c.steps_rad) - 1) * c.step_ns
    if lead_ns > limit_ns:
        return (f"chunk {c.seq} (observation {c.obs_seq}): anchored {lead_ns / 1e6:.1f} ms ahead of the clock "
                f"(t_obs_ns {c.t_obs_ns}, now {t_ns}), more than the {limit_ns / 1e6:.1f} ms a plan can be")
    return None


class Refusal(NamedTuple):
    """Why ChunkBuffer.offer turned a chunk away: kind "implausible", "expired" or "superseded", and the detail."""

    kind: str
    detail: str


class ChunkBuffer:
    """keep: chunks kept, newest first. blend_ns: cross-fade at a chunk boundary (0: switch at once).
    max_lead_ns: how far ahead of the caller's clock a chunk's anchor may lie (None: the chunk's horizon; see
    `implausible`)."""

    def __init__(self, keep: int = 4, blend_ns: int = 0, max_lead_ns: int | None = None):
        self._chunks: deque[ActionChunk] = deque(maxlen=keep)  # newest first
        self.blend_ns = blend_ns
        self.max_lead_ns = max_lead_ns
        self.boundaries = 0  # chunk boundaries: a newer chunk took over from one that covered the tick
        self.jump_last_rad = self.jump_max_rad = 0.0  # raw jump (max over joints) at the newest / largest boundary
        self._serving: ActionChunk | None = None  # the chunk the last sample came from
        self._fade: tuple[ActionChunk, int] | None = None  # (previous chunk, t of the switch) while blending
        self._t_ns: int | None = None  # the time of the last sample: the clock when offer() is given none

    def offer(self, chunk: ActionChunk, t_ns: int | None = None, now_ns: int | None = None) -> Refusal | None:
        """Take a chunk in. t_ns: the next tick to command (monotonic ns; None: the last sample's, and no time check
        before the first sample); now_ns: the caller's clock now (None: t_ns). None when the chunk was taken;
        otherwise why not, and it is ignored: implausible at now_ns (see `implausible`), expired (its whole horizon
        ends before t_ns), superseded (no target beyond the anchor, older than the newest, or as old and neither
        more steps nor, with as many, more tokens). A chunk of the newest one's observation with more steps, or as
        many from more tokens, replaces it (the rest of an early first step)."""
        if len(chunk.steps_rad) < 2:
            return Refusal("superseded", "anchor only")
        t_ns = t_ns if t_ns is not None else self._t_ns
        if (why := implausible(chunk, now_ns if now_ns is not None else t_ns, self.max_lead_ns)) is not None:
            return Refusal("implausible", why)
        if t_ns is not None and end_ns(chunk) < t_ns:
            return Refusal("expired", "its whole horizon has passed")
        if self._chunks and chunk.t_obs_ns <= self._chunks[0].t_obs_ns:
            head = self._chunks[0]
            if chunk.t_obs_ns < head.t_obs_ns or (len(chunk.steps_rad), chunk.tokens) <= (len(head.steps_rad),
                                                                                           head.tokens):
                return Refusal("superseded", "older than the newest")
            self._chunks[0] = chunk
            self._serving = chunk if self._serving is head else self._serving
            return None
        self._chunks.appendleft(chunk)
        return None

    def push(self, chunk: ActionChunk, t_ns: int | None = None) -> bool:
        """offer(chunk, t_ns), as whether the chunk was taken."""
        return self.offer(chunk, t_ns) is None

    def covered_until_ns(self) -> int | None:
        """The last instant a kept chunk covers (monotonic ns); None when none is kept."""
        return max((end_ns(c) for c in self._chunks), default=None)

    def clear(self) -> None:
        """Forget every chunk (their runtime is gone: nothing it planned is trusted any more)."""
        self._chunks.clear()
        self._serving = self._fade = None

    def sample(self, t_ns: int) -> tuple[np.ndarray, str, int] | None:
        """(q_rad (D,), rung, chunk obs_seq) at t_ns, or None when no chunk covers t_ns (watchdog)."""
        self._t_ns = t_ns
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
        self.boundaries += 1
        self.jump_last_rad = float(np.max(np.abs(q - q_prev)))
        self.jump_max_rad = max(self.jump_max_rad, self.jump_last_rad)
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
