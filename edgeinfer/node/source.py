"""The observation source as the runtime node sees it: its sessions, its clock, and when its next observation is due.

- Sessions. A source that restarts (a robot client, a replayer) counts its observations from 0 again. A new
  Start, or an observation whose seq went back while its timestamp went forward, begins a new session, served
  from its first observation (counter source_restarts). An observation older than the newest of its session
  (reordered, duplicated: the same seq or the same timestamp) is not served (obs_out_of_order); one taken before
  its session's Start is stale.
- Its clock (SourceClock): the one-way delay floor of its messages and, only for a source declared on another
  host's clock (RuntimeConfig.obs_clock), an offset from this host's clock. On this host's clock (the default on
  loopback) timestamps are taken as they are: ages are true, a stream that comes late is stale (obs_stale, and
  error.obs_late once it has been late for a whole window), never read as an offset; one stamped ahead of this
  host's clock is refused (error.clock_ahead). A message whose timestamp the floor makes implausible (a corrupted
  one that still decodes) is counted (obs_implausible) and touches nothing: not the floor, not the session, not
  the chunks; several in a row that agree are a clock that jumped (error.clock_jump), followed from then on.
- When the next observation to decode is due (due_ns), and the window around it (DueWindow) in which the loop
  spins instead of sleeping (edgeinfer/node/serve.py), so that it arrives to a loop already awake.
"""
from __future__ import annotations

from edgeinfer.core.clock import SpinTail
from edgeinfer.core.wire import Heartbeat, Hello, Message, Observation, Start

OFFSET_LIMIT_NS = 5_000_000  # a floor above this over a whole window is a clock offset, not a delay
HALF_WINDOW_NS = 250_000_000  # the floor is the minimum over the last 0.25-0.5 s of messages
LATE_LIMIT_NS = 1_000_000_000  # a message this much slower than the floor is implausible (a timestamp from the past)
EARLY_LIMIT_NS = 5_000_000  # with an offset, one this much faster than a settled floor is implausible (from the future)
JUMP_SAMPLES = 3  # this many implausible messages in a row that agree: the source's clock jumped (also: settled)
JUMP_AGREE_NS = 5_000_000  # ...agree: each later than the one before, their delays within this of the first's
MAX_WAIT_NS = 100_000_000  # the loop waits for an observation due at most this far ahead (then it receives)
ARRIVALS = ("early", "on_time", "late", "idle")  # arrival(): counters obs_arrival.<kind>
VERDICTS = ("taken", "offset", "late", "implausible", "ahead", "jump")  # SourceClock.sample()
NOT_TAKEN = ("implausible", "ahead")  # verdicts of a message not to be served


class SourceClock:
    """The one-way delay floor of the source's messages and, for a source on another host (other_host), the offset
    of its clock from this host's.

    Each timestamped message gives d = t_recv - t_src (t_src on the source's clock, t_recv on this host's
    CLOCK_MONOTONIC). On one host d >= 0, and its minimum, the floor, is the fastest transport (tens of us); an
    offset between the clocks shifts every d alike. The minimum one-way delay as the offset estimate is Paxson
    1998 (On calibrating measurements of packet transit times, SIGMETRICS); the floor is a windowed minimum over
    two half-windows (as BBR's min-RTT filter, Cardwell et al. 2016), so it follows a drifting clock and forgets
    a backlog read after a stall.

    On this host's clock (other_host False: the source stamps CLOCK_MONOTONIC here, on loopback) d is the
    message's true age and is never explained away: a floor above OFFSET_LIMIT_NS over a whole window is a stream
    that comes late (`late` turns True: the verdict "late", once per episode; its observations are stale), and a
    message received before it was sent is not taken (the verdict "ahead", counted in `implausible` and `ahead`;
    never a jump: one clock cannot jump ahead of itself).

    From another host's clock (other_host True), `offset` turns True (once; a jump decides it again) when the
    floor is negative (a message received before it was sent) or above OFFSET_LIMIT_NS over a whole window (the
    fastest message of 0.25 s or more took longer than that one way: not a delay); from then on local_ns() reads
    the source's timestamps as t_src + floor, so the fastest message counts as age 0. All times in ns.

    A minimum trusts its lowest sample, so a timestamp is judged before it is taken. Once there is a floor, a
    message is implausible (not taken; counted in `implausible`) when it is more than LATE_LIMIT_NS slower than
    the floor, or faster than physics allows: received before it was sent (one clock, no offset), or, with an
    offset, more than EARLY_LIMIT_NS faster than a settled floor (JUMP_SAMPLES messages in a row that did not
    lower it by more: a floor seeded by a backlog read at once, or after a pause, falls freely until then). A
    corrupted timestamp is one such message. A clock that really jumped (the source restarted on another host,
    or its clock was stepped) is JUMP_SAMPLES of them in a row that agree (each later than the one before,
    their delays within JUMP_AGREE_NS of the first's; a backlog's are a send interval apart, a repeated
    message's are not later): the estimate starts again from them (a jump: counted in `jumps`, by jump_ns),
    with the offset decided at once from their floor.
    """

    def __init__(self, other_host: bool = False):
        self.other_host = other_host
        self.floor_ns: int | None = None  # None until the first sample
        self.offset = self.late = False
        self.implausible = self.jumps = self.ahead = 0
        self.jump_ns = 0  # how much the floor moved at the last jump
        self._cur: int | None = None  # the minimum of the current half-window, begun at _cur_start_ns
        self._prev: int | None = None  # the minimum of the one before (None: none, or too long ago)
        self._cur_start_ns = 0
        self._settled = 0  # samples taken in a row that did not lower the floor by more than EARLY_LIMIT_NS
        self._streak: list[tuple[int, int]] = []  # (t_src, d) of the implausible samples in a row that agree

    def sample(self, t_src_ns: int, t_recv_ns: int) -> str:
        """Take one message's timestamps (or not). One of VERDICTS: "taken"; "offset" (taken, and the one time the
        samples reveal a clock offset: another host's clock only); "late" (taken, and the first sample of a floor
        above OFFSET_LIMIT_NS for a whole window on this host's clock); "implausible" (not taken); "ahead" (not
        taken: on this host's clock, received before it was sent); "jump" (the estimate started again from it)."""
        d = t_recv_ns - t_src_ns
        if d < 0 and not self.other_host:
            self.implausible, self.ahead = self.implausible + 1, self.ahead + 1
            return "ahead"
        if self.floor_ns is not None and not self._plausible(d):
            return self._implausible(t_src_ns, d, t_recv_ns)
        self._streak.clear()
        settled = self.floor_ns is not None and d >= self.floor_ns - EARLY_LIMIT_NS
        age_ns = t_recv_ns - self._cur_start_ns
        if self._cur is None or age_ns >= HALF_WINDOW_NS:
            self._prev = self._cur if self._cur is not None and age_ns < 2 * HALF_WINDOW_NS else None
            self._cur, self._cur_start_ns = d, t_recv_ns
            settled &= self._prev is not None  # the first message, or the first after a pause: a new floor
        else:
            self._cur = min(self._cur, d)
        self._settled = self._settled + 1 if settled else 0
        self.floor_ns = self._cur if self._prev is None else min(self._prev, self._cur)
        behind = self.floor_ns < 0 or (self._prev is not None and self.floor_ns > OFFSET_LIMIT_NS)
        if not self.other_host:  # one clock: a late stream is late, not an offset
            was_late, self.late = self.late, behind or (self.late and self.floor_ns > OFFSET_LIMIT_NS)
            return "late" if self.late and not was_late else "taken"
        if self.offset:
            return "taken"
        self.offset = behind
        return "offset" if self.offset else "taken"

    def _plausible(self, d: int) -> bool:
        if d > self.floor_ns + LATE_LIMIT_NS:
            return False
        if not self.offset:
            return d >= 0
        return self._settled < JUMP_SAMPLES or d >= self.floor_ns - EARLY_LIMIT_NS

    def _implausible(self, t_src_ns: int, d: int, t_recv_ns: int) -> str:
        streak = self._streak
        if streak and (t_src_ns <= streak[-1][0] or abs(d - streak[0][1]) > JUMP_AGREE_NS):
            streak.clear()
        streak.append((t_src_ns, d))
        if len(streak) < JUMP_SAMPLES:
            self.implausible += 1
            return "implausible"
        floor = min(d for _, d in streak)
        self.jumps, self.jump_ns = self.jumps + 1, floor - self.floor_ns
        streak.clear()
        self._cur, self._prev, self._cur_start_ns = floor, None, t_recv_ns
        self.floor_ns, self._settled = floor, 0
        # JUMP_SAMPLES that agree stand for a whole window
        self.offset = self.other_host and (floor < 0 or floor > OFFSET_LIMIT_NS)
        self.late = not self.other_host and floor > OFFSET_LIMIT_NS
        return "jump"

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

    def describe_late(self) -> str:
        """What a late stream on this host's clock is (the ErrorEvent's text)."""
        return (f"observations arrive at least {self.floor_ns / 1e6:.1f} ms after they were taken "
                f"(for {2 * HALF_WINDOW_NS / 1e9:g} s), on this host's monotonic clock: their ages are true, so ones "
                "older than max_obs_age_ms are stale (obs_stale), never served. A source on another host's clock: "
                "set RuntimeConfig.obs_clock = 'other'")

    def describe_ahead(self) -> str:
        """What a timestamp ahead of this host's clock means (the ErrorEvent's text)."""
        return ("an observation timestamp lies ahead of this host's monotonic clock (received before it was sent): "
                "not this host's CLOCK_MONOTONIC, refused (obs_implausible). Stamp observations with "
                "time.perf_counter_ns(), or for a source on another host set RuntimeConfig.obs_clock = 'other'")

    def describe_jump(self) -> str:
        """What the last jump was (the ErrorEvent's text)."""
        now = (f"on a clock {-self.floor_ns / 1e6:+.1f} ms from this host's, read against it" if self.offset
               else "on this host's clock again")
        return (f"the observation source's clock jumped {-self.jump_ns / 1e6:+.1f} ms ({JUMP_SAMPLES} messages in "
                f"a row agreed): it restarted on another host or clock, or its clock was stepped. Its timestamps are "
                f"now {now}; its session goes on from there")


class ObservationSource:
    """The source's current session: its schedule (period_ns, from the Start), the newest observation, the next seq
    the runtime decodes (next_seq; the node advances it), and its clock. Counters: restarts, out_of_order."""

    def __init__(self, other_host: bool = False):
        self.clock = SourceClock(other_host)  # other_host: its timestamps are another host's clock
        self.start: Start | None = None
        self.t0_ns: int | None = None  # observations taken before it are stale (the Start's; None after a jump)
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
        self.start, self.t0_ns, self.last, self.next_seq = start, start.t0_ns, None, 0
        return True

    def heard(self, msg: Message, t_recv_ns: int) -> str | None:
        """Sample the clock with a message's timestamp (Hello, Heartbeat, Observation): its verdict (VERDICTS; None
        for a message without one). NOT_TAKEN: the message is not to be served. "jump": the session's times
        were on the clock before it, so it goes on from the next observation admitted (report clock.describe_jump());
        "offset": report clock.describe(); "late": clock.describe_late(); "ahead": clock.describe_ahead()."""
        if not isinstance(msg, (Observation, Hello, Heartbeat)):
            return None
        verdict = self.clock.sample(msg.t_ns, t_recv_ns)
        if verdict == "jump":
            self.t0_ns, self.last, self.next_seq = None, None, 0
        return verdict

    def admit(self, obs: Observation) -> str:
        """Whether obs (a plausible one: heard() first) is the newest of its session: "new", "restart" (its seq went
        back while its time went forward: the source restarted without a Start; a new session, counted), "old"
        (reordered, or the same observation again: its seq or its timestamp is the newest's; counted in
        out_of_order) or "before_start" (taken before its session's Start)."""
        last = self.last
        if self.t0_ns is not None and obs.t_ns < self.t0_ns:
            return "before_start"
        if last is not None:
            if obs.seq == last.seq or obs.t_ns == last.t_ns or (obs.seq < last.seq and obs.t_ns < last.t_ns):
                self.out_of_order += 1
                return "old"
            if obs.seq < last.seq:  # and later in time
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
