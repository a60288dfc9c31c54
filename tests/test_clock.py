"""edgeinfer.clock: absolute-deadline sleeping and the skip-on-overrun Ticker.

Machines running these tests are shared and noisy, so bounds on lateness are generous (ms, not us)
and the tests check ordering and skip logic rather than speed.
"""
import time

import pytest

from edgeinfer.clock import Ticker, now_ns, sleep_until

MS = 1_000_000
LATE_BOUND_NS = 5 * MS  # generous: the spin tail normally keeps lateness in the tens of us


@pytest.mark.parametrize("ahead_ms", [0.05, 0.5, 3.0, 12.0])
def test_sleep_until_never_returns_before_the_deadline(ahead_ms):
    for _ in range(5):
        deadline = now_ns() + int(ahead_ms * MS)
        lateness = sleep_until(deadline)
        woke = now_ns()
        assert woke >= deadline
        assert lateness >= 0
        # the reported lateness was measured before `woke`, so it cannot exceed it
        assert lateness <= woke - deadline
        assert lateness < LATE_BOUND_NS


def test_sleep_until_without_spin_window_still_waits_for_the_deadline():
    deadline = now_ns() + 2 * MS
    assert sleep_until(deadline, spin_ns=0) >= 0
    assert now_ns() >= deadline


def test_sleep_until_past_deadline_returns_at_once_with_its_lateness():
    deadline = now_ns() - 7 * MS
    t_before = now_ns()
    lateness = sleep_until(deadline)
    t_after = now_ns()
    assert lateness >= 7 * MS
    assert lateness <= t_after - deadline
    assert t_after - t_before < 50 * MS  # it did not sleep (very loose: only rules out a real wait)


def test_ticker_rejects_non_positive_period():
    for bad in (0, -10 * MS):
        with pytest.raises(ValueError, match="period_ns"):
            Ticker(now_ns(), bad)


def test_tick_time_is_t0_plus_n_periods():
    t = Ticker(1_000, 250)
    assert [t.tick_time_ns(n) for n in (0, 1, 7)] == [1_000, 1_250, 2_750]


def test_ticker_ticks_on_absolute_deadlines():
    period = 10 * MS
    t0 = now_ns() + 20 * MS  # in the future: the first wait must sleep until t0
    ticker = Ticker(t0, period)
    indices, latenesses = [], []
    for _ in range(15):
        n = ticker.wait()
        woke = now_ns()
        indices.append(n)
        latenesses.append(woke - (t0 + n * period))
    assert indices[0] == 0
    # never early, and never late by more than the generous bound
    assert min(latenesses) >= 0
    assert max(latenesses) < LATE_BOUND_NS
    # every tick is either returned once, in order, or counted as an overrun (none on a quiet machine)
    assert all(b > a for a, b in zip(indices, indices[1:]))
    assert indices[-1] == len(indices) - 1 + ticker.overruns
    assert ticker.next_tick == indices[-1] + 1
    assert 0 <= ticker.max_lateness_ns <= max(latenesses)


def test_ticker_skips_missed_ticks_after_an_overrun_without_a_burst():
    period = 10 * MS
    t0 = now_ns() + 10 * MS
    ticker = Ticker(t0, period)
    returned = []  # (tick index, wall time wait() returned)

    n = ticker.wait()
    returned.append((n, now_ns()))
    assert n == 0 and ticker.overruns == 0

    # Artificial overrun: the loop body takes 3.5 periods, measured from tick 0's deadline.
    sleep_until(t0 + int(3.5 * period))
    before = now_ns()
    n = ticker.wait()
    returned.append((n, now_ns()))
    elapsed_periods = (before - t0) / period
    assert 3.5 <= elapsed_periods < 3.95, "machine stalled too long for this test to be meaningful"
    # Ticks 1 and 2 are long gone: skipped and counted. Tick 3 (0.5 period ago) is the next to run.
    assert n == 3
    assert ticker.overruns == 2
    assert ticker.max_lateness_ns >= int(0.5 * period) - MS  # tick 3 ran late, and that was recorded
    assert ticker.max_lateness_ns < period

    for _ in range(4):
        n = ticker.wait()
        returned.append((n, now_ns()))

    ticks = [i for i, _ in returned]
    assert ticks[:2] == [0, 3]
    assert all(b > a for a, b in zip(ticks, ticks[1:]))
    # after the overrun the ticker is back on schedule: no further skips on a quiet machine
    assert ticks[-1] == ticks[1] + 4 + (ticker.overruns - 2)
    for i, woke in returned:
        assert woke >= t0 + i * period
    # no catch-up burst: consecutive ticks are at least ~half a period apart (tick 3 at 3.5p, tick 4 at 4p)
    gaps = [b - a for (_, a), (_, b) in zip(returned, returned[1:])]
    assert min(gaps) >= 0.4 * period


def test_ticker_far_behind_start_jumps_to_the_current_tick():
    period = 5 * MS
    t0 = now_ns() - 100 * period - period // 2  # started 100.5 periods ago
    ticker = Ticker(t0, period)
    before = now_ns()
    n = ticker.wait()
    expected = (before - t0) // period  # the newest tick whose time has passed
    assert n in (expected, expected + 1)  # +1 only if a period boundary passed between `before` and wait
    assert ticker.overruns == n
    assert n >= 100
