"""`edgeinfer bench transport` and its raw pyzmq floors: real processes on loopback sockets; structure, never
timings (the figures are reported by the command, not asserted)."""
import msgspec
import numpy as np
import pytest

from edgeinfer.bench.floors import minimal_decode, minimal_encode, raw_pubsub_round_trip_ns, raw_zmq_round_trip_ns
from edgeinfer.bench.transport_costs import main, payload_bytes, run
from edgeinfer.node.source import ARRIVALS


def test_raw_floors_echo_every_message():
    frames = [b"header", bytes(48), bytes(48), bytes(48)]
    pubsub = raw_pubsub_round_trip_ns(frames, 30, warmup=5)
    reqrep = raw_zmq_round_trip_ns(150, 30, idle_gap_ms=1.0, warmup=5)
    for t in (pubsub, reqrep):
        assert t.shape == (30,) and t.dtype == np.int64 and (t > 0).all()


def test_the_codec_floor_checks_what_it_carries():
    frames = [msgspec.msgpack.encode({"schema": "x", "seq": 1}), np.arange(6.0).tobytes(), np.ones(6).tobytes()]
    header, flat = minimal_decode(frames)
    assert header == {"schema": "x", "seq": 1} and flat.tolist() == [0, 1, 2, 3, 4, 5, 1, 1, 1, 1, 1, 1]
    assert raw_pubsub_round_trip_ns(frames, 20, warmup=5, codec=True).shape == (20,)
    with pytest.raises(ValueError, match="non-finite"):
        minimal_decode([frames[0], np.array([0.0, np.nan]).tobytes()])
    with pytest.raises(ValueError, match="non-finite"):
        minimal_encode(header, np.array([np.inf]))


def test_raw_floor_arguments_are_checked():
    with pytest.raises(ValueError, match="frames"):
        raw_pubsub_round_trip_ns([], 10)
    with pytest.raises(ValueError, match="n >= 1"):
        raw_zmq_round_trip_ns(10, 0)


def test_run_gives_one_consistent_row_per_scenario():
    rows = run(n=30, n_idle=10, idle_gap_ms=2.0, n_periodic=30)
    assert [r["scenario"] for r in rows] == ["back to back", "periodic 250 Hz", "idle 2 ms"]
    for r in rows:
        assert r["ratio_p50"] == pytest.approx(r["edgeinfer_p50_us"] / r["raw_zmq_p50_us"])
        assert r["ratio_p99"] == pytest.approx(r["edgeinfer_p99_us"] / r["raw_zmq_p99_us"])
        assert r["vs_back_to_back_p50"] == pytest.approx(r["edgeinfer_p50_us"] / rows[0]["edgeinfer_p50_us"])
        assert 0 <= r["edgeinfer_lost"] <= 5  # a chunk not back within 2 s is counted, not fatal
        for side in ("edgeinfer", "raw_zmq", "raw_pubsub", "minimal_codec"):
            assert 0 < r[f"{side}_p50_us"] <= r[f"{side}_p99_us"]
        assert set(r["runtime_arrivals"]) <= set(ARRIVALS)  # the runtime's obs_arrival counters over the row
    # the periodic stream (a new Start: served from its seq 0), 50 warm-up round trips and 30 timed, every one
    # decoded unless a host stall let a newer one supersede it
    assert 30 <= sum(rows[1]["runtime_arrivals"].values()) <= 80
    assert payload_bytes() > 144


def test_bad_arguments_are_refused_by_name(capsys, tmp_path):
    for argv in (["--n", "3"], ["--idle-gap-ms", "nan"], ["--idle-gap-ms", "inf"], ["--n-periodic", "9"],
                 ["--rate-hz", "0"], ["--rate-hz", "nan"]):
        with pytest.raises(SystemExit):
            main(argv)
        err = capsys.readouterr().err
        assert f"{argv[0]} must be" in err and err.count("must be") == 1, err  # the one bad option, by name
    with pytest.raises(ValueError, match=f"--json {tmp_path}: cannot be written"):  # before the run, not after
        main(["--json", str(tmp_path)])
