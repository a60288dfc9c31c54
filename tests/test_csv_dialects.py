"""CSV logs in the dialects real exports use, written by pyarrow's own CSV writer from the real Schunk
measurement_1: an industrial arm's export (';' separator, decimal commas, ISO-8601 times, CRLF, a trailing run of
empty columns, spaces in header names) and a fixed-rate log with no time column among unrelated columns. Each
gives the same Observation stream as the Schunk layout; gaps keep their ticks and are reported; errors name file,
line and column."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from edgeinfer.logs import read_log
from edgeinfer.logs.arm_log import ArmLog, LogError, read_schunk, write_schunk
from edgeinfer.logs.csv_log import parse_columns, read_text
from edgeinfer.logs.samples import backward_differences
from edgeinfer.sim.pacing import replayer_section
from edgeinfer.sim.run_config import LogSourceConfig
from edgeinfer.sim.schedule import gap_report, observation_stream, tick_grid

START = np.datetime64("2022-10-26T08:17:21.847", "ns")  # UTC, the export's first record
INDUSTRIAL = "q=Joint * Position,qd=Joint * Speed"  # the time column "Timestamp" is found by its name


@pytest.fixture(scope="module")
def real(schunk_dir) -> ArmLog:
    return read_schunk(schunk_dir / "measurement_1")


def _comma(x: np.ndarray) -> pa.Array:
    return pa.array([repr(v).replace(".", ",") for v in x.tolist()])  # repr: the float64 back, exactly


def _iso(t_s: np.ndarray, zone: str) -> pa.Array:
    """ISO-8601 times of START + t_s. zone "Z": UTC; "+02/+01": local time whose offset changes mid-log (a
    daylight-saving change); "": no zone (as written); "arrow": pyarrow's own timestamp column."""
    utc = START + np.round(t_s * 1e9).astype("timedelta64[ns]")
    if zone == "arrow":
        return pa.array(utc).cast(pa.timestamp("ns", tz="UTC"))
    if zone == "+02/+01":
        hours = np.where(np.arange(len(t_s)) < len(t_s) // 2, 2, 1)
        local = utc + hours.astype("timedelta64[h]")
        return pa.array([f"{s}+0{h}:00" for s, h in zip(np.datetime_as_string(local, unit="ms"), hours)])
    return pa.array([s + zone for s in np.datetime_as_string(utc, unit="ms")])


def write_industrial(log: ArmLog, path, zone: str = "Z", positions: bool = True):
    """';' separated, decimal commas, ISO times, CRLF, three unnamed empty columns at the end; joint speeds, and
    joint positions unless positions=False."""
    cols = {"Timestamp": _iso(log.t_s, zone)}
    if positions:
        cols |= {f"Joint {j + 1} Position": _comma(log.q_rad[:, j]) for j in range(log.n_joints)}
    cols |= {f"Joint {j + 1} Speed": _comma(log.qd_rad_s[:, j]) for j in range(log.n_joints)}
    table = pa.table([*cols.values(), *[pa.nulls(len(log))] * 3], names=[*cols, "", "", ""])
    pacsv.write_csv(table, path, pacsv.WriteOptions(delimiter=";", quoting_style="none", quoting_header="none",
                                                    eol="\r\n"))
    return path


def write_fixed_rate(log: ArmLog, path, velocities: bool = True):
    """',' separated, no time column: joint_1.. positions and joint_vel_1.. velocities among 40 other columns."""
    n = len(log)
    cols = {f"cmd_{k}": pa.array(np.full(n, 0.5 * k)) for k in range(30)}
    cols |= {f"joint_{j + 1}": pa.array(log.q_rad[:, j]) for j in range(log.n_joints)}
    cols |= {"status": pa.array(["ok, running"] * n), "mode": pa.array(np.arange(n) % 3)}
    if velocities:
        cols |= {f"joint_vel_{j + 1}": pa.array(log.qd_rad_s[:, j]) for j in range(log.n_joints)}
    cols |= {f"ee_{k}": pa.array(np.zeros(n)) for k in range(8)}
    pacsv.write_csv(pa.table(cols), path)
    return path


def dialect(path, columns: str, **options) -> tuple[str, str]:
    """(separator, decimal mark) the reader detects for `path` read through `columns` and `options`."""
    text = read_text(path, parse_columns(columns), **options)
    return text.separator, text.decimal


def assert_same_stream(log: ArmLog, ref: ArmLog, stride: int = 5) -> None:
    got, want = observation_stream(log, stride), observation_stream(ref, stride)
    assert log.period_ns == ref.period_ns and len(got) == len(want) == len(ref)
    assert [(o.seq, o.t_ns) for o in got] == [(o.seq, o.t_ns) for o in want]
    for name in ("q_rad", "qd_rad_s", "q_prev_rad"):
        np.testing.assert_array_equal(np.stack([getattr(o, name) for o in got]),
                                      np.stack([getattr(o, name) for o in want]), err_msg=name)


# --- the two dialects give the Schunk stream --------------------------------------------------------------


@pytest.mark.parametrize("zone", ["Z", "+02/+01", "", "arrow"])
def test_industrial_export_matches_schunk(real, tmp_path, zone):
    path = write_industrial(real, tmp_path / "arm.csv", zone)
    assert dialect(path, INDUSTRIAL) == (";", ",")
    log = read_log(path, columns=INDUSTRIAL)
    assert log.source == "csv" and not log.qd_from_differences and not log.q_from_integration
    np.testing.assert_allclose(log.t_s, real.t_s, rtol=0, atol=1e-12)  # the zone change is no jump
    assert_same_stream(log, real)


def test_fixed_rate_log_without_time_column_matches_schunk(real, tmp_path):
    path = write_fixed_rate(real, tmp_path / "arm7.csv")
    assert dialect(path, "q=joint_?,qd=joint_vel_?", rate_hz=250.0) == (",", ".")
    with pytest.raises(LogError, match=r"arm7\.csv line 1: no time column .*rate_hz"):
        read_log(path, columns="q=joint_?,qd=joint_vel_?")
    log = read_log(path, columns="q=joint_?,qd=joint_vel_?", rate_hz=250.0)
    assert_same_stream(log, real)
    stamped = write_industrial(real, tmp_path / "stamped.csv")
    with pytest.raises(LogError, match=r"stamped\.csv line 1: rate_hz is set but the log has a time column"):
        read_log(stamped, columns=INDUSTRIAL, rate_hz=250.0)  # its stamps (gaps, jitter) would be lost


# --- a missing field: refused by name, or derived when asked -----------------------------------------------


def test_speeds_only_refused_unless_positions_are_integrated(real, tmp_path):
    path = write_industrial(real, tmp_path / "speeds.csv", positions=False)
    with pytest.raises(LogError, match=r"speeds\.csv line 1: no joint position column matches q='Joint \* Position'"
                                       r".*--derive q"):
        read_log(path, columns=INDUSTRIAL)
    log = read_log(path, columns=INDUSTRIAL, derive="q")
    assert log.q_from_integration and not log.qd_from_differences
    np.testing.assert_array_equal(log.qd_rad_s, real.qd_rad_s)
    # trapezoidal integral from 0 rad: its step k -> k+1 is dt * (qd_k + qd_k+1) / 2
    np.testing.assert_allclose(np.diff(log.q_rad, axis=0),
                               0.004 * (real.qd_rad_s[1:] + real.qd_rad_s[:-1]) / 2, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(log.q_rad[0], np.zeros(6))
    # the arm's recorded speeds integrate to its recorded motion within 1 mrad over 3.7 s (0.22 measured)
    assert np.abs(log.q_rad - (real.q_rad - real.q_rad[0])).max() < 1e-3


def test_positions_only_refused_unless_velocities_are_differenced(real, tmp_path):
    path = write_fixed_rate(real, tmp_path / "pos.csv", velocities=False)
    with pytest.raises(LogError, match=r"no joint velocity column matches qd='joint_vel_\?'.*--derive qd"):
        read_log(path, columns="q=joint_?,qd=joint_vel_?", rate_hz=250.0)
    log = read_log(path, columns="q=joint_?,qd=joint_vel_?", rate_hz=250.0, derive="qd")
    assert log.qd_from_differences
    np.testing.assert_array_equal(log.q_rad, real.q_rad)
    np.testing.assert_allclose(log.qd_rad_s, backward_differences(real.q_rad, real.t_s), rtol=0, atol=1e-9)
    full = write_fixed_rate(real, tmp_path / "full.csv")
    with pytest.raises(LogError, match=r"full\.csv line 1: derive='qd' fills a missing field, but columns "
                                       r"\['joint_vel_1', .*match qd='joint_vel_\?'"):
        read_log(full, columns="q=joint_?,qd=joint_vel_?", rate_hz=250.0, derive="qd")


# --- gaps: their ticks stay empty, later rows keep theirs, the report counts them -------------------------


def test_gap_keeps_later_ticks_and_is_reported(real, tmp_path):
    keep = np.ones(len(real), dtype=bool)
    keep[300:310] = False  # a gap: 10 samples missing, a step of 11 periods
    keep[600] = False  # one dropped sample: a step of 2, not a gap
    part = ArmLog("part", real.t_s[keep], real.q_rad[keep], real.qd_rad_s[keep])
    log = read_log(write_industrial(part, tmp_path / "gap.csv"), columns=INDUSTRIAL)
    ref = read_schunk(write_schunk(part, tmp_path / "schunk_gap"))
    assert_same_stream(log, ref)
    ticks = tick_grid(log)
    np.testing.assert_array_equal(ticks, tick_grid(real)[keep])  # nothing after the gap moved
    gaps = gap_report(ticks, log.period_ns)
    assert gaps == {"count": 1, "empty_ticks": 10, "longest_s": pytest.approx(0.044), "rows": [300],
                    "min_periods": 3}
    section = replayer_section(SimpleNamespace(pacing={}, faults=None, tick=ticks + 50), log)  # after a pre-roll
    assert section["log_source"]["gaps"] == gaps


def test_one_record_per_second_with_gaps_of_seconds(tmp_path):
    """The industrial export's timing: one record a second, ms jitter, gaps of several seconds, speeds only."""
    t_s = np.array([0, 1, 2, 3, 7, 8, 9, 10, 16, 17], dtype=float) + np.array([0, 2, -1, 1, 0, 3, -2, 1, 0, -1]) * 1e-3
    qd = np.outer(np.linspace(-0.2, 0.2, len(t_s)), np.ones(2))
    log = read_log(write_industrial(ArmLog("s", t_s, np.zeros_like(qd), qd), tmp_path / "arm.csv", positions=False),
                   columns=INDUSTRIAL, derive="q")
    np.testing.assert_allclose(log.t_s, t_s, rtol=0, atol=1e-9)
    assert log.period_ns == pytest.approx(1e9, rel=1e-3)
    ticks = tick_grid(log)
    np.testing.assert_array_equal(ticks, [0, 1, 2, 3, 7, 8, 9, 10, 16, 17])
    assert gap_report(ticks, log.period_ns) == {"count": 2, "empty_ticks": 8, "longest_s": pytest.approx(6.0, 1e-3),
                                                "rows": [4, 8], "min_periods": 3}


# --- errors name file, line and column; truncating keeps the lines before ----------------------------------


@pytest.mark.parametrize("row, edit, match", [
    (400, lambda f: f.__setitem__(9, "0,1x"), r"line 401 column 'Joint 3 Speed': not a number: '0,1x'"),
    (400, lambda f: f.__setitem__(2, "nan"), r"line 401 column 'Joint 2 Position': non-finite joint position: 'nan'"),
    (400, lambda f: f.__setitem__(0, "26.10.2022 08:17"), r"line 401 column 'Timestamp': not an ISO-8601 time"),
    (400, lambda f: f.__setitem__(4, "1.234,5"), r"line 401 column 'Joint 4 Position': not a number: '1.234,5'"),
    (400, lambda f: f.pop(), r"line 401: expected 16 fields, got 15"),
])
def test_errors_name_file_line_and_column(real, tmp_path, row, edit, match):
    path = write_industrial(real, tmp_path / "arm.csv")
    lines = path.read_bytes().decode().split("\r\n")
    fields = lines[row].split(";")
    edit(fields)
    lines[row] = ";".join(fields)
    lines.insert(200, "")  # a blank line: no record, but a line (the bad one is now line 402)
    path.write_bytes("\r\n".join(lines).encode())
    with pytest.raises(LogError, match=f"{path} " + match.replace("line 401", "line 402")):
        read_log(path, columns=INDUSTRIAL)
    log = read_log(path, columns=INDUSTRIAL, on_error="truncate")
    assert log.truncated_at_row == 402 and len(log) == 399
    np.testing.assert_array_equal(log.q_rad, real.q_rad[:399])


def test_wrong_decimal_mark_says_which_option(real, tmp_path):
    path = write_industrial(ArmLog("s", real.t_s[:20], real.q_rad[:20], real.qd_rad_s[:20]), tmp_path / "a.csv")
    with pytest.raises(LogError, match=r"line 2 column 'Joint 1 Position': not a number \(decimal mark '\.': set "
                                       r"csv_decimal=','\): '1,0572'"):
        read_log(path, columns=INDUSTRIAL, csv_decimal=".")
    with pytest.raises(LogError, match="line 1: no time column"):  # the wrong separator: one column
        read_log(path, columns=INDUSTRIAL, csv_separator="tab")


def test_options_are_checked_and_reach_the_reader(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("q1,qd1\n0.1,0.0\n0.2,0.0\n")
    for bad, match in [({"csv_separator": ";;"}, "csv_separator"), ({"csv_decimal": ";"}, "csv_decimal"),
                       ({"rate_hz": -1.0}, "rate_hz"), ({"rate_hz": 10.0, "columns": "t=q1"}, "not both"),
                       ({"derive": "x"}, "derive")]:
        with pytest.raises(ValueError, match=match):
            read_log(path, **bad)
    cfg = LogSourceConfig(log=path, rate_hz=10.0, csv_decimal=".", derive=None)
    assert cfg.reader_options() == {"rate_hz": 10.0, "csv_decimal": "."}
    assert read_log(path, **cfg.reader_options()).t_s.tolist() == [0.0, 0.1]
    with pytest.raises(ValueError, match="rate_hz must be > 0"):
        LogSourceConfig(rate_hz=0.0)
