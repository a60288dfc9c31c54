"""edgeinfer.core.clock: absolute-deadline sleeping and the skip-on-overrun Ticker.

The timing logic (what is slept, for how long, which tick runs after an overrun or a stall) is checked on an
injected clock: `now_ns` and `time.sleep` of the module replaced by a fake that a test advances, as ros2_control
tests its loop. The real clock is checked only for what no host stall can break: never early, and the lateness
reported is the lateness measured.
"""
from types import SimpleNamespace

import pytest

from edgeinfer.core import clock
from edgeinfer.core.clock import Ticker, now_ns, sleep_until

MS = 1_000_000
US = 1_000
SPIN = 200 * US  # sleep_until's and Ticker's default spin window


class FakeClock:
    """The monotonic clock and time.sleep of edgeinfer.core.clock. now() advances `read_ns` per read (so a spin
    makes progress); sleep(s) records s and advances by it plus `wake_late_ns`, plus stalls[i] at sleep i (a host
    that stalls the process while it sleeps)."""

    def __init__(self, read_ns: int = 1 * US, wake_late_ns: int = 0):
        self.t, self.read_ns, self.wake_late_ns = 10**12, read_ns, wake_late_ns
        self.sleeps: list[float] = []  # seconds asked of each sleep
        self.stalls: dict[int, int] = {}

    def now(self) -> int:
        t = self.t
        self.t += self.read_ns
        return t

    def sleep(self, s: float) -> None:
        self.t += round(s * 1e9) + self.wake_late_ns + self.stalls.get(len(self.sleeps), 0)
        self.sleeps.append(s)


@pytest.fixture
def fake(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(clock, "now_ns", c.now)
    monkeypatch.setattr(clock, "time", SimpleNamespace(sleep=c.sleep))
    return c


# --- the real clock: invariants only -------------------------------------------------------------------------

@pytest.mark.parametrize("ahead_ms", [0.05, 0.5, 3.0, 12.0])
def test_sleep_until_never_returns_before_the_deadline(ahead_ms):
    for _ in range(7):
        deadline = now_ns() + int(ahead_ms * MS)
        lateness = sleep_until(deadline)
        woke = now_ns()
        assert woke >= deadline and lateness >= 0
        assert lateness <= woke - deadline  # measured before `woke`: it cannot exceed it


def test_sleep_until_without_spin_window_still_waits_for_the_deadline():
    deadline = now_ns() + 2 * MS
    assert sleep_until(deadline, spin_ns=0) >= 0
    assert now_ns() >= deadline


def test_ticker_on_the_real_clock_never_ticks_early_and_accounts_for_every_tick():
    period = 10 * MS
    t0 = now_ns() + 20 * MS
    ticker = Ticker(t0, period)
    indices = []
    for _ in range(15):
        n = ticker.wait()
        assert now_ns() >= t0 + n * period
        indices.append(n)
    # every tick is either returned once, in order, or counted as an overrun (a stalled host makes overruns)
    assert all(b > a for a, b in zip(indices, indices[1:]))
    assert indices[-1] == len(indices) - 1 + ticker.overruns and ticker.next_tick == indices[-1] + 1


# --- the logic, on the injected clock ---------------------------------------------------------------------------

@pytest.mark.parametrize("ahead_ms", [0.05, 0.5, 3.0, 12.0])
def test_sleep_until_sleeps_to_the_spin_window_then_spins_to_the_deadline(fake, ahead_ms):
    deadline = fake.t + int(ahead_ms * MS)
    lateness = sleep_until(deadline)
    # one OS sleep, in seconds, up to the spin window (none when the deadline is inside it); then the spin
    expected = [pytest.approx((ahead_ms * MS - SPIN) / 1e9, abs=1e-9)] if ahead_ms * MS > SPIN else []
    assert fake.sleeps == expected
    assert fake.t >= deadline and 0 <= lateness <= 2 * fake.read_ns  # on the deadline, to the clock's resolution


def test_a_late_wake_up_is_reported_not_slept_again(fake):
    fake.wake_late_ns = 5 * MS  # the OS (or a stalled host) wakes the sleeper 5 ms late
    deadline = fake.t + 12 * MS
    lateness = sleep_until(deadline)
    assert len(fake.sleeps) == 1
    assert lateness == pytest.approx(5 * MS - SPIN, abs=5 * US)


def test_sleep_until_past_deadline_returns_at_once_with_its_lateness(fake):
    deadline = fake.t - 7 * MS
    assert sleep_until(deadline) == pytest.approx(7 * MS, abs=5 * US)
    assert fake.sleeps == []  # no sleep at all


def test_sleep_until_without_spin_window_sleeps_the_whole_way(fake):
    deadline = fake.t + 2 * MS
    assert sleep_until(deadline, spin_ns=0) >= 0
    assert fake.sleeps == [pytest.approx(2e-3)] and fake.t >= deadline


def test_ticker_rejects_non_positive_period():
    for bad in (0, -10 * MS):
        with pytest.raises(ValueError, match="period_ns"):
            Ticker(10**12, bad)


def test_tick_time_is_t0_plus_n_periods():
    t = Ticker(1_000, 250)
    assert [t.tick_time_ns(n) for n in (0, 1, 7)] == [1_000, 1_250, 2_750]


def test_ticker_ticks_on_absolute_deadlines_so_lateness_never_accumulates(fake):
    fake.wake_late_ns = SPIN + 100 * US  # every wake-up 100 us past the spin window: each tick 100 us late
    period = 10 * MS
    t0 = fake.t + 20 * MS
    ticker = Ticker(t0, period)
    woke = []
    for _ in range(15):
        n = ticker.wait()
        woke.append((n, fake.now() - (t0 + n * period)))
    assert [n for n, _ in woke] == list(range(15)) and ticker.overruns == 0
    # a relative sleep would drift by 100 us a tick (1.4 ms by tick 14); absolute deadlines keep each at 100 us
    assert all(late == pytest.approx(100 * US, abs=5 * US) for _, late in woke)
    assert ticker.max_lateness_ns == pytest.approx(100 * US, abs=5 * US) and ticker.next_tick == 15


def test_ticker_skips_missed_ticks_after_an_overrun_without_a_burst(fake):
    period = 10 * MS
    t0 = fake.t + period
    ticker = Ticker(t0, period)
    returned = [(ticker.wait(), fake.now())]
    fake.t = t0 + int(3.5 * period)  # the loop body overruns until 3.5 periods after t0
    for _ in range(5):
        returned.append((ticker.wait(), fake.now()))
    # ticks 1 and 2 are a whole period or more behind: counted and skipped; tick 3 (0.5 period late) runs at once
    assert [n for n, _ in returned] == [0, 3, 4, 5, 6, 7] and ticker.overruns == 2
    assert ticker.max_lateness_ns == pytest.approx(period // 2, abs=5 * US)
    woke = [t - t0 for _, t in returned]
    assert woke[1] == pytest.approx(3.5 * period, abs=5 * US)
    # no catch-up burst: ticks 4.. each on its own deadline
    assert all(w == pytest.approx(n * period, abs=5 * US) for (n, _), w in zip(returned[2:], woke[2:]))


def test_a_stall_inside_the_sleep_skips_the_ticks_it_covered(fake):
    period = 4 * MS
    fake.stalls[3] = int(2.5 * period)  # the host stalls the 4th sleep (tick 3's) by 2.5 periods
    ticker = Ticker(fake.t + period, period)
    ticks = [ticker.wait() for _ in range(6)]
    # tick 3 was already being waited for: it runs, 2.5 periods late; tick 4 is then 1.5 periods behind (skipped)
    # and tick 5, half a period behind, runs at once: one overrun, no burst
    assert ticks == [0, 1, 2, 3, 5, 6] and ticker.overruns == 1
    assert ticker.max_lateness_ns == pytest.approx(2.5 * period - SPIN, abs=5 * US)


def test_ticker_far_behind_start_jumps_to_the_current_tick(fake):
    period = 5 * MS
    t0 = fake.t - 100 * period - period // 2  # started 100.5 periods ago
    ticker = Ticker(t0, period)
    assert ticker.wait() == 100 and ticker.overruns == 100  # the newest tick whose time has passed
    assert ticker.max_lateness_ns == pytest.approx(period // 2, abs=5 * US)
    assert ticker.wait() == 101 and fake.now() - (t0 + 101 * period) < 5 * US  # then on its deadlines again
