"""Observation ages on this host's clock (edgeinfer/node/source.py, the default on loopback), on injected times: a
stream that comes late is stale, never taken for a clock offset; a timestamp ahead of this host's clock is refused,
never followed as a jump. Only a source declared on another host's clock (other_host) is read against an offset.
The same through a real `edgeinfer serve` process: tests/test_runtime_boundary.py."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeinfer.core.wire import Observation, Start
from edgeinfer.node.source import NOT_TAKEN, ObservationSource, SourceClock

pytestmark = pytest.mark.background  # CPU-bound, no real-time bound (tests/conftest.py)

MS, US = 1_000_000, 1_000
P = 4 * MS  # 250 Hz
MAX_AGE = 50 * MS  # RuntimeConfig.max_obs_age_ms's default


def _obs(seq: int, t_ns: int) -> Observation:
    q = np.zeros(6)
    return Observation(seq, t_ns, q, q, q)


def _served(src: ObservationSource, obs: Observation, t_recv_ns: int) -> tuple[str, str]:
    """(the clock's verdict, what the runtime node does with obs: "refused", "old", "stale" or "served"), as
    edgeinfer/node/serve.py's _plan."""
    verdict = src.heard(obs, t_recv_ns)
    if verdict in NOT_TAKEN:
        return verdict, "refused"
    admitted = src.admit(obs)
    if admitted == "old":
        return verdict, "old"
    age_ns = t_recv_ns - src.clock.local_ns(obs.t_ns)
    return verdict, "stale" if admitted == "before_start" or age_ns > MAX_AGE else "served"


def _late_stream(src: ObservationSource, late_ns: int, n: int, t0_ns: int = 1_000_000 * MS) -> list[tuple[str, str]]:
    """Observation k taken at t0 + k P, received late_ns after (one clock, loopback: the red team's delayed log)."""
    src.begin(Start(t0_ns, P, 10**6))
    return [_served(src, _obs(k, t0_ns + k * P), t0_ns + k * P + late_ns) for k in range(n)]


def test_a_stream_300_ms_late_on_this_hosts_clock_is_stale_never_an_offset():
    src = ObservationSource()  # the default: this host's CLOCK_MONOTONIC
    got = _late_stream(src, 300 * MS, 500)  # 2 s: four times the window an offset was declared after
    assert [what for _, what in got] == ["stale"] * 500  # not one served as fresh (on main: 52, after 0.47 s)
    verdicts = [v for v, _ in got]
    assert verdicts.count("late") == 1 and set(verdicts) == {"taken", "late"}  # reported once (error.obs_late)
    assert verdicts.index("late") * P <= 500 * MS  # within a window: 0.25-0.5 s
    clock = src.clock
    assert not clock.offset and clock.late and clock.floor_ns == 300 * MS
    assert clock.local_ns(123) == 123  # ages read as they are
    assert "at least 300.0 ms after they were taken" in clock.describe_late() and "obs_clock" in clock.describe_late()


def test_the_same_stream_declared_another_hosts_clock_is_an_offset():
    src = ObservationSource(other_host=True)  # RuntimeConfig.obs_clock "other" (HIL, a robot's PC)
    got = _late_stream(src, 300 * MS, 500)
    assert [v for v, _ in got].count("offset") == 1 and src.clock.offset
    assert [what for _, what in got[-100:]] == ["served"] * 100  # read against the estimated offset


def test_a_late_stream_that_catches_up_is_served_and_reported_again_if_late_again():
    src = ObservationSource()
    t0 = 1_000_000 * MS
    src.begin(Start(t0, P, 10**6))
    lates = [300 * MS] * 250 + [60 * US] * 250 + [300 * MS] * 250  # 1 s late, 1 s on time, 1 s late
    got = [_served(src, _obs(k, t0 + k * P), t0 + k * P + late) for k, late in enumerate(lates)]
    assert [v for v, _ in got].count("late") == 2
    assert [what for _, what in got[250 + 130:500]] == ["served"] * 120  # on time again (the floor forgot)
    assert {what for _, what in got[:250]} == {"stale"} and {what for _, what in got[500:]} == {"stale"}


def test_a_timestamp_ahead_of_this_hosts_clock_is_refused_and_never_followed_as_a_jump():
    clock = SourceClock()
    got = [clock.sample(10 * MS + k * P + 2_000 * MS, 10 * MS + k * P + 60 * US) for k in range(20)]  # 2 s ahead
    assert got == ["ahead"] * 20
    assert (clock.implausible, clock.ahead, clock.jumps, clock.offset, clock.floor_ns) == (20, 20, 0, False, None)
    assert "set RuntimeConfig.obs_clock = 'other'" in clock.describe_ahead()
    assert clock.sample(10_000 * MS, 10_000 * MS + 60 * US) == "taken"  # a correct one after them


@settings(max_examples=200, deadline=None)
@given(late_us=st.lists(st.integers(0, 999_000), min_size=1, max_size=300))
def test_on_this_hosts_clock_ages_are_true_and_an_old_observation_is_never_served(late_us):
    """Invariant: however late each observation comes (0 to 1 s, in any order of lateness), an observation is served
    only when its true age (t_recv - t_obs) is within max_obs_age_ms, and no verdict is an offset."""
    src = ObservationSource()
    t0 = 1_000_000 * MS
    src.begin(Start(t0, P, 10**6))
    for k, late in enumerate(late_us):
        t_obs, t_recv = t0 + k * P, t0 + k * P + late * US
        verdict, what = _served(src, _obs(k, t_obs), t_recv)
        assert verdict != "offset" and not src.clock.offset
        if what == "served":
            assert t_recv - t_obs <= MAX_AGE
        elif late * US > MAX_AGE:
            assert what in ("stale", "refused")  # refused: implausible, over 1 s beyond the floor
