"""The observation source as the runtime node sees it: its sessions, its clock, and when its next observation is due.

- Sessions. A source that restarts (a robot client, a replayer) counts its observations from 0 again. A new
  Start, or an observation whose seq went back while its timestamp went forward, begins a new session, served
  from its first observation (counter source_restarts). An observation older than the newest of its session
  (reordered, duplicated) is not served (obs_out_of_order); one taken before its session's Start is stale.
- Its clock (SourceClock): the one-way delay floor of its messages, and an offset from this host's clock when
  its timestamps come from another host.
- When the next observation to decode is due (due_ns), and the window around it (DueWindow) in which the loop
  spins instead of sleeping (edgeinfer/node/serve.py), so that it arrives to a loop already awake.
"""
from __future__ import annotations

from edgeinfer.core.clock import SpinTail
from edgeinfer.core.wire import Heartbeat, Hello, Message, Observation, Start

OFFSET_LIMIT_NS = 5_000_000  # a floor above this over a whole window is a clock offset, not a delay
HALF_WINDOW_NS = 250_000_000  # the floor is the minimum over the last 0.25-0.5 s of messages
MAX_WAIT_NS = 100_000_000  # the loop waits for an observation due at most this far ahead (then it receives)
ARRIVALS = ("early", "on_time", "late", "idle")  # arrival(): counters obs_arrival.<kind>


class SourceClock:
    """The one-way delay floor of the source's messages and the offset of its clock from this host's.

    Each timestamped message gives d = t_recv - t_src (t_src on the source's clock, t_recv on this host's
    CLOCK_MONOTONIC). On one host d >= 0, and its minimum, the floor, is the fastest transport (tens of us); an
    offset between the clocks shifts every d alike. The minimum one-way delay as the offset estimate is Paxson
    1998 (On calibrating measurements of packet transit times, SIGMETRICS); the floor is a windowed minimum over
    two half-windows (as BBR's min-RTT filter, Cardwell et al. 2016), so it follows a drifting clock and forgets
    a backlog read after a stall.

    `offset` turns True (once) when the floor is negative (a message received before it was sent) or above
    OFFSET_LIMIT_NS over a whole window (the fastest message of 0.25 s or more took longer than that one way:
    not a delay); from then on local_ns() reads the source's timestamps as t_src + floor, so the fastest message
    counts as age 0. All times in ns.
    """

    def __init__(self):
        self.floor_ns: int | None = None  # None until the first sample
        self.offset = False
        self._cur: int | None = None  # the minimum of the current half-window, begun at _cur_start_ns
        self._prev: int | None = None  # the minimum of the one before (None: none, or too long ago)
        self._cur_start_ns = 0

    def sample(self, t_src_ns: int, t_recv_ns: int) -> bool:
        """Take one message's timestamps. True the one time the samples reveal a clock offset."""
        d = t_recv_ns - t_src_ns
        age_ns = t_recv_ns - self._cur_start_ns
        if self._cur is None or age_ns >= HALF_WINDOW_NS:
            self._prev = self._cur if self._cur is not None and age_ns < 2 * HALF_WINDOW_NS else None
            self._cur, self._cur_start_ns = d, t_recv_ns
        else:
            self._cur = min(self._cur, d)
        self.floor_ns = self._cur if self._prev is None else min(self._prev, self._cur)
        if self.offset:
            return False
        self.offset = self.floor_ns < 0 or (self._prev is not None and self.floor_ns > OFFSET_LIMIT_NS)
        return self.offset

    def local_ns(self, t_src_ns: int) -> int:
        """A source timestamp on this host's monotonic clock: itself, or shifted by the floor after an offset."""
        return t_src_ns + self.floor_ns if self.offset else t_src_ns

    def describe(self) -> str:
        """What the offset is and what to do about it (the ErrorEvent's text)."""
        floor_ms = self.floor_ns / 1e6
        how = ("arrive before they were sent" if floor_ms < 0
               else f"took at least {floor_ms:.1f} ms one way for {2 * HALF_WINDOW_NS / 1e9:g} s")
        return (f"observation timestamps are on a clock {-floor_ms:+.1f} ms from this host's monotonic clock (its "
                f"messages {how}): another host, or not CLOCK_MONOTONIC. Ages are now read against the estimated "
                "offset (the fastest message is age 0), so max_obs_age_ms bounds the delay beyond it; for true ages "
                "stamp observations on this host with CLOCK_MONOTONIC (Python: time.perf_counter_ns())")


class ObservationSource:
    """The source's current session: its schedule (period_ns, from the Start), the newest observation, the next seq
    the runtime decodes (next_seq; the node advances it), and its clock. Counters: restarts, out_of_order."""

    def __init__(self):
        self.clock = SourceClock()
        self.start: Start | None = None
        self.last: Observation | None = None  # the newest observation of this session
        self.next_seq = 0
        self.restarts = self.out_of_order = 0

    @property
    def period_ns(self) -> int:
        return self.start.period_ns

    def begin(self, start: Start) -> bool:
        """A Start: a new session (counted as a restart after the first), served from its first observation. False
        (nothing changes) for a repeat of the current Start."""
        if self.start is not None and (start.t0_ns, start.period_ns) == (self.start.t0_ns, self.start.period_ns):
            return False
        self.restarts += self.start is not None
        self.start, self.last, self.next_seq = start, None, 0
        return True

    def heard(self, msg: Message, t_recv_ns: int) -> bool:
        """Sample the clock with a message's timestamp (Hello, Heartbeat, Observation). True the one time an offset
        is revealed (report clock.describe())."""
        return isinstance(msg, (Observation, Hello, Heartbeat)) and self.clock.sample(msg.t_ns, t_recv_ns)

    def admit(self, obs: Observation) -> str:
        """Whether obs is the newest of its session: "new", "restart" (its seq went back while its time went
        forward: the source restarted without a Start; a new session, counted), "old" (reordered or duplicated:
        counted in out_of_order) or "before_start" (taken before its session's Start)."""
        last = self.last
        if self.start is not None and obs.t_ns < self.start.t0_ns:
            return "before_start"
        if last is not None and obs.seq <= last.seq:
            if obs.t_ns <= last.t_ns:
                self.out_of_order += 1
                return "old"
            self.restarts += 1
            self.last, self.next_seq = obs, 0
            return "restart"
        self.last = obs
        return "new"

    def due_ns(self) -> int | None:
        """When observation next_seq should arrive, on this host's clock (ns): the newest one's timestamp plus the
        periods between them plus the delay floor. None before the session's first observation."""
        last, floor = self.last, self.clock.floor_ns
        if last is None or floor is None:
            return None
        return last.t_ns + (max(self.next_seq, last.seq + 1) - last.seq) * self.period_ns + floor


class DueWindow:
    """The window around an observation's due time in which the node's loop spins instead of sleeping: it opens
    before.spin_ns ahead (the OS wake-up lateness of its sleeps) and closes after.spin_ns past it (how late
    observations come after their due time), each a SpinTail (edgeinfer.core.clock: a decaying maximum, at
    least spin_ns, at most an eighth of a period or 500 us). spin_ns 0: no window, the loop sleeps until a
    message comes (and no observation is on_time). Times in ns."""

    def __init__(self, spin_ns: int, period_ns: int):
        self.spin_ns = spin_ns
        self.before, self.after = SpinTail(period_ns, spin_ns), SpinTail(period_ns, spin_ns)

    def end_ns(self, due_ns: int | None, t_ns: int) -> int | None:
        """Where a wait begun at t_ns ends (the window's close) when the loop should wait into the window of due_ns;
        None (sleep in the receive instead) when nothing is due, the window is off, it has closed (the stream
        paused: no core is spun for it) or due_ns is more than MAX_WAIT_NS ahead."""
        if due_ns is None or self.spin_ns <= 0 or not -self.after.spin_ns < due_ns - t_ns <= MAX_WAIT_NS:
            return None
        return due_ns + self.after.spin_ns

    def arrived(self, t_recv_ns: int, due_ns: int | None, period_ns: int) -> str:
        """How an observation came, against when it was due (one of ARRIVALS): "early" (before the window: the loop
        woke for it), "on_time" (in the window: the loop was spinning for it), "late" (after the window, within a
        period) or "idle" (nothing was due, or more than a period later: the stream had paused)."""
        if due_ns is None or t_recv_ns > due_ns + period_ns:
            return "idle"
        if self.spin_ns <= 0:  # no window: the loop slept for every one
            return "early" if t_recv_ns < due_ns else "late"
        kind = ("early" if t_recv_ns < due_ns - self.before.spin_ns
                else "on_time" if t_recv_ns <= due_ns + self.after.spin_ns else "late")
        self.after.woke(t_recv_ns - due_ns)
        return kind
