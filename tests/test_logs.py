"""Arm log reader, split, synthetic default, and writer round trip."""
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.logs.arm_log import (
    HELD_OUT,
    TRAIN,
    ArmLog,
    LogError,
    list_schunk_runs,
    read_schunk,
    split_of,
    synthetic_log,
    write_schunk,
)


@pytest.fixture(scope="module")
def data_root(schunk_dir) -> Path:
    return schunk_dir


def test_measurement_1(data_root):
    log = read_schunk(data_root / "measurement_1")
    assert len(log) == 937 and log.n_joints == 6
    assert log.rate_hz == pytest.approx(250.0) and log.period_ns == 4_000_000
    assert log.t_s[0] == 0.0 and np.all(np.diff(log.t_s) > 0)
    assert log.q_rad[0, 0] == 1.0572
    np.testing.assert_array_equal(log.q_rad[0], [1.0572, -1.0014, -1.368, 0.0029322, 0.57893, -0.76845])
    assert log.qd_rad_s[0, 0] == 0.030425
    assert log.truncated_at_row is None and log.name == "measurement_1"


def test_split_matches_dataset(data_root):
    runs = list_schunk_runs(data_root)
    assert len(runs) == 80 and list(runs) == sorted(runs)
    held = [n for n in runs if split_of(n) == "held_out"]
    train = [n for n in runs if split_of(n) == "train"]
    assert len(held) == 20 and len(train) == 60
    assert set(held) == set(HELD_OUT) and set(train) == set(TRAIN)
    assert split_of(1) == "held_out" and split_of(2) == "train"


def test_split_rejects_missing_runs():
    for n in (0, 5, 100):
        with pytest.raises(ValueError):
            split_of(n)


def _corrupt_line(path: Path, line: int, text: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    lines[line - 1] = text + "\n"
    path.write_text("".join(lines))


@pytest.mark.parametrize("kind", ["nan", "missing_column", "garbage"])
def test_corrupt_row_raises_and_truncates(tmp_path, kind):
    log = synthetic_log(seconds=1.0, seed=3)
    run = write_schunk(log, tmp_path / "run")
    traj = run / "trajectory.csv"
    row50 = traj.read_text().splitlines()[49].split(",")
    if kind == "nan":
        row50[3] = "nan"
    elif kind == "missing_column":
        row50 = row50[:-1]
    else:
        row50[0] = "1.0x"
    _corrupt_line(traj, 50, ",".join(row50))

    with pytest.raises(LogError) as err:
        read_schunk(run)
    assert "trajectory.csv" in str(err.value) and "line 50" in str(err.value)

    cut = read_schunk(run, on_error="truncate")
    assert len(cut) == 49 and cut.truncated_at_row == 50
    np.testing.assert_array_equal(cut.q_rad, log.q_rad[:49])
    np.testing.assert_array_equal(cut.qd_rad_s, log.qd_rad_s[:49])
    np.testing.assert_array_equal(cut.t_s, log.t_s[:49])


def test_non_increasing_time(tmp_path):
    run = write_schunk(synthetic_log(seconds=1.0), tmp_path / "run")
    _corrupt_line(run / "time.csv", 20, "0.0")
    with pytest.raises(LogError, match=r"time\.csv line 20"):
        read_schunk(run)
    assert len(read_schunk(run, on_error="truncate")) == 19


def test_length_mismatch_and_missing_file(tmp_path):
    run = write_schunk(synthetic_log(seconds=1.0), tmp_path / "run")
    lines = (run / "time.csv").read_text().splitlines(keepends=True)
    (run / "time.csv").write_text("".join(lines[:100]))
    with pytest.raises(LogError, match="length mismatch"):
        read_schunk(run)
    assert len(read_schunk(run, on_error="truncate")) == 100
    (run / "trajectory.csv").unlink()
    with pytest.raises(LogError, match="trajectory.csv: missing file"):
        read_schunk(run)
    with pytest.raises(ValueError):
        read_schunk(run, on_error="ignore")


def test_synthetic_is_deterministic():
    a, b, c = synthetic_log(seed=7), synthetic_log(seed=7), synthetic_log(seed=8)
    np.testing.assert_array_equal(a.q_rad, b.q_rad)
    np.testing.assert_array_equal(a.qd_rad_s, b.qd_rad_s)
    assert not np.array_equal(a.q_rad, c.q_rad)
    assert a.name == "synthetic-minjerk-seed7"


@pytest.mark.parametrize("seed", range(5))
def test_synthetic_is_smooth_and_plausible(seed):
    log = synthetic_log(seconds=6.0, seed=seed)
    assert len(log) == 1500 and log.n_joints == 6 and log.period_ns == 4_000_000
    assert np.abs(log.qd_rad_s).max() < 1.2
    q0 = np.array([1.06, -1.0, -1.37, 0.0, 0.58, -0.77])
    np.testing.assert_array_equal(log.q_rad[0], q0)
    assert np.abs(log.q_rad - q0).max() <= 0.6
    # q must be the integral of qd (trapezoid at 250 Hz is accurate to well under a milliradian here).
    dt = np.diff(log.t_s)[:, None]
    integral = log.q_rad[0] + np.vstack([np.zeros((1, 6)),
                                         np.cumsum(0.5 * (log.qd_rad_s[1:] + log.qd_rad_s[:-1]) * dt, axis=0)])
    np.testing.assert_allclose(integral, log.q_rad, atol=1e-4)
    # Smooth: no velocity jumps between samples (min-jerk acceleration stays a few rad/s^2).
    assert np.abs(np.diff(log.qd_rad_s, axis=0) / dt).max() < 10.0


def test_round_trip(tmp_path):
    log = synthetic_log(seconds=2.0, seed=1)
    run = write_schunk(log, tmp_path / "synthetic")
    assert len((run / "input.csv").read_text().splitlines()) == len(log) - 1
    back = read_schunk(run)
    assert isinstance(back, ArmLog) and back.name == "synthetic"
    np.testing.assert_array_equal(back.t_s, log.t_s)
    np.testing.assert_array_equal(back.q_rad, log.q_rad)
    np.testing.assert_array_equal(back.qd_rad_s, log.qd_rad_s)
