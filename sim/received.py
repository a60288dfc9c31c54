"""What the replayer received, kept as preallocated columns instead of the messages themselves, so that its
memory stays flat however long the run (a 30-minute soak is 450,000 ticks at 250 Hz): one row per control tick
for commands, one slot per observation a chunk was planned from for chunks. Every figure of the report
(sim/metrics.py, sim/boundaries.py, sim/supervisor.py, sim/hil.py) is computed from these columns.

Columns are allocated with np.full, which writes every page: the memory is taken when the run starts, not
tick by tick as rows fill (np.zeros maps pages lazily, so the RSS would still grow through the run).
"""
from __future__ import annotations

import numpy as np

from edgeinfer.core.wire import RUNGS, ActionChunk, JointCommand

RUNG_CODE = {r: i for i, r in enumerate(RUNGS)}
HOLD = RUNG_CODE["hold"]
NONE = -1  # the rung code of a tick without a command
# rung code -> name, as an object array; NONE (-1) indexes the last entry, "" (no command)
RUNG_NAMES = np.array([*RUNGS, ""], dtype=object)


class Commands:
    """The first command received for each control tick 0..n_ticks-1, on the replayer's clock.

    Columns, (n_ticks,) each: t_recv_ns int64 (its receipt), t_ns int64 (the control loop's send),
    chunk_obs_seq int64 (the observation of the chunk it came from, -1: none), rung int8 (index in wire.RUNGS,
    NONE: no command for the tick); q_rad (n_ticks, n_joints) float64 (NaN where none). `len()` is the number
    of ticks with a command, iterating gives them in order."""

    def __init__(self, n_ticks: int, n_joints: int):
        self._ints = np.full((n_ticks, 3), -1, dtype=np.int64)  # one row written at once (see put)
        self.t_recv_ns, self.t_ns, self.chunk_obs_seq = self._ints.T
        self.rung = np.full(n_ticks, NONE, dtype=np.int8)
        self.q_rad = np.full((n_ticks, n_joints), np.nan)
        self.count = 0

    def fits(self, cmd: JointCommand) -> bool:
        """Whether cmd's tick is one of the run's and its q_rad has the run's joint count."""
        return 0 <= cmd.seq < len(self.rung) and cmd.q_rad.shape == self.q_rad.shape[1:]

    def put(self, t_recv_ns: int, cmd: JointCommand) -> bool:
        """Keep cmd (one that fits) received at t_recv_ns; False, keeping nothing, when its tick has one already.
        Raises OverflowError, keeping nothing, for a time or sequence number outside int64."""
        n = cmd.seq
        if self.rung[n] != NONE:
            return False
        self._ints[n] = (t_recv_ns, cmd.t_ns, cmd.chunk_obs_seq)
        self.q_rad[n] = cmd.q_rad
        self.rung[n] = RUNG_CODE[cmd.rung]  # last: the tick has its command from here on
        self.count += 1
        return True

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        return iter(self.ticks().tolist())

    def ticks(self) -> np.ndarray:
        """(k,) int64: the ticks that got a command, ascending."""
        return np.flatnonzero(self.rung != NONE)


# the int64 columns of Chunks besides rung and steps_rad, one value per slot
_CHUNK_INTS = ("obs_seq", "seq", "t_first_recv_ns", "t_recv_ns", "t_obs_ns", "t_ready_ns", "step_ns", "tokens",
               "target_passes", "drafted", "accepted", "n_steps")


class Chunks:
    """The last chunk received for each observation (a tick 0..n_ticks-1) it was planned from: one slot per such
    observation, in the order they first got a chunk. An early first step and then the whole chunk of the same
    observation share a slot: t_first_recv_ns is the first one's receipt, every other column the last one's.

    Columns per slot (`count` used): the int64 _CHUNK_INTS (ActionChunk's fields; t_recv_ns its receipt,
    n_steps its steps), rung int8 (index in wire.RUNGS) and steps_rad (slots, max_steps, n_joints) float64,
    whose first n_steps rows hold the chunk. slot_of_tick: (n_ticks,) int64, the slot of each observation (-1:
    none). first_recv_ns: the receipt of the first chunk of any observation, also one of no tick of the run
    (None: none came). Sized for `capacity` slots of `max_steps` steps; a run that needs more (a runtime
    replanning more often than expected, a chunk longer than the policy's) doubles them, a copy that the sizing
    avoids."""

    def __init__(self, n_ticks: int, max_steps: int, n_joints: int, capacity: int):
        self.slot_of_tick = np.full(n_ticks, -1, dtype=np.int64)
        self.n_joints = n_joints
        self.count = 0
        self.first_recv_ns: int | None = None
        self._allocate(max(1, capacity), max(1, max_steps))

    def _allocate(self, capacity: int, max_steps: int) -> None:
        """(Re)allocate the slot columns for `capacity` slots of `max_steps` steps, keeping the used slots."""
        n = self.count
        ints = np.full((capacity, len(_CHUNK_INTS)), -1, dtype=np.int64)
        rung = np.full(capacity, NONE, dtype=np.int8)
        steps = np.full((capacity, max_steps, self.n_joints), np.nan)
        if n:
            ints[:n], rung[:n] = self._ints[:n], self.rung[:n]
            steps[:n, :self.steps_rad.shape[1]] = self.steps_rad[:n]
        self._ints, self.rung, self.steps_rad = ints, rung, steps
        for name, col in zip(_CHUNK_INTS, ints.T):
            setattr(self, name, col)

    def fits(self, c: ActionChunk) -> bool:
        """Whether c's steps have the run's joint count (its observation may be any: see put)."""
        return c.steps_rad.shape[1] == self.n_joints

    def put(self, t_recv_ns: int, c: ActionChunk) -> None:
        """Keep chunk c (one that fits) received at t_recv_ns in its observation's slot; one planned from no tick
        of the run only counts for first_recv_ns. Raises OverflowError, keeping nothing new, for a field
        outside int64."""
        if self.first_recv_ns is None or t_recv_ns < self.first_recv_ns:
            self.first_recv_ns = t_recv_ns
        if not 0 <= c.obs_seq < len(self.slot_of_tick):
            return
        s, k = int(self.slot_of_tick[c.obs_seq]), len(c.steps_rad)
        new = s < 0
        full = new and self.count == len(self.rung)
        if full or k > self.steps_rad.shape[1]:  # rare: see the class docstring
            self._allocate(2 * len(self.rung) if full else len(self.rung), max(k, self.steps_rad.shape[1]))
        if new:
            s = self.count
        first = t_recv_ns if new else self.t_first_recv_ns[s]
        self._ints[s] = (c.obs_seq, c.seq, first, t_recv_ns, c.t_obs_ns, c.t_ready_ns, c.step_ns, c.tokens,
                         c.target_passes, c.drafted, c.accepted, k)
        self.steps_rad[s, :k] = c.steps_rad
        self.rung[s] = RUNG_CODE[c.rung]
        if new:  # last: the slot is the observation's from here on
            self.slot_of_tick[c.obs_seq], self.count = s, s + 1

    def chunk(self, s: int) -> ActionChunk:
        """The last chunk kept in slot s, as it was received (steps_rad a view of the column)."""
        f = dict(zip(_CHUNK_INTS, self._ints[s].tolist()))
        return ActionChunk(f["seq"], f["obs_seq"], f["t_obs_ns"], f["t_ready_ns"], f["step_ns"],
                           self.steps_rad[s, :f["n_steps"]], RUNGS[self.rung[s]], f["tokens"], f["target_passes"],
                           f["drafted"], f["accepted"])
