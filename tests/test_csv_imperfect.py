"""Imperfect CSV exports: records with empty joint cells (bad_rows) and multi-hour gaps under
derive (gap_periods), in files written by pyarrow in tmp_path."""
from __future__ import annotations

import time
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeinfer.logs import LogError, read_log
from edgeinfer.logs.csv_values import FILL_MAX_ROWS
from edgeinfer.logs.options import ReaderOptions
from edgeinfer.logs.samples import find_gaps, integrate_segments

RATE_HZ = 125.0


def _write(path, t_s, speeds, empty_rows=()):
    """A UR-style export: timestamp, Speed_J0..5 (rad/s), the joint cells of `empty_rows` empty strings."""
    cols = {"timestamp": pa.array([repr(float(t)) for t in t_s])}
    for j in range(speeds.shape[1]):
        cells = [repr(float(v)) for v in speeds[:, j]]
        for i in empty_rows:
            cells[i] = ""
        cols[f"Speed_J{j}"] = pa.array(cells)
    pacsv.write_csv(pa.table(cols), path, pacsv.WriteOptions(quoting_style="none"))
    return path


def _export(tmp_path, n=400, gap_at=None, gap_s=0.0, empty_rows=()):
    t = 1.7e9 + np.arange(n) / RATE_HZ
    if gap_at is not None:
        t[gap_at:] += gap_s
    speeds = np.tile(np.array([0.5, -0.25, 0.1, 0.0, 1.0, -1.0]), (n, 1))  # constant: q is linear in time
    return _write(tmp_path / "ur3.csv", t, speeds, empty_rows), speeds


def test_empty_joint_cells_are_refused_by_default_naming_the_option(tmp_path):
    path, _ = _export(tmp_path, empty_rows=[50])
    with pytest.raises(LogError, match=r"line 52 column 'Speed_J0': not a number: ''.*--bad-rows"):
        read_log(path, columns="qd=Speed_J*", derive="q")


def test_skip_drops_records_with_empty_cells_counts_and_names_their_lines(tmp_path):
    path, _ = _export(tmp_path, empty_rows=[50, 51, 52, 200, 201, 202, 203, 204, 205])
    with pytest.warns(RuntimeWarning, match=r"9 record\(s\) .* skipped \(lines 52, 53, 54, 202, 203, \.\.\.\)"):
        log = read_log(path, columns="qd=Speed_J*", derive="q", bad_rows="skip")
    assert len(log) == 400 - 9 and log.rows_skipped == 9 and log.rows_filled == 0
    assert not np.isin(np.round(log.t_s * RATE_HZ), [50, 51, 52, 200, 205]).any()


def test_fill_holds_the_last_good_value_over_short_runs_and_skips_long_ones(tmp_path):
    long_run = list(range(200, 200 + FILL_MAX_ROWS + 1))
    path, speeds = _export(tmp_path, empty_rows=[50, 51, *long_run])
    with pytest.warns(RuntimeWarning, match=r"2 record\(s\) .* filled from the last good record \(lines 52, 53\)"):
        log = read_log(path, columns="qd=Speed_J*", derive="q", bad_rows="fill")
    assert log.rows_filled == 2 and log.rows_skipped == len(long_run) and len(log) == 400 - len(long_run)
    np.testing.assert_array_equal(log.qd_rad_s[50:52], speeds[49:51])  # held from record 49
    assert np.round(log.t_s[50] * RATE_HZ) == 50


def test_a_fill_cannot_start_the_log_with_nothing_to_hold(tmp_path):
    path, _ = _export(tmp_path, empty_rows=[0])
    with pytest.warns(RuntimeWarning, match=r"1 record\(s\) .* skipped \(lines 2\)"):
        log = read_log(path, columns="qd=Speed_J*", derive="q", bad_rows="fill")
    assert len(log) == 399 and log.rows_filled == 0


def test_derive_q_across_a_multi_hour_gap_has_no_jump_and_warns_naming_the_gap(tmp_path):
    path, speeds = _export(tmp_path, gap_at=250, gap_s=5.2 * 3600)
    gap = r"1 gap\(s\) .*line 252 at t = 18722\.000 s after 5\.2 h.*derived q restarts"
    with pytest.warns(RuntimeWarning, match=gap):
        log = read_log(path, columns="qd=Speed_J*", derive="q")
    step = np.abs(np.diff(log.q_rad, axis=0)).max(axis=1)
    assert step.max() < 1.01 / RATE_HZ  # the fastest joint, 1 rad/s, one period (stamp rounding); old: 18,720 rad
    assert step[249] == 0.0  # across the gap: held
    np.testing.assert_allclose(log.q_rad[-1], speeds[0] * (399 - 1) / RATE_HZ, rtol=1e-6)  # 398 periods moved
    assert [(round(t, 3), round(g, 1)) for t, g in log.gaps_s] == [(18722.0, 18720.0)]


def test_derive_qd_restarts_at_a_gap(tmp_path):
    n = 300
    t = np.arange(n) / RATE_HZ
    t[150:] += 3600.0
    q = np.tile(np.linspace(0, 1, n)[:, None], (1, 6))
    cols = {"t_s": pa.array(t)} | {f"q{j}": pa.array(q[:, j]) for j in range(6)}
    pacsv.write_csv(pa.table(cols), tmp_path / "q.csv")
    with pytest.warns(RuntimeWarning, match=r"line 152 at t = 3601\.200 s after 1\.0 h.*derived qd restarts"):
        log = read_log(tmp_path / "q.csv", derive="qd")
    assert np.all(log.qd_rad_s[150] == 0.0)
    np.testing.assert_allclose(log.qd_rad_s[151], RATE_HZ / (n - 1))


def test_gap_periods_sets_what_counts_as_a_gap(tmp_path):
    path, _ = _export(tmp_path, gap_at=100, gap_s=8 / RATE_HZ)  # a step of 9 periods
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        log = read_log(path, columns="qd=Speed_J*", derive="q", gap_periods=10)
    assert log.gaps_s == []
    with pytest.raises(ValueError, match="gap_periods must be > 1"):
        ReaderOptions(gap_periods=1)


def test_the_reader_options_carry_bad_rows_and_gap_periods(tmp_path):
    path, _ = _export(tmp_path, empty_rows=[10])
    cfg = ReaderOptions(columns="qd=Speed_J*", derive="q", bad_rows="skip", gap_periods=4)
    assert cfg.reader_options() == {"columns": "qd=Speed_J*", "derive": "q", "bad_rows": "skip", "gap_periods": 4}
    with pytest.warns(RuntimeWarning, match="skipped"):
        assert read_log(path, **cfg.reader_options()).rows_skipped == 1
    with pytest.raises(ValueError, match="bad_rows must be"):
        read_log(path, columns="qd=Speed_J*", derive="q", bad_rows="drop")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.001, 1e4), min_size=2, max_size=40),
       st.lists(st.floats(-3, 3), min_size=41, max_size=41))
def test_integration_never_moves_across_a_gap(steps_s, speeds):
    """Invariant: a derived q changes across a gap by nothing, and within a segment by the trapezoid of qd."""
    t = np.r_[0.0, np.cumsum(steps_s)]
    qd = np.array(speeds[:len(t)])[:, None]
    gaps = find_gaps(t)
    q = integrate_segments(qd, t, gaps)
    dq = np.diff(q[:, 0])
    trapezoid = 0.5 * (qd[1:, 0] + qd[:-1, 0]) * np.diff(t)
    inside = np.setdiff1d(np.arange(1, len(t)), gaps) - 1
    assert np.all(dq[gaps - 1] == 0.0)
    np.testing.assert_allclose(dq[inside], trapezoid[inside], rtol=1e-9, atol=1e-9)


@pytest.mark.slow
def test_an_export_with_empty_cells_and_a_two_hour_gap_replays_in_seconds(tmp_path):
    # a UR3 export end to end, a new user's way: `edgeinfer replay --log export.csv --bad-rows fill`; the 2 h
    # gap must not be waited out in real time, and the empty cells must not stop the reader
    from rich.console import Console

    from edgeinfer.sim.replay import replay
    from edgeinfer.sim.run_config import ReplayConfig

    rate, n = 250.0, 1000
    t = np.arange(n) / rate
    t[500:] += 2 * 3600
    k = np.arange(n)[:, None]
    q = np.array([1.06, -1.0, -1.37, 0.0, 0.58, -0.77]) + 0.2 * np.sin(k / 125 + np.arange(6))
    qd = 0.4 * np.cos(k / 125 + np.arange(6))
    cols = {"t_s": t, **{f"q{j}": q[:, j] for j in range(6)}, **{f"qd{j}": qd[:, j] for j in range(6)}}
    table = pa.table({c: pa.array([None if 100 <= i < 102 and c != "t_s" else float(v) for i, v in enumerate(vals)])
                      for c, vals in cols.items()})
    pacsv.write_csv(table, tmp_path / "export.csv")
    t0 = time.monotonic()
    cfg = ReplayConfig(log=tmp_path / "export.csv", bad_rows="fill", out=tmp_path / "out", plots=False, run_mcap=False,
                       fork_nodes=True)
    report = replay(cfg, Console(quiet=True))
    assert time.monotonic() - t0 < 120  # not two hours
    source = report["replayer"]["log_source"]
    assert (source["rows_filled"], source["gaps_shortened"]["count"]) == (2, 1)
    assert source["gaps_shortened"]["ticks_removed"] * 4e-3 == pytest.approx(7200 - 2.0, abs=0.01)
    assert report["observations_sent"] == n and not report.get("interrupted")
    assert report["safety"]["outside_position_limits"] == 0 and report["safety"]["over_velocity_limit"] == 0


def test_training_windows_never_cross_a_gap():
    # a training target across a 3 h gap is a jump no robot makes (1.59 rad against 0.13 in a real export): such
    # windows are left out, the ones within each segment kept
    from edgeinfer.engines.training.dataset import chunk_windows

    n, horizon, stride = 200, 8, 5
    t_s = np.arange(n) * 0.004
    t_s[100:] += 3 * 3600
    q = np.cumsum(np.full((n, 2), 0.001), axis=0)
    q[100:] += 1.5  # the arm moved while nothing was recorded
    _, offsets_all, t_all = chunk_windows(q, np.zeros_like(q), horizon, stride)
    _, offsets, t = chunk_windows(q, np.zeros_like(q), horizon, stride, t_s)
    span = horizon * stride
    crossing = (t_all - stride < 100) & (t_all + span >= 100)
    assert crossing.sum() == stride + span and np.abs(offsets_all).max() > 1.5  # t in [100 - span, 100 + stride)
    np.testing.assert_array_equal(t, t_all[~crossing])
    assert np.abs(offsets).max() < 0.05  # 40 steps of 1 mrad at most
