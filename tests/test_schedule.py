import numpy as np
import pytest

from edgeinfer.logs.arm_log import ArmLog, LogError, synthetic_log
from edgeinfer.sim.schedule import previous_rows, tick_grid


def _log_with_times(t_s):
    n = len(t_s)
    return ArmLog("t", np.asarray(t_s, dtype=float), np.zeros((n, 6)), np.zeros((n, 6)))


def test_dropped_sample_leaves_a_tick_without_observation():
    log = synthetic_log(seconds=0.2)
    keep = np.r_[0:20, 21:len(log)]  # drop row 20
    gap = ArmLog("gap", log.t_s[keep], log.q_rad[keep], log.qd_rad_s[keep])
    ticks = tick_grid(gap)
    assert ticks[19] == 19 and ticks[20] == 21 and ticks[-1] == len(log) - 1
    assert np.all(np.diff(ticks) >= 1)


def test_jittered_timestamps_round_to_their_tick():
    t = np.arange(100) * 0.004 + np.random.default_rng(0).uniform(-0.0004, 0.0004, 100)
    t[0] = 0.0
    assert np.array_equal(tick_grid(_log_with_times(t)), np.arange(100))


def test_off_grid_sample_is_an_error_naming_the_line():
    t = np.arange(50) * 0.004
    t[30] += 0.0018  # 0.45 of a period off the grid
    with pytest.raises(LogError, match="time.csv line 31"):
        tick_grid(_log_with_times(t))


def test_previous_rows_follow_ticks_not_rows():
    ticks = np.array([0, 1, 2, 4, 5, 6, 7])  # tick 3 missing
    assert previous_rows(ticks, 2).tolist() == [0, 0, 0, 2, 2, 3, 4]
