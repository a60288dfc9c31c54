"""The observation source as the runtime node sees it (edgeinfer/node/source.py), on injected times: its clock (the
delay floor, an offset and jumps of another host's clock: other_host=True, implausible timestamps), its sessions
(restarts, reordering) and the window the loop spins in around a due time; and core.clock.wait_until, the
sleep-then-spin both share. This host's clock: tests/test_obs_clock.py."""
import time

import numpy as np
import pytest

from edgeinfer.core.clock import now_ns, wait_until
from edgeinfer.core.wire import Heartbeat, Hello, Observation, Start
from edgeinfer.node.source import HALF_WINDOW_NS, JUMP_SAMPLES, MAX_WAIT_NS, DueWindow, ObservationSource, SourceClock

MS, US = 1_000_000, 1_000
P = 4 * MS  # 250 Hz


def _obs(seq: int, t_ns: int) -> Observation:
    q = np.zeros(6)
    return Observation(seq, t_ns, q, q, q)


def _feed(clock: SourceClock, d_ns, t0_ns: int, n: int, step_ns: int = P) -> list[str]:
    """n samples received every step_ns from t0_ns, each d_ns(i) after it was sent: the clock's verdicts."""
    return [clock.sample(t0_ns + i * step_ns - d_ns(i), t0_ns + i * step_ns) for i in range(n)]


def test_a_clock_ahead_is_an_offset_at_its_first_message():
    clock = SourceClock(other_host=True)
    assert clock.sample(t_src_ns=10_000 * MS, t_recv_ns=8_000 * MS) == "offset"  # received 2 s before it was sent
    assert clock.offset and clock.floor_ns == -2_000 * MS
    assert clock.local_ns(10_000 * MS + 5 * MS) == 8_005 * MS  # read on this host's clock
    assert clock.sample(10_004 * MS, 8_004 * MS + 80 * US) == "taken"  # reported once
    assert "before they were sent" in clock.describe() and "perf_counter_ns" in clock.describe()


def test_a_clock_behind_is_an_offset_only_once_a_whole_window_says_so():
    clock = SourceClock(other_host=True)
    n_window = HALF_WINDOW_NS // P
    revealed = _feed(clock, lambda i: 2_000 * MS + 60 * US, 0, 3 * n_window)
    first = revealed.index("offset")
    assert n_window - 1 <= first <= n_window + 1  # one half-window of samples: not a backlog read at once
    assert set(revealed[:first] + revealed[first + 1:]) == {"taken"}
    assert clock.local_ns(0) == 2_000 * MS + 60 * US  # the fastest message is age 0
    assert "took at least 2000.1 ms one way" in clock.describe()


def test_a_backlog_or_a_delay_drill_is_not_an_offset():
    clock = SourceClock()
    # a backlog read at once after a 1 s warm-up (Hellos every 10 ms, read 10 us apart), then a live stream
    assert set(_feed(clock, lambda i: 1_000 * MS - i * 10 * MS + 50 * US, 0, 100, step_ns=10 * US)) == {"taken"}
    assert set(_feed(clock, lambda i: 50 * US, 2 * MS, 500)) == {"taken"}
    # every observation delayed 100 ms (sim/network_faults.py), the replayer's Heartbeats (every 20 ms) are not
    clock2 = SourceClock()
    for i in range(500):
        t = i * P
        assert clock2.sample(t - 100 * MS, t) == "taken"
        if i % 5 == 0:
            assert clock2.sample(t - 40 * US, t + 1) == "taken"
    assert not clock2.offset and clock2.floor_ns == 40 * US + 1
    assert clock2.local_ns(123) == 123  # one clock: timestamps are taken as they are


def test_the_floor_follows_a_drifting_clock():
    clock = SourceClock(other_host=True)
    ppm = 50  # the source's clock runs 50 ppm slow: d grows 50 us a second
    _feed(clock, lambda i: 3_000 * MS + i * P * ppm // 1_000_000 + 70 * US, 0, 2500)  # 10 s
    assert clock.offset
    d_now = 3_000 * MS + 2500 * P * ppm // 1_000_000 + 70 * US
    assert 0 <= d_now - clock.floor_ns < 2 * HALF_WINDOW_NS * ppm // 1_000_000 + P  # not the stale 10 s old floor


def test_a_new_start_or_a_seq_that_goes_back_in_later_time_is_a_restart():
    src = ObservationSource()
    assert src.begin(Start(1_000 * MS, P, 100))
    assert not src.begin(Start(1_000 * MS, P, 100))  # the same Start again
    assert [src.admit(_obs(s, 1_000 * MS + s * P)) for s in (0, 1, 3)] == ["new"] * 3
    src.next_seq = 4
    assert src.admit(_obs(2, 1_000 * MS + 2 * P)) == "old"  # reordered
    assert src.admit(_obs(3, 1_000 * MS + 3 * P)) == "old"  # duplicated
    assert src.admit(_obs(1, 999 * MS)) == "before_start"
    assert (src.restarts, src.out_of_order) == (0, 2)
    # the robot restarted without a Start: seq 0 again, later in time
    assert src.admit(_obs(0, 2_000 * MS)) == "restart"
    assert (src.restarts, src.next_seq, src.last.seq) == (1, 0, 0)
    assert src.admit(_obs(1, 2_000 * MS + P)) == "new"
    # and with a Start
    assert src.begin(Start(3_000 * MS, 2 * P, 100))
    assert (src.restarts, src.next_seq, src.last, src.period_ns) == (2, 0, None, 2 * P)
    assert src.admit(_obs(0, 3_000 * MS)) == "new"


def _take(src: ObservationSource, obs: Observation, t_recv_ns: int, max_age_ns: int = 50 * MS) -> str:
    """What the runtime node does with obs (edgeinfer/node/serve.py, _plan): "implausible", "old", "stale" or
    "served" (any replan)."""
    if src.heard(obs, t_recv_ns) == "implausible":
        return "implausible"
    admitted = src.admit(obs)
    if admitted == "old":
        return "old"
    stale = admitted == "before_start" or t_recv_ns - src.clock.local_ns(obs.t_ns) > max_age_ns
    return "stale" if stale else "served"


def _stream(src: ObservationSource, seqs, t0_ns: int, offset_ns: int = 0, bad: dict | None = None) -> list[str]:
    """Observation k taken at t0 + k P on this host's clock (stamped offset_ns off it), received 60 us later; after
    observation k, each of bad.get(k, []) (an Observation) arrives 10 us later. What _take() says of each."""
    got = []
    for k in seqs:
        t = t0_ns + k * P
        got.append(_take(src, _obs(k, t + offset_ns), t + 60 * US))
        got += [_take(src, b, t + 70 * US) for b in (bad or {}).get(k, [])]
    return got


@pytest.mark.parametrize("offset_s", [0.0, -3.0, 3.0])
def test_a_corrupted_timestamp_is_implausible_and_poisons_nothing(offset_s):
    """A bit flipped in t_ns still decodes. In the future (bit 40: +1100 s; bit 27: +134 ms) or the past (bit 41:
    -2200 s), it must not set the floor (an offset, every later observation stale), begin a session (a false
    restart) or be served."""
    src, off = ObservationSource(other_host=True), int(offset_s * 1e9)
    t0 = 10_000_000 * MS  # 10**4 s: bit 41 (2200 s) can be cleared
    src.begin(Start(t0 + off, P, 10**6))
    warm = _stream(src, range(200), t0, off)  # 0.8 s: an offset is known by then
    assert src.clock.offset == (off != 0) and warm[-100:] == ["served"] * 100

    def flipped(k: int, dt_ns: int) -> Observation:  # a copy of observation k, one bit of its t_ns flipped
        return _obs(k, t0 + k * P + off + dt_ns)

    bad = {200: [flipped(200, 1 << 40)], 230: [flipped(230, 1 << 27)], 260: [flipped(260, -(1 << 41))]}
    got = _stream(src, range(200, 300), t0, off, bad)
    assert got.count("implausible") == 3 and got.count("served") == 100  # every correct one, before and after
    assert src.clock.implausible == 3 and src.clock.jumps == 0
    assert (src.out_of_order, src.restarts) == (0, 0)  # no session began from one, none followed out of order
    assert src.clock.offset == (off != 0) and abs(src.clock.floor_ns - (60 * US - off)) <= 10 * US
    assert src.due_ns() == t0 + 300 * P + off + src.clock.floor_ns  # the schedule from the correct ones


@pytest.mark.parametrize("jump_s", [-3600.0, -2.0, 3600.0])
def test_a_clock_that_jumped_is_followed_after_three_agreeing_messages(jump_s):
    """The source restarts on a clock jump_s away (a rebooted host: seq from 0 again, no Start): its first
    JUMP_SAMPLES - 1 observations are implausible, then the estimate and the session start again from them."""
    src, jump = ObservationSource(other_host=True), int(jump_s * 1e9)
    t0 = 100_000 * MS
    src.begin(Start(t0, P, 10**6))
    assert _stream(src, range(100), t0) == ["served"] * 100
    t1 = t0 + 100 * P
    got = [_take(src, _obs(k, t1 + k * P + jump), t1 + k * P + 60 * US) for k in range(50)]
    assert got == ["implausible"] * (JUMP_SAMPLES - 1) + ["served"] * (50 - JUMP_SAMPLES + 1)
    clock = src.clock
    assert (clock.jumps, clock.implausible, clock.offset) == (1, JUMP_SAMPLES - 1, True)
    assert clock.jump_ns == -jump and clock.local_ns(t1 + 49 * P + jump) == t1 + 49 * P + 60 * US  # age 60 us
    assert f"jumped {jump_s * 1e3:+.1f} ms" in clock.describe_jump()
    assert (src.restarts, src.out_of_order, src.last.seq) == (0, 0, 49)


def test_a_corrupted_first_message_is_undone_by_the_next_three():
    clock = SourceClock(other_host=True)
    assert clock.sample(10 * MS + (1 << 40), 10 * MS + 60 * US) == "offset"  # from the future: nothing to judge by
    got = [clock.sample(10 * MS + k * P, 10 * MS + k * P + 60 * US) for k in range(1, 5)]
    assert got == ["implausible"] * (JUMP_SAMPLES - 1) + ["jump", "taken"]
    assert not clock.offset and clock.floor_ns == 60 * US and clock.local_ns(123) == 123


def test_a_corrupted_seq_costs_at_most_one_restart_and_starves_nothing():
    src = ObservationSource()
    src.begin(Start(0, P, 10**6))
    t = lambda k: 1_000 * MS + k * P  # noqa: E731
    assert _stream(src, range(10), 1_000 * MS) == ["served"] * 10
    # a copy of the newest with its seq flipped (up, down): the same timestamp, so the same observation
    assert [_take(src, _obs(s, t(9)), t(9) + 70 * US) for s in (9 ^ 1 << 12, 9 ^ 1)] == ["old", "old"]
    assert (src.restarts, src.out_of_order, src.last.seq) == (0, 2, 9)
    # a flipped copy of observation 10 that took the place of observation 10 (latest-only): a new observation,
    # then 11 is a restart (its seq went back, its time forward), served like every one after it
    assert _take(src, _obs(10 ^ 1 << 12, t(10)), t(10) + 60 * US) == "served"
    assert _stream(src, range(11, 20), 1_000 * MS) == ["served"] * 9
    assert (src.restarts, src.last.seq) == (1, 19)


def test_a_backlog_after_a_long_stall_is_implausible_only_past_a_second_and_never_a_jump():
    src = ObservationSource()
    src.begin(Start(0, P, 10**6))
    assert _stream(src, range(100), 0) == ["served"] * 100
    # stalled 2 s: the replayer's Heartbeats (every 20 ms) queued, read at once, then the newest observation
    t_read = 100 * P + 2_000 * MS
    beats = [src.heard(Heartbeat("replayer", 1, k, 100 * P + k * 20 * MS, 100 * MS, -1, 0, P, 10**6), t_read + k * US)
             for k in range(100)]
    assert beats == ["implausible"] * 50 + ["taken"] * 50  # the ones sent more than 1 s before they were read
    assert _take(src, _obs(600, t_read + 140 * US), t_read + 200 * US) == "served"
    assert src.clock.jumps == 0 and src.clock.floor_ns == 60 * US


def test_a_backlog_read_at_once_from_a_clock_ahead_lowers_the_floor_freely():
    # the source's clock is 3 s ahead; its Hellos queued 1 s while the runtime warmed up
    clock = SourceClock(other_host=True)
    got = _feed(clock, lambda i: -3_000 * MS + 1_000 * MS - i * 10 * MS + 50 * US, 0, 100, step_ns=10 * US)
    assert got == ["offset"] + ["taken"] * 99
    assert _feed(clock, lambda i: -3_000 * MS + 50 * US, 2 * MS, 500) == ["taken"] * 500
    assert clock.floor_ns == -3_000 * MS + 50 * US and (clock.implausible, clock.jumps) == (0, 0)
    # settled now: one from 100 ms in the future is implausible
    assert clock.sample(3_000 * MS + 100 * MS, 3 * MS) == "implausible"


def test_the_next_observation_is_due_one_period_per_seq_after_the_newest_plus_the_floor():
    src = ObservationSource()
    src.begin(Start(0, P, 100))
    assert src.due_ns() is None  # nothing heard yet
    assert src.heard(Hello("robot", 0, 5 * MS), 5 * MS + 70 * US) == "taken"
    assert src.heard(Heartbeat("robot", 1, 0, 6 * MS, 100 * MS, -1, 0, P, 100), 6 * MS + 50 * US) == "taken"
    assert src.heard(Start(0, P, 100), 7 * MS) is None  # no timestamp of the source
    src.admit(_obs(10, 10 * P))
    src.heard(_obs(10, 10 * P), 10 * P + 90 * US)
    assert src.clock.floor_ns == 50 * US
    assert src.due_ns() == 11 * P + 50 * US  # replan every tick: the next seq
    src.next_seq = 15  # replan every 5 ticks
    assert src.due_ns() == 15 * P + 50 * US


def test_the_loop_spins_only_in_the_window_of_an_observation_due():
    win = DueWindow(300 * US, P)
    due = 100 * MS
    assert win.end_ns(due, due - 2 * MS) == due + 300 * US  # sleep first, then spin through the window
    assert win.end_ns(due, due + 200 * US) == due + 300 * US  # already in the window: spin now
    assert win.end_ns(due, due + 300 * US) is None  # the window has closed: the stream paused, do not spin
    assert win.end_ns(None, due) is None  # nothing due (no stream yet)
    assert win.end_ns(due, due - MAX_WAIT_NS - 1) is None  # too far ahead: receive (and come back)
    assert DueWindow(0, P).end_ns(due, due - MS) is None  # spinning off
    kinds = [DueWindow(300 * US, P).arrived(due + dt, due, P)
             for dt in (-400 * US, -300 * US, 0, 300 * US, 301 * US, P, P + 1)]
    assert kinds == ["early", "on_time", "on_time", "on_time", "late", "late", "idle"]
    assert win.arrived(due, None, P) == "idle"
    assert [DueWindow(0, P).arrived(due + dt, due, P) for dt in (-1, 0, 1)] == ["early", "late", "late"]  # no spin


def test_the_window_widens_while_wake_ups_and_arrivals_are_late_and_narrows_after():
    win = DueWindow(200 * US, P)
    win.before.woke(1 * MS)  # a sleep that ended 1 ms late (a loaded host)
    for _ in range(3):
        win.arrived(100 * MS + 400 * US, 100 * MS, P)
    assert (win.before.spin_ns, win.after.spin_ns) == (500 * US, 500 * US)  # capped: an eighth of a period
    for _ in range(3000):
        win.before.woke(10 * US)
        win.arrived(100 * MS + 20 * US, 100 * MS, P)
    assert (win.before.spin_ns, win.after.spin_ns) == (200 * US, 200 * US)


def test_wait_until_sleeps_in_ready_then_spins_and_returns_when_ready():
    calls = []

    def never(timeout_ns):  # a socket on which nothing comes
        calls.append(timeout_ns)
        time.sleep(timeout_ns / 1e9)
        return False
    deadline = now_ns() + 3 * MS
    assert not wait_until(deadline, 1 * MS, never)
    assert now_ns() >= deadline
    sleeps = [t for t in calls if t > 0]
    assert sleeps and max(sleeps) <= 2 * MS  # it slept, never into the 1 ms spin window
    assert calls[:len(sleeps)] == sleeps  # then only spun: ready(0)
    n = []
    assert wait_until(now_ns() + 10_000 * MS, 1 * MS, lambda t: n.append(t) or len(n) == 3)  # at once, not 10 s
    assert len(n) == 3


@pytest.mark.parametrize("d", [0, -1])
def test_a_message_that_arrives_before_it_was_sent_is_a_clock_offset(d):
    assert SourceClock(other_host=True).sample(1_000, 1_000 + d) == ("offset" if d < 0 else "taken")
