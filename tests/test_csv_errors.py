"""CSV logs wrong in the ways real exports are: times out of range or in another unit than read, text that is not
UTF-8, a decimal mark that only an unread column holds, joint values no joint has, column patterns that overlap,
ISO-8601 times with a decimal comma or with a t_unit. Files are written with pyarrow's CSV writer, or as bytes
where the bytes are the point. Each error names the file, the line and the column, and what to set."""
from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from edgeinfer.logs import read_log
from edgeinfer.logs.arm_log import ArmLog, LogError
from edgeinfer.logs.samples import Records
from edgeinfer.sim.run_config import LogSourceConfig

N = 40
T_S = np.arange(N) * 0.004  # 250 Hz
Q = np.linspace(-0.5, 0.5, N)
STAMP_NS = 1_666_772_241_847_000_000  # 2022-10-26T08:17:21.847Z
RANGE_S = re.escape("beyond ±4e+09 s, the range of a numeric time (±4e18 ns: epoch stamps 1843..2096)")


def write(path, columns: dict, delimiter: str = ","):
    pacsv.write_csv(pa.table(columns), path, pacsv.WriteOptions(delimiter=delimiter))
    return path


def log_csv(path, t, q=Q, qd=None, **more):
    """Columns t, q1, qd1 (and `more`), N records."""
    return write(path, {"t": t, "q1": q, "qd1": np.zeros(N) if qd is None else qd, **more})


def _comma(values) -> pa.Array:
    return pa.array([repr(v).replace(".", ",") for v in np.asarray(values).tolist()])


def with_row(values, row: int, value):
    out = list(values)
    out[row] = value
    return pa.array(out)


# --- 1, 2: times out of range, or in another unit than read ---------------------------------------------------


@pytest.mark.parametrize("t, columns, match", [
    (with_row(T_S, 3, 1e12), None, rf"line 5 column 't': time '1e\+12' {RANGE_S}; is the column in ms\? set t_unit=ms"),
    (with_row(T_S, 3, 1e300), None, rf"line 5 column 't': time '1e\+300' {RANGE_S}$"),
    (with_row(T_S, 3, np.inf), None, r"line 5 column 't': non-finite time: 'inf'"),
    # an integer ms column whose ns overflow an int64
    (with_row(1_666_772_241_847 + 4 * np.arange(N), 3, 10**16), "t_unit=ms",
     r"line 5 column 't': time '10000000000000000' beyond ±4e\+12 ms, .*; is the column in ns\? set t_unit=ns"),
    # epoch ns read as seconds
    (pa.array(STAMP_NS + 4_000_000 * np.arange(N)), None,
     rf"line 2 column 't': time '{STAMP_NS}' {RANGE_S}; is the column in ns\? set t_unit=ns"),
])
def test_time_out_of_range_names_line_column_value_and_range(tmp_path, t, columns, match):
    path = log_csv(tmp_path / "a.csv", t)
    with pytest.raises(LogError, match=f"^{re.escape(str(path))} {match}"):
        read_log(path, columns=columns)
    if not match.startswith("line 2"):
        log = read_log(path, columns=columns, on_error="truncate")
        assert log.truncated_at_row == 5 and len(log) == 3


def test_epoch_ns_stamps_read_with_their_unit(tmp_path):
    path = log_csv(tmp_path / "a.csv", pa.array(STAMP_NS + 4_000_000 * np.arange(N)))
    log = read_log(path, columns="t_unit=ns")
    assert log.period_ns == 4_000_000 and log.t_s[-1] == pytest.approx((N - 1) * 0.004, abs=1e-12)


@pytest.mark.parametrize("step, unit", [(4_000_000, "ns"), (4_000, "us")])
def test_a_median_step_no_joint_log_has_suggests_t_unit(tmp_path, step, unit):
    """Stamps from the log's start in ns read as seconds: one record per 46 days; in us: one per 67 minutes."""
    path = log_csv(tmp_path / "a.csv", pa.array(step * np.arange(N)))
    for on_error in ("raise", "truncate"):  # the unit is wrong for every record: nothing to keep
        with pytest.raises(LogError, match=re.escape(
                f"a.csv column 't': median step {step:g} s between records, a rate of {1 / step:.3g} Hz, outside the "
                f"0.01 Hz..100 kHz of a joint log; is it in {unit}? set t_unit={unit} in the column map (--columns)")):
            read_log(path, on_error=on_error)
    assert read_log(path, columns=f"t_unit={unit}").period_ns == 4_000_000


def test_period_fit_survives_huge_times():
    """np.polyfit gave a period of 0 (and rate_hz a ZeroDivisionError) once the step count's square overflows."""
    t = np.array([0.0, 1.0, 2.0, 3.0, 1e200])
    log = ArmLog("huge", t, np.zeros((5, 1)), np.zeros((5, 1)))
    assert log.period_ns == 1_000_000_000 and log.rate_hz == pytest.approx(1.0)


# --- 3: text that is not UTF-8 ----------------------------------------------------------------------------------


def test_latin1_header_names_byte_and_line_and_the_encoding_option(tmp_path):
    header = "Zeit;Gelenk 1 Position (°);Gelenk 1 Geschwindigkeit (°/s);Zustand\n"
    rows = "".join(f"{t!r};{q!r};0;grün\n".replace(".", ",") for t, q in zip(T_S.tolist(), Q.tolist()))
    path = tmp_path / "export.csv"
    path.write_bytes((header + rows).encode("latin-1"))
    at = header.encode("latin-1").index(b"\xb0")
    columns = "t=Zeit,q=Gelenk * Position*,qd=Gelenk * Geschwindigkeit*"
    with pytest.raises(LogError, match=re.escape(f"{path} byte {at} (line 1): not utf-8 text (invalid start byte: "
                                                 "b'\\xb0'); set csv_encoding (--csv-encoding)")):
        read_log(path, columns=columns)
    cfg = LogSourceConfig(log=path, columns=columns, csv_encoding="latin-1")
    assert cfg.reader_options() == {"columns": columns, "csv_encoding": "latin-1"}
    log = read_log(path, **cfg.reader_options())
    np.testing.assert_array_equal(log.q_rad[:, 0], Q)
    np.testing.assert_allclose(log.t_s, T_S, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="csv_encoding 'latin-9x' is not a text encoding"):
        read_log(path, columns=columns, csv_encoding="latin-9x")


def test_latin1_body_line_is_named(tmp_path):
    lines = ["t,q1,qd1"] + [f"{t!r},{q!r},0" for t, q in zip(T_S.tolist(), Q.tolist())]
    lines[7] = lines[7][:-1] + "0\xb0"  # a degree sign after a velocity on line 8
    path = tmp_path / "a.csv"
    path.write_bytes("\n".join(lines).encode("latin-1"))
    at = len("\n".join(lines[:8]).encode("latin-1")) - 1
    with pytest.raises(LogError, match=re.escape(f"{path} byte {at} (line 8): not utf-8 text")):
        read_log(path)


def test_random_bytes_are_refused_in_one_error_and_nothing_else_is_printed(tmp_path):
    """pyarrow hands rows it cannot decode to the row handler and prints "Exception ignored" for them: the reader
    checks the encoding of pyarrow's first block before it reads the header (in a process of its own: pytest would
    catch the unraisable exception as a warning)."""
    import subprocess
    import sys

    path = tmp_path / "noise.csv"
    path.write_bytes(np.random.default_rng(1).integers(0, 256, 3000, dtype=np.uint8).tobytes())
    with pytest.raises(LogError, match=re.escape(f"{path} byte ") + r"\d+ \(line \d+\): not utf-8 text"):
        read_log(path)
    script = (f"from edgeinfer.logs import read_log\ntry:\n    read_log({str(path)!r})\n"
              "except Exception as e:\n    print(type(e).__name__)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (out.stdout, out.stderr) == ("LogError\n", "")


# --- 4: the decimal mark comes from the columns read ------------------------------------------------------------


def test_decimal_mark_is_sniffed_from_the_columns_read(tmp_path):
    """A decimal-point log whose firmware column reads 2,1 is not a decimal-comma log."""
    path = write(tmp_path / "a.csv", {"t": T_S, "q1": Q, "qd1": np.zeros(N), "firmware": pa.array(["2,1"] * N)},
                 delimiter=";")
    np.testing.assert_array_equal(read_log(path).q_rad[:, 0], Q)
    # quoted decimal commas in a ',' separated file (pyarrow quotes a field holding the separator)
    quoted = write(tmp_path / "b.csv", {"t": _comma(T_S), "q1": _comma(Q), "qd1": np.zeros(N)})
    np.testing.assert_array_equal(read_log(quoted, columns="q=q1,qd=qd1").q_rad[:, 0], Q)


def test_two_decimal_marks_in_the_columns_read_are_refused_with_the_option(tmp_path):
    qd = Q / 4  # -0.125: a decimal point from line 2
    q = pa.concat_arrays([pa.array(["0"] * 5), _comma(Q[5:])])  # a decimal comma from line 7
    path = write(tmp_path / "a.csv", {"t": pa.array(np.arange(N)), "q1": q, "qd1": qd}, delimiter=";")
    with pytest.raises(LogError, match=re.escape(
            f"{path}: decimal mark unclear: line 7 column 'q1' reads {q[5].as_py()!r} (a decimal comma), line 2 "
            "column 'qd1' reads '-0.125' (a decimal point); set csv_decimal (--csv-decimal)")):
        read_log(path)
    with pytest.raises(LogError, match=r"line 2 column 'qd1': not a number: '-0\.125'"):
        read_log(path, csv_decimal=",")


# --- 5: joint values no joint has --------------------------------------------------------------------------------


@pytest.mark.parametrize("q, qd, match", [
    (with_row(Q, 2, 1e300), None, r"line 4 column 'q1': joint position beyond ±1e\+05 rad, the bound of a plausible "
                                  r"one \(a corrupt record or a unit error\?\): '1e\+300'"),
    (Q, with_row(np.zeros(N), 2, -2e5), r"line 4 column 'qd1': joint velocity beyond ±1e\+05 rad/s, .*: '-200000'"),
    (with_row(Q, 2, np.nan), None, r"line 4 column 'q1': non-finite joint position: 'nan'"),
])
def test_joint_values_beyond_the_plausible_bound_are_refused(tmp_path, q, qd, match):
    path = log_csv(tmp_path / "a.csv", T_S, q, qd)
    with pytest.raises(LogError, match=match):
        read_log(path)
    log = read_log(path, on_error="truncate")
    assert log.truncated_at_row == 4 and len(log) == 2


def test_every_reader_refuses_them_through_records():
    rec = Records("x.mcap topic /joint_states", unit="message")
    rec.add(0, [0.1, 0.2], [0.0, 0.0])
    with pytest.raises(LogError, match=re.escape("x.mcap topic /joint_states message 1: joint position beyond ±1e+05 "
                                                 "rad, the bound of a plausible one (a corrupt record or a unit "
                                                 "error?): 1e+300 (joint 1, from 0)")):
        rec.add(4_000_000, [0.1, 1e300], [0.0, 0.0])
    truncating = Records("x.mcap", "truncate", unit="message")
    assert truncating.add(0, [0.1], [0.0]) and not truncating.add(1, [0.1], [np.nan])
    assert truncating.bad_record == 1 and "non-finite joint velocity: nan" in truncating.error


# --- 6: a column two fields match -------------------------------------------------------------------------------


@pytest.mark.parametrize("columns, match", [
    ("t=stamp,q=joint_*,qd=joint_vel_*", r"columns \['joint_vel_1', 'joint_vel_2'\] match both q='joint_\*' and "
                                          r"qd='joint_vel_\*'"),
    ("t=joint_1,q=joint_?,qd=joint_vel_*", r"columns \['joint_1'\] match both t='joint_1' and q='joint_\?'"),
])
def test_a_column_two_fields_match_names_both(tmp_path, columns, match):
    path = write(tmp_path / "a.csv", {"stamp": T_S, "joint_1": Q, "joint_2": Q, "joint_vel_1": np.zeros(N),
                                      "joint_vel_2": np.zeros(N)})
    with pytest.raises(LogError, match=re.escape(f"{path} line 1: ") + match):
        read_log(path, columns=columns)
    assert read_log(path, columns="t=stamp,q=joint_?,qd=joint_vel_*").n_joints == 2


# --- 7, 8: ISO-8601 times with a decimal comma, or with a t_unit -------------------------------------------------


def _iso(sep: str) -> pa.Array:
    stamps = np.datetime64(STAMP_NS, "ns") + np.round(T_S * 1e9).astype("timedelta64[ns]")
    return pa.array([s.replace(".", sep) + "Z" for s in np.datetime_as_string(stamps, unit="ms")])


@pytest.mark.parametrize("delimiter", [";", ","])
def test_iso_times_with_a_decimal_comma(tmp_path, delimiter):
    assert _iso(",")[1].as_py() == "2022-10-26T08:17:21,851Z"
    path = write(tmp_path / "a.csv", {"Timestamp": _iso(","), "q1": Q, "qd1": np.zeros(N)}, delimiter)
    np.testing.assert_allclose(read_log(path).t_s, T_S, rtol=0, atol=1e-12)


def test_t_unit_with_iso_times_is_refused(tmp_path):
    path = write(tmp_path / "a.csv", {"Timestamp": _iso("."), "q1": Q, "qd1": np.zeros(N)})
    for on_error in ("raise", "truncate"):
        with pytest.raises(LogError, match=re.escape(
                f"{path} line 2 column 'Timestamp': t_unit='ms' is set, but the times are ISO-8601 "
                "('2022-10-26T08:17:21.847Z'); t_unit applies to numeric times only")):
            read_log(path, columns="t_unit=ms", on_error=on_error)
