"""The control loop while it runs, without sockets: the runtime as the loop sees it on an injected clock (a link
that stalls, a runtime that dies, the lease derived from the measured link, what a loss does to the commands:
on_runtime_lost) and how every loss is counted, published and logged; overruns in the live Stats. The
runtime's messages reach the loop through a fake link with per-message arrival times; commands, Heartbeats,
Stats and ErrorEvents go to a sink that decodes them."""
import dataclasses
import time
from collections import Counter

import numpy as np
import pytest
import zmq

from edgeinfer.control.loop import ControlConfig, ControlLoop
from edgeinfer.core import transport
from edgeinfer.core.clock import now_ns
from edgeinfer.core.wire import ActionChunk, ErrorEvent, Heartbeat, JointCommand, Observation, Start, Stats, decode

MS = 1_000_000
T0 = 10_000 * MS  # tick 0
PERIOD = 4 * MS  # 250 Hz
PHASE = 1 * MS  # a tick runs 1 ms after its scheduled time (ControlConfig.phase_ms)
PID = 4242


class Clock:
    def __init__(self, t_ns: int):
        self.t = t_ns

    def __call__(self) -> int:
        return self.t


class Link:
    """The runtime's PUB as the loop's chunk SUB sees it: messages in send order, each taken in once the clock
    reaches its arrival time (a stall delays, never reorders or loses)."""

    def __init__(self, clock: Clock, arrivals: list[tuple[int, object]]):
        self.clock, self.queue = clock, sorted(arrivals, key=lambda a: a[0])
        self.malformed, self.malformed_by_kind, self.stale_dropped = 0, Counter(), 0

    def drain(self):
        n = next((i for i, (t, _) in enumerate(self.queue) if t > self.clock()), len(self.queue))
        out, self.queue = [m for _, m in self.queue[:n]], self.queue[n:]
        return out

    def recv_latest(self, timeout_ms, limit=None):
        return transport.Latest(None, [], 0)


class Sink:
    """A socket that decodes what it is sent."""

    def __init__(self):
        self.msgs = []

    def send_multipart(self, frames, **_):
        self.msgs.append(decode(frames))

    def of(self, kind):
        return [m for m in self.msgs if isinstance(m, kind)]

    def close(self, linger=0):
        pass


class Backlogged(Sink):
    """The commands socket with its queue full (HWM reached: nobody reading) while the command of a tick in `full`
    is sent: zmq raises Again, transport.send says False."""

    def __init__(self, full):
        super().__init__()
        self.full = full

    def send_multipart(self, frames, **kw):
        if decode(frames).seq in self.full:
            raise zmq.Again()
        super().send_multipart(frames, **kw)


class Disconnect:
    """A LinkMonitor that reports the runtime's connection dropping at t_ns."""

    relinks = 0  # a LinkMonitor with its endpoint would have reconnected: not what this test is about

    def __init__(self, clock: Clock, t_ns: int):
        self.clock, self.t_ns = clock, t_ns

    def poll(self):
        due, self.t_ns = self.clock() >= self.t_ns, (self.t_ns if self.clock() < self.t_ns else 2**62)
        return 0, int(due)


def runtime_messages(*, n_ms: int, hb_ms: float = 2.0, lease_ms: float = 6.0, horizon: int = 40,
                     stall_every_ms: int | None = None, stall_at_ms: float = 50, stall_ms: float = 10,
                     stop_at_ns: int | None = None):
    """(arrival ns, message) of a runtime that beats every hb_ms and publishes a chunk for every tick's observation
    (ready 3 ms after it, `horizon` steps of one period: 160 ms ahead), from 60 ms before tick 0. The link holds
    everything sent in [k * stall_every_ms + stall_at_ms, + stall_ms) until the end of that window; nothing is sent
    from stop_at_ns on (a killed runtime)."""
    def arrival(t_send):
        if stall_every_ms is None:
            return t_send
        into = (t_send - T0 - int(stall_at_ms * MS)) % (stall_every_ms * MS)
        return t_send + (int(stall_ms * MS) - into) if t_send >= T0 and into < stall_ms * MS else t_send

    sent = []
    for i in range(int((n_ms + 60) / hb_ms)):
        t = T0 - 60 * MS + int(i * hb_ms * MS)
        sent.append((t, Heartbeat("runtime", PID, i, t, int(lease_ms * MS), -1, T0, PERIOD, 10**6)))
    for k in range(-15, n_ms // 4):
        t_obs = T0 + k * PERIOD
        steps = 0.01 * np.sin(1e-9 * (t_obs + PERIOD * np.arange(horizon + 1)))[:, None] * np.ones(6)
        sent.append((t_obs + 3 * MS, ActionChunk(k, k, t_obs, t_obs + 3 * MS, PERIOD, steps, "full", 0, 0, 0, 0)))
    sent.sort(key=lambda s: s[0])
    return [(arrival(t), m) for t, m in sent if stop_at_ns is None or t < stop_at_ns]


def run_loop(messages, n_ticks: int, link=None, late=None, commands=None, **cfg):
    """Tick the control loop n_ticks times on the injected clock (late: {tick: ns} run that late, the ticks it
    overran skipped; commands: the commands socket, a Sink by default). Returns (loop, sink of status, commands
    sent, log lines)."""
    clock = Clock(T0)
    loop = ControlLoop(ControlConfig(**cfg), transport.Endpoints("a", "b", "c", "d"), clock=clock)
    lines = []
    loop.log.write = lines.append
    loop.chunks, loop.obs = Link(clock, messages), Link(clock, [])
    loop.commands, loop.status = commands if commands is not None else Sink(), Sink()
    loop.link = link(clock) if link is not None else None
    loop.last_obs = Observation(0, T0, np.zeros(6), np.zeros(6), np.zeros(6))
    loop.begin(Start(T0, PERIOD, n_ticks))
    n = 0
    while n < n_ticks:
        t_tick = T0 + n * PERIOD
        clock.t = t_tick + PHASE + (late or {}).get(n, 0)
        assert loop._take_messages(t_tick)
        loop._command(n, t_tick, PERIOD / 1e9)
        loop._publish_status()
        n = max(n + 1, (clock.t - T0) // PERIOD)  # the Ticker's skip: never a tick a whole period behind
    loop._refresh_stats()
    loop.log.close()
    return loop, loop.status, loop.commands.of(JointCommand), lines


def suppressed_total(lines, kind_text):
    """Lines with kind_text, plus the suppressed ones they (and the closing summary) count."""
    n = 0
    for line in lines:
        if kind_text in line:
            n += 1
            if "more like this suppressed" in line:
                n += int(line.rsplit("(", 1)[1].split()[0])
        elif line.endswith(" more runtime_lost lines suppressed") and kind_text == " lost: ":
            n += int(line.split()[1])
    return n


def test_a_stalling_link_costs_no_hold_while_a_chunk_covers_the_tick():
    # 10 ms stalls every 100 ms, nothing lost: 500 ticks, 20 stalls. The lease (two periods at most) expires
    # in each, but the chunks received cover 160 ms ahead, so the loop follows them ("finish") and every tick is
    # commanded from a chunk; each loss is still counted, published and logged (throttled).
    loop, status, cmds, lines = run_loop(runtime_messages(n_ms=2000, stall_every_ms=100), 500)
    st = loop.stats
    assert len(cmds) == st.ticks == 500
    assert st.holds == 0 and st.holds_runtime_dead == 0 and {c.rung for c in cmds} == {"full"}
    assert st.runtime_lost == st.runtime_expired == st.runtime_returned == 20 and st.runtime_restarts == 0
    assert st.commands_after_loss == 20  # one tick per stall ran while the runtime was lost
    events = [e for e in status.of(ErrorEvent) if e.kind == "runtime_lost"]
    assert [e.count for e in events] == list(range(1, 21))  # every loss an ErrorEvent, none rate-limited
    # the log: at most one line per second per kind, and the suppressed ones counted
    lost_lines = [line for line in lines if " lost: " in line]
    assert 1 <= len(lost_lines) <= 3 and suppressed_total(lines, " lost: ") == 20
    back_lines = [line for line in lines if "runtime 4242 back" in line]
    assert 1 <= len(back_lines) <= 3 and len(lines) <= 12
    assert loop.telemetry.snapshot().counters["log_suppressed"] == loop.log.suppressed >= 30
    # live Stats (every 200 ms): the counters as they happen, not only at the end
    live = status.of(Stats)
    assert len(live) >= 9
    mid = live[len(live) // 2].counters
    assert 0 < mid["runtime_lost"] < 20 and mid["runtime_returned"] == mid["runtime_lost"]
    assert mid["error.runtime_lost"] == mid["runtime_lost"] and mid["holds"] == 0


def test_the_same_stalls_hold_at_once_when_asked():
    loop, status, cmds, _ = run_loop(runtime_messages(n_ms=2000, stall_every_ms=100), 500, on_runtime_lost="hold")
    st = loop.stats
    assert st.runtime_lost == 20 and st.holds == st.holds_runtime_dead == 20 and st.commands_after_loss == 0
    assert len([e for e in status.of(ErrorEvent) if e.kind == "runtime_lost"]) == 20


@pytest.mark.parametrize("mode", ["finish", "hold"])
def test_a_dead_runtime_is_declared_lost_within_two_periods(mode):
    # killed at 1000.5 ms: its last Heartbeat was sent at 1000 ms and taken in by the tick at 1001 ms
    t_kill = T0 + 1000 * MS + MS // 2
    # its connection drops 45 ms later (the kernel closing a dying torch process's sockets): not a second loss
    loop, status, cmds, lines = run_loop(runtime_messages(n_ms=2000, stop_at_ns=t_kill), 400,
                                         link=lambda clock: Disconnect(clock, t_kill + 45 * MS),
                                         on_runtime_lost=mode)
    st = loop.stats
    assert st.runtime_lost == st.runtime_expired == 1 and st.runtime_returned == 0
    (event,) = [e for e in status.of(ErrorEvent) if e.kind == "runtime_lost"]
    last_taken_in = T0 + 1001 * MS
    assert last_taken_in < event.t_ns <= last_taken_in + 2 * PERIOD  # the lease: within two periods
    assert loop.runtime_lease.lease_ns == 6 * MS  # 1.5 x the 4 ms between the ticks that took Heartbeats in
    t_tick = np.array([T0 + c.seq * PERIOD for c in cmds])  # the time each command is for
    t_cmd = t_tick + PHASE  # the time it was made
    held = np.array([c.rung == "hold" for c in cmds])
    assert not held[t_cmd < event.t_ns].any()
    if mode == "hold":
        assert held[t_cmd >= event.t_ns].all() and st.commands_after_loss == 0
    else:
        # the last chunk (observation at 996 ms, sent at 999 ms) covers 160 ms: followed to its end, then held
        end = T0 + 996 * MS + 40 * PERIOD
        assert not held[t_tick <= end].any() and held[t_tick > end].all()
        assert st.commands_after_loss == np.sum((t_cmd >= event.t_ns) & (t_tick <= end)) > 30
        assert "following its chunks while they cover the ticks (147 ms), then holding" in event.detail
    assert st.holds == st.holds_runtime_dead == held.sum() > 0


def test_the_lease_follows_the_measured_link():
    # A runtime announcing a 2 ms lease (beating every 0.5 ms) on a link that stalls 6 ms every 100 ms, so that one
    # tick in each stall takes no Heartbeat in: a 2 ms lease would declare it lost in every stall. The loop
    # measures the gaps between the ticks that took Heartbeats in (4 ms, then 8 ms across a stall) and applies
    # 1.5 x that, capped at 1.75 periods (7 ms): the stalls pass unnoticed, even in "hold".
    msgs = runtime_messages(n_ms=2000, hb_ms=0.5, lease_ms=2.0, stall_every_ms=100, stall_at_ms=48.9, stall_ms=6)
    loop, status, cmds, _ = run_loop(msgs, 500, on_runtime_lost="hold")
    st = loop.stats
    assert st.runtime_lost == 0 and st.holds == 0
    assert loop.runtime_lease.lease_ns == 7 * MS and st.runtime_lease_us == 7000 and st.runtime_gap_max_us == 8000
    assert sum(loop.telemetry.histograms["runtime_heartbeat_gap"]) > 400


class Parent:
    def parent_gone(self):
        return False


class Stalling(Link):
    """An idle runtime's chunk SUB in which the loop stalls `stall_ms` (on the real clock) at its read number `at`:
    a host stall in the middle of a tick."""

    def __init__(self, at: int, stall_ms: float):
        super().__init__(Clock(0), [])
        self.at, self.stall_ms, self.reads = at, stall_ms, 0

    def drain(self):
        self.reads += 1
        if self.reads == self.at:
            time.sleep(self.stall_ms / 1e3)
        return super().drain()


def real_time_loop(chunks=None):
    """A control loop for run() on the real clock, its runtime idle (no chunks: every tick holds at the observed
    position). Returns (loop, status sink, log lines)."""
    loop = ControlLoop(ControlConfig(), transport.Endpoints("a", "b", "c", "d"))
    lines, status = [], Sink()
    loop.log.write = lines.append
    idle = Link(Clock(0), [])
    loop.chunks, loop.obs, loop.link, loop.parent, loop.rt_warning = chunks or idle, idle, None, Parent(), None
    loop.commands, loop.status = Sink(), status
    loop.last_obs = Observation(0, 0, np.zeros(6), np.zeros(6), np.zeros(6))
    return loop, status, lines


def test_overruns_are_in_the_live_stats_and_logged_throttled():
    # the run starts 50 ms late (a host stall): the ticks a whole period or more behind are skipped and counted
    # at once, in the first Stats, not only in the last. On the real clock: a longer host stall only adds some
    # (240 ms of ticks: a 100 ms stall more still leaves ticks to run).
    loop, status, lines = real_time_loop()
    stats = loop.run(Start(now_ns() - 50 * MS, PERIOD, 60))
    first, *_, last = status.of(Stats)
    assert first.counters["overruns"] >= 12  # (50 + 1 ms phase) // 4 ms, before the first tick ran
    assert last.counters["overruns"] == stats.overruns >= first.counters["overruns"]
    overrun_lines = [line for line in lines if "overrun" in line]
    assert overrun_lines[0].startswith("control: overrun: ") and len(overrun_lines) <= 3
    assert stats.ticks + stats.overruns == 60  # every tick commanded or counted


def test_ticks_a_stall_skips_at_the_very_end_are_overruns():
    # The loop stalls 100 ms in its 12th tick, past the run's last tick (20 ticks, 80 ms): it never runs again, yet
    # the ticks it skipped are counted (before: 12 ticks, 0 overruns). Every tick is commanded or counted, whatever
    # else the machine stalls: the stall can only move ticks from one side to the other.
    loop, status, lines = real_time_loop(chunks=Stalling(at=12, stall_ms=100))
    stats = loop.run(Start(now_ns() + 5 * MS, PERIOD, 20))
    assert stats.ticks <= 12 and stats.ticks + stats.overruns == 20
    assert status.of(Stats)[-1].counters["overruns"] == stats.overruns  # in the final Stats, for the report
    assert any(line.startswith("control: overrun: ") for line in lines)  # logged (throttled: maybe summed)
    # a run that a stall ended before its first tick: every tick an overrun
    loop, status, _ = real_time_loop()
    stats = loop.run(Start(now_ns() - 200 * MS, PERIOD, 20))
    assert (stats.ticks, stats.overruns, status.of(Stats)[-1].counters["overruns"]) == (0, 20, 20)


def test_commands_the_full_commands_queue_refuses_are_counted():
    # nobody reads the commands for ticks 20..69 (the queue is full): each tick is still commanded, and each command
    # that could not leave is counted, in the live Stats as it happens (sent with a Heartbeat: ticks 0 and 51)
    loop, status, cmds, _ = run_loop(runtime_messages(n_ms=400), 100, commands=Backlogged(range(20, 70)))
    st = loop.stats
    assert st.ticks == 100 and [c.seq for c in cmds] == [*range(20), *range(70, 100)]
    assert [s.counters["commands_dropped"] for s in status.of(Stats)] == [0, 32]
    loop._refresh_stats()
    assert st.commands_dropped == 50 and loop.telemetry.snapshot().counters["commands_dropped"] == 50


# ---- corrupt but decodable messages: none may poison the loop's state ---------------------------------------


def replaced(messages, old, new):
    """The runtime's messages with `old` (a message in them) sent as `new` instead, at the same time."""
    return [(t, new if m is old else m) for t, m in messages]


def chunk_of(messages, obs_seq):
    return next(m for _, m in messages if isinstance(m, ActionChunk) and m.obs_seq == obs_seq)


@pytest.mark.parametrize("field", ["t_obs_ns", "seq"])
def test_one_corrupt_chunk_does_not_poison_the_newest(field):
    # The chunk of observation 25 (anchored at 100 ms) arrives with bit 40 flipped, as a bit flip in an observation
    # the runtime planned from leaves it: in t_obs_ns it is anchored 18 minutes ahead; in seq and obs_seq it names
    # an observation that never was. Either way every later, correct chunk is followed the tick it is taken in:
    # no hold, none superseded. (Before the fix the future one became the newest for good: every later chunk was
    # superseded and the loop fell back to older chunks, then held once they ended, 160 ms later.)
    msgs = runtime_messages(n_ms=400)
    good = chunk_of(msgs, 25)
    if field == "t_obs_ns":
        bad = dataclasses.replace(good, t_obs_ns=good.t_obs_ns ^ 1 << 40)
    else:
        bad = dataclasses.replace(good, seq=good.seq ^ 1 << 40, obs_seq=good.obs_seq ^ 1 << 40)
    loop, status, cmds, lines = run_loop(replaced(msgs, good, bad), 100)
    st = loop.stats
    assert len(cmds) == st.ticks == 100 and st.holds == 0 and st.chunks_superseded == 0 and st.chunks_expired == 0
    assert {c.rung for c in cmds} == {"full"}
    # tick n follows the chunk of observation n - 1 (taken in at n); tick 26: the corrupt one, or the one before
    expected = [c.seq - 1 for c in cmds]
    expected[26] = 24 if field == "t_obs_ns" else bad.obs_seq
    assert [c.chunk_obs_seq for c in cmds] == expected
    implausible = field == "t_obs_ns"
    assert st.chunks_implausible == implausible
    # counted in the live Stats (so in the report's node_stats), published and logged
    assert status.of(Stats)[-1].counters["chunks_implausible"] == implausible
    events = [e for e in status.of(ErrorEvent) if e.kind == "chunk_implausible"]
    assert len(events) == implausible and len([line for line in lines if "anchored" in line]) == implausible
    if implausible:
        # 2**40 ns ahead of its true anchor, taken in 5 ms after it
        assert "chunk 25 (observation 25): anchored 1099506.6 ms ahead of the clock" in events[0].detail
        assert "more than the 11.0 ms a plan can be" in events[0].detail  # a period + the 7 ms lease ceiling


def test_chunks_planned_during_a_stall_of_the_loop_are_plausible():
    # The loop's tick 50 runs 50 ms late (a host stall; ticks 51..61 are skipped): the chunks it takes in are
    # anchored up to 48 ms after that tick's time, but not after the loop's clock, which plausibility is judged on.
    loop, _, cmds, _ = run_loop(runtime_messages(n_ms=400), 100, late={50: 50 * MS})
    st = loop.stats
    assert st.chunks_implausible == 0 and st.chunks_superseded == 0 and st.ticks == len(cmds) == 100 - 11
    after = [c for c in cmds if c.seq > 62]
    assert [c.chunk_obs_seq for c in after] == [c.seq - 1 for c in after] and {c.rung for c in after} == {"full"}


def test_a_heartbeat_with_a_nonpositive_lease_is_counted_and_ignored():
    # The runtime's Heartbeat sent at 100 ms announces a negative lease (a flipped sign bit). Here the lease derived
    # from the measured link already outweighs it (edgeinfer.core.liveliness.Lease; without a ceiling it would
    # expire at once: tests/test_lease_plausible.py); it is not taken in, and it is counted.
    msgs = runtime_messages(n_ms=400)
    good = next(m for t, m in msgs if isinstance(m, Heartbeat) and t == T0 + 100 * MS)
    bad = dataclasses.replace(good, lease_ns=-(2**31) + good.lease_ns)
    loop, status, cmds, _ = run_loop(replaced(msgs, good, bad), 100, on_runtime_lost="hold")
    st = loop.stats
    assert st.runtime_lost == 0 and st.holds == 0 and st.heartbeats_implausible == 1
    assert status.of(Stats)[-1].counters["heartbeats_implausible"] == 1
