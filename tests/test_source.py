"""The observation source as the runtime node sees it (edgeinfer/node/source.py), on injected times: its clock (the
delay floor, an offset), its sessions (restarts, reordering) and the window the loop spins in around a due time;
and core.clock.wait_until, the sleep-then-spin both share."""
import time

import numpy as np
import pytest

from edgeinfer.core.clock import now_ns, wait_until
from edgeinfer.core.wire import Heartbeat, Hello, Observation, Start
from edgeinfer.node.source import HALF_WINDOW_NS, MAX_WAIT_NS, DueWindow, ObservationSource, SourceClock

MS, US = 1_000_000, 1_000
P = 4 * MS  # 250 Hz


def _obs(seq: int, t_ns: int) -> Observation:
    q = np.zeros(6)
    return Observation(seq, t_ns, q, q, q)


def _feed(clock: SourceClock, d_ns, t0_ns: int, n: int, step_ns: int = P) -> list[bool]:
    """n samples received every step_ns from t0_ns, each d_ns(i) after it was sent."""
    return [clock.sample(t0_ns + i * step_ns - d_ns(i), t0_ns + i * step_ns) for i in range(n)]


def test_a_clock_ahead_is_an_offset_at_its_first_message():
    clock = SourceClock()
    assert clock.sample(t_src_ns=10_000 * MS, t_recv_ns=8_000 * MS)  # received 2 s before it was sent
    assert clock.offset and clock.floor_ns == -2_000 * MS
    assert clock.local_ns(10_000 * MS + 5 * MS) == 8_005 * MS  # read on this host's clock
    assert not clock.sample(10_004 * MS, 8_004 * MS + 80 * US)  # reported once
    assert "before they were sent" in clock.describe() and "perf_counter_ns" in clock.describe()


def test_a_clock_behind_is_an_offset_only_once_a_whole_window_says_so():
    clock = SourceClock()
    n_window = HALF_WINDOW_NS // P
    revealed = _feed(clock, lambda i: 2_000 * MS + 60 * US, 0, 3 * n_window)
    first = revealed.index(True)
    assert n_window - 1 <= first <= n_window + 1  # one half-window of samples: not a backlog read at once
    assert revealed.count(True) == 1
    assert clock.local_ns(0) == 2_000 * MS + 60 * US  # the fastest message is age 0
    assert "took at least 2000.1 ms one way" in clock.describe()


def test_a_backlog_or_a_delay_drill_is_not_an_offset():
    clock = SourceClock()
    # a backlog read at once after a 1 s warm-up (Hellos every 10 ms, read 10 us apart), then a live stream
    assert not any(_feed(clock, lambda i: 1_000 * MS - i * 10 * MS + 50 * US, 0, 100, step_ns=10 * US))
    assert not any(_feed(clock, lambda i: 50 * US, 2 * MS, 500))
    # every observation delayed 100 ms (sim/faults.py), the replayer's Heartbeats (every 20 ms) are not
    clock2 = SourceClock()
    for i in range(500):
        t = i * P
        assert not clock2.sample(t - 100 * MS, t)
        if i % 5 == 0:
            assert not clock2.sample(t - 40 * US, t + 1)
    assert not clock2.offset and clock2.floor_ns == 40 * US + 1
    assert clock2.local_ns(123) == 123  # one clock: timestamps are taken as they are


def test_the_floor_follows_a_drifting_clock():
    clock = SourceClock()
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


def test_the_next_observation_is_due_one_period_per_seq_after_the_newest_plus_the_floor():
    src = ObservationSource()
    src.begin(Start(0, P, 100))
    assert src.due_ns() is None  # nothing heard yet
    assert not src.heard(Hello("robot", 0, 5 * MS), 5 * MS + 70 * US)
    assert not src.heard(Heartbeat("robot", 1, 0, 6 * MS, 100 * MS, -1, 0, P, 100), 6 * MS + 50 * US)
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
    assert SourceClock().sample(1_000, 1_000 + d) == (d < 0)
