"""`edgeinfer bench fleet` (edgeinfer/bench/fleet_capacity.py): the robot-count ladder and its headline on synthetic
points, option validation, an interrupted run keeping its points, and one tiny real run through the fleet replay."""
from __future__ import annotations

import json

import pytest

from edgeinfer.bench.fleet_capacity import CONFIGURATIONS, FleetBenchConfig, run_fleet
from edgeinfer.bench.fleet_ladder import breaks, headline, next_robots, passes, ratio


def _point(n: int, served: int | None = None, att: float | None = 1.0, miss: float | None = 0.0) -> dict:
    return {"robots_requested": n, "robots_admitted": n if served is None else served, "attainment_worst": att,
            "control_miss_worst": miss}


def _ladder(outcome, max_robots: int = 64) -> list[dict]:
    """Drive next_robots with outcome(n) -> point until it says done; the points, in order."""
    points: list[dict] = []
    while (n := next_robots(points, max_robots)) is not None:
        points.append(outcome(n))
    return points


def test_the_bar_is_per_served_robot_and_inclusive():
    assert passes(_point(4, att=0.999, miss=0.001))
    assert not passes(_point(4, att=0.9989, miss=0.0))
    assert not passes(_point(4, att=1.0, miss=0.0011))
    assert not passes(_point(4, served=0, att=None, miss=None))  # nobody served: not a pass
    assert not passes(_point(4, att=None, miss=0.0))  # served robots without a chunk
    assert passes(_point(8, served=5)) and breaks(_point(8, served=5))  # a refusal: the fleet is full


def test_the_ladder_doubles_until_it_breaks_then_takes_one_more_step():
    pts = _ladder(lambda n: _point(n, att=1.0 if n <= 4 else 0.9))
    assert [p["robots_requested"] for p in pts] == [1, 2, 4, 8, 16]
    h = headline(pts, 64)
    assert h == {"robots_served": 4, "at_robots": 4, "first_break_at": 8, "capped": False, "non_monotone": False}


def test_the_ladder_stops_at_the_cap_and_says_the_headline_is_a_lower_bound():
    pts = _ladder(lambda n: _point(n), max_robots=12)
    assert [p["robots_requested"] for p in pts] == [1, 2, 4, 8, 12]
    assert headline(pts, 12) == {"robots_served": 12, "at_robots": 12, "first_break_at": None, "capped": True,
                                 "non_monotone": False}
    assert [p["robots_requested"] for p in _ladder(lambda n: _point(n, att=0.5), max_robots=1)] == [1]


def test_admission_ends_the_ladder_and_the_headline_counts_admitted_robots():
    """d refuses what it cannot serve: at N = 16 it admits 10 and serves them at the bar; the ladder takes one more
    step (32: admits 10 again) and the headline is 10, not 16."""
    pts = _ladder(lambda n: _point(n, served=min(n, 10)))
    assert [p["robots_requested"] for p in pts] == [1, 2, 4, 8, 16, 32]
    h = headline(pts, 64)
    assert h["robots_served"] == 10 and h["at_robots"] == 16 and h["first_break_at"] == 16
    assert not h["non_monotone"]  # a point that passes with refusals is not a recovery after a break


def test_a_pass_after_a_break_counts_and_is_flagged():
    pts = [_point(1), _point(2, att=0.99), _point(4)]
    assert next_robots(pts[:2], 64) == 4 and next_robots(pts, 64) is None
    h = headline(pts, 64)
    assert h["robots_served"] == 4 and h["first_break_at"] == 2 and h["non_monotone"]


def test_nothing_served_gives_zero_and_no_ratio():
    pts = _ladder(lambda n: _point(n, att=0.5))
    assert [p["robots_requested"] for p in pts] == [1, 2]
    a = headline(pts, 64)
    assert a["robots_served"] == 0 and a["at_robots"] is None
    d = headline(_ladder(lambda n: _point(n, att=1.0 if n <= 16 else 0.0)), 64)
    assert ratio(d, a) is None and ratio(d, headline([_point(1), _point(2), _point(4, att=0)], 64)) == 8.0
    with pytest.raises(ValueError, match="max_robots"):
        next_robots([], 0)


@pytest.mark.parametrize("kw, field", [({"configs": ["a", "f"]}, "configs"), ({"configs": []}, "configs"),
                                       ({"configs": ["d", "d"]}, "configs"), ({"phases": ["async"]}, "phases"),
                                       ({"duration_s": 0.0}, "duration_s"), ({"max_robots": 0}, "max_robots"),
                                       ({"settle_max_s": -1.0}, "settle_max_s"),
                                       ({"settle_max_s": float("nan")}, "settle_max_s")])
def test_options_are_checked(kw, field):
    with pytest.raises(ValueError, match=f"FleetBenchConfig.{field}"):
        FleetBenchConfig(**kw)


def test_the_suite_has_its_own_help_describing_every_option(capsys):
    from dataclasses import fields

    from edgeinfer.cli import main
    from edgeinfer.core.config import field_docs, first_sentence

    with pytest.raises(SystemExit) as e:
        main(["bench", "fleet", "-h"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help: compare words
    assert e.value.code == 0 and text.startswith("usage: edgeinfer bench fleet")
    docs = field_docs(FleetBenchConfig)
    for f in fields(FleetBenchConfig):
        assert f"--{f.name.replace('_', '-')}" in text and first_sentence(docs[f.name])[1:40] in text, f.name
    assert main(["bench", "fleet", "--configs", "x", "--json", "/dev/null/x.json"]) == 2  # refused before a run


def _fake_measure(capacity: dict, interrupt_at: tuple | None = None):
    """measure() of a machine where configuration c serves capacity[c] robots (d refuses beyond it); Ctrl-C at
    (config, phase, n) when given."""
    def measure(cfg, conf, phase, n, out):
        if (conf, phase, n) == interrupt_at:
            raise KeyboardInterrupt
        cap = capacity[conf]
        served = min(n, cap) if conf == "d" else n
        return _point(n, served=served, att=1.0 if n <= cap else 0.95) | {"attainment_pooled": 1.0,
                                                                            "latency_ms": {"p99": 3.0}}
    return measure


def test_the_run_measures_every_ladder_and_computes_d_over_a(tmp_path):
    cfg = FleetBenchConfig(json=tmp_path / "fleet.json", out=tmp_path / "out", max_robots=32)
    waits = []
    res = run_fleet(cfg, command=["x"], measure=_fake_measure({"a": 2, "b": 4, "c": 4, "d": 16, "e": 32}),
                    wait=lambda max_s: waits.append(max_s) or {"settle_s": 0.5, "quiet": True})
    assert waits == [cfg.settle_max_s] * len(res["points"])  # before every point
    assert all(p["settle_s"] == 0.5 and p["quiet"] for p in res["points"])
    assert json.loads((tmp_path / "fleet.json").read_text())["headline"] == res["headline"]
    assert (tmp_path / "fleet.png").stat().st_size > 0 and not res["interrupted"]
    assert {c: res["headline"][c]["sync"]["robots_served"] for c in CONFIGURATIONS} == {"a": 2, "b": 4, "c": 4,
                                                                                       "d": 16, "e": 32}
    assert res["ratio_d_over_a"] == {"sync": 8.0, "staggered": 8.0} and res["ratio_e_over_a"]["sync"] == 16.0
    a_sync = [p["robots_requested"] for p in res["points"] if p["config"] == "a" and p["phase"] == "sync"]
    assert a_sync == [1, 2, 4, 8]
    assert all(p["passed"] == (p["robots_requested"] <= 2) for p in res["points"] if p["config"] == "a")


def test_ctrl_c_keeps_the_points_measured(tmp_path):
    cfg = FleetBenchConfig(json=tmp_path / "fleet.json", out=tmp_path / "out", configs=["a", "d"])
    res = run_fleet(cfg, command=["x"], measure=_fake_measure({"a": 2, "d": 16}, interrupt_at=("d", "sync", 4)),
                    wait=lambda s: {})
    saved = json.loads((tmp_path / "fleet.json").read_text())
    assert saved["interrupted"] and res["interrupted"]
    assert [(p["config"], p["phase"], p["robots_requested"]) for p in saved["points"]][-3:] == [
        ("a", "staggered", 8), ("d", "sync", 1), ("d", "sync", 2)]
    assert saved["headline"]["d"]["sync"]["robots_served"] == 2 and "staggered" not in saved["headline"]["d"]
    assert saved["ratio_d_over_a"] == {"sync": 1.0}


def test_a_replay_that_fails_is_a_failed_point_and_the_bench_goes_on(tmp_path, capsys):
    """A runtime that dies at start-up (RuntimeError from the fleet replay) fails its point, breaks its ladder after
    one more step, and the next ladder is measured."""
    def measure(cfg, conf, phase, n, out):
        if conf == "a":
            raise RuntimeError("runtime process exited with code 1 during start-up")
        return _point(n)

    cfg = FleetBenchConfig(out=tmp_path, configs=["a", "d"], phases=["sync"], max_robots=4)
    res = run_fleet(cfg, command=["x"], measure=measure, wait=lambda s: {})
    a = [p for p in res["points"] if p["config"] == "a"]
    assert [p["robots_requested"] for p in a] == [1, 2] and all(not p["passed"] and p["breaks"] for p in a)
    assert a[0]["error"] == "RuntimeError: runtime process exited with code 1 during start-up"
    assert res["headline"]["a"]["sync"]["robots_served"] == 0 and res["headline"]["d"]["sync"]["robots_served"] == 4
    assert res["ratio_d_over_a"] == {"sync": None}
    assert "FAILED: RuntimeError: runtime process exited" in capsys.readouterr().err


def _robot(admitted, requests, attained, on_time, p99, steady, misses, killed=False, att=None):
    return {"admitted": admitted, "killed": killed, "requests": requests, "attained": attained,
            "attainment": att if att is not None else (attained / requests if requests else None),
            "on_time_any": on_time, "on_time_any_rate": on_time / requests if requests else None,
            "latency_ms": {"p50": p99 / 4, "p99": p99, "p999": p99 * 2},
            "control": {"steady_ticks": steady, "misses": misses, "miss_rate": misses / steady if steady else None}}


def test_a_point_pools_the_served_robots_only():
    """Robot r2 was refused and r3 killed: neither counts; r0 and r1 pool, the worst is r1's."""
    from edgeinfer.bench.fleet_points import point
    from edgeinfer.sim.stats import clopper_pearson_interval

    report = {"fleet": {"refused": {"r2": "refused: ..."}},
              "robots": {"r0": _robot(True, 1000, 1000, 1000, 3.0, 5000, 0),
                         "r1": _robot(True, 1000, 990, 999, 9.0, 5000, 10),
                         "r2": _robot(False, 0, 0, 0, 1.0, 0, 0),
                         "r3": _robot(True, 500, 100, 100, 50.0, 2500, 2000, killed=True)},
              "runtime": {"fleet": {"robots": {"r0": {"k_hist": {"k0": 5, "k1-2": 1}, "batch_hist": {"2": 7, "1": 1}},
                                               "r1": {"k_hist": {"k0": 6}, "batch_hist": {"2": 7, "10": 2}}}}},
              "processes": {"fleet": 2, "robots0": 0}}
    p = point(report, 4)
    assert p["robots_requested"] == 4 and p["robots_admitted"] == 2 and p["refused"] == {"r2": "refused: ..."}
    assert p["attainment_worst"] == 0.99 and p["attainment_pooled"] == 0.995 and p["chunks_requested"] == 2000
    assert p["attainment_pooled_ci95"] == list(clopper_pearson_interval(1990, 2000))
    assert p["on_time_any_worst"] == 0.999 and p["on_time_any_pooled"] == 0.9995
    assert p["latency_ms"] == {"p50": 2.25, "p99": 9.0, "p999": 18.0}
    assert p["control_ticks"] == 10000 and p["control_misses"] == 10 and p["control_miss_worst"] == 0.002
    assert p["k_histogram"] == {"k0": 11, "k1-2": 1} and list(p["batch_histogram"]) == ["1", "2", "10"]
    assert p["batch_histogram"]["2"] == 14 and p["process_failures"] == {"fleet": 2}
    nobody = point({"fleet": {}, "robots": {"r0": _robot(False, 0, 0, 0, 1.0, 0, 0)}}, 1)
    assert nobody["robots_admitted"] == 0 and nobody["attainment_worst"] is None and nobody["k_histogram"] is None
    assert not passes(nobody)


@pytest.mark.slow
def test_a_tiny_real_run_through_the_command_line(tmp_path, capsys):
    """d (edgeinfer fleet), sync, N = 1..2, 1 s each: a real runtime, robots and sockets (sim/fleet_replay.py)."""
    from edgeinfer.cli import main

    out = tmp_path / "fleet.json"
    code = main(["bench", "fleet", "--configs", "d", "--phases", "sync", "--max-robots", "2", "--duration-s",
                 "1", "--json", str(out), "--out", str(tmp_path / "points"),
                 "--settle-max-s", "1"])  # structure, not figures: a busy suite need not wait for quiet CPUs
    # (one sample of the CPUs before each point; test_settle_gives_up_after_its_longest_wait tests the wait)
    text = capsys.readouterr()
    print(text.out, text.err)  # the real run's table, for the record (pytest -s)
    res = json.loads(out.read_text())
    assert code == 0 and not res["interrupted"] and res["schema"] == "edgeinfer.bench.fleet_capacity/1"
    assert [(p["config"], p["phase"], p["robots_requested"]) for p in res["points"]] == [("d", "sync", 1),
                                                                                        ("d", "sync", 2)]
    for p in res["points"]:
        n = p["robots_admitted"]
        assert 0 <= n <= p["robots_requested"] and all(c == 0 for c in p["process_exit_codes"].values())
        if n:
            # 1 s of planning observations every 20 ms per robot; a loaded machine may skip some (overruns)
            assert 10 * n <= p["chunks_requested"] <= 60 * n and p["control_ticks"] >= 100 * n
            assert 0 <= p["attainment_worst"] <= p["attainment_pooled"] <= 1 and p["latency_ms"]["p50"] > 0
            assert p["latency_ms"]["p50"] <= p["latency_ms"]["p99"] <= p["latency_ms"]["p999"]
            assert p["passed"] == (p["attainment_worst"] >= 0.999 and p["control_miss_worst"] <= 0.001)
    h = res["headline"]["d"]["sync"]
    assert h["robots_served"] == max([p["robots_admitted"] for p in res["points"] if p["passed"]], default=0)
    assert res["ratio_d_over_a"] == {}  # no a measured
    assert (tmp_path / "fleet.png").stat().st_size > 10_000 and "robots served at" in text.out


def test_an_interrupted_replay_stops_the_bench_and_the_runtime_is_sized_to_the_fleet(monkeypatch, tmp_path):
    """measure_point: a fleet replay cut by Ctrl-C is not a point (KeyboardInterrupt); the replay it starts has the
    configuration's scheduling, n_slots = N (1 per process in a), and the bench's policy, backend and duration."""
    from edgeinfer.bench import fleet_points

    seen = []

    def fake(cfg, console):
        seen.append(cfg)
        return {"interrupted": True}

    monkeypatch.setattr("edgeinfer.sim.fleet_replay.fleet_replay", fake)
    cfg = FleetBenchConfig(out=tmp_path, duration_s=2.5)
    for conf in ("a", "c"):
        with pytest.raises(KeyboardInterrupt, match="interrupted"):
            fleet_points.measure_point(cfg, conf, "staggered", 8, tmp_path / conf)
    a, c = seen
    assert a.runtime_per_robot and a.fleet.n_slots == 1 and not a.fleet.scheduling.batching
    assert not c.runtime_per_robot and c.fleet.n_slots == 8 and c.fleet.scheduling.order == "arrival"
    assert c.fleet.scheduling.batching and c.fleet.scheduling.k == 0 and not c.fleet.scheduling.adaptive_k
    assert not c.fleet.scheduling.deadline_cut and not c.fleet.scheduling.admission
    assert (c.robots, c.phase, c.duration_s, c.fleet.backend, c.fleet.policy) == (8, "staggered", 2.5, "fused",
                                                                                  cfg.policy)


def test_the_plan_bounds_the_points_and_the_ladder_is_the_one_next_robots_walks():
    from edgeinfer.bench.fleet_capacity import plan_line
    from edgeinfer.bench.fleet_ladder import ladder

    assert ladder(1) == [1] and ladder(12) == [1, 2, 4, 8, 12] and ladder(32) == [1, 2, 4, 8, 16, 32]
    assert [p["robots_requested"] for p in _ladder(lambda n: _point(n), max_robots=12)] == ladder(12)
    line = plan_line(FleetBenchConfig(duration_s=6.0, max_robots=32))
    # 5 configs x 2 phases x 6 steps x (6 + 9) s, + 2 s for each of a's 63 runtime processes in both phases
    assert "at most 60 points of 6 s, about 19 min on a quiet machine" in line


def test_settle_gives_up_after_its_longest_wait():
    from edgeinfer.bench.fleet_capacity import settle

    assert settle(0.0) == {"settle_s": 0.0, "cpu_busy_pct": None, "quiet": None}  # no wait: nothing measured
    got = settle(1.5)  # one or two one-second samples: never more than max_s plus one sample
    assert got["settle_s"] <= 3.0 and 0.0 <= got["cpu_busy_pct"] <= 100.0
