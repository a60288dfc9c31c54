"""`edgeinfer bench anytime` (edgeinfer/bench/anytime.py): the prefix-to-horizon rule, the verdict, and one tiny
run through every section (curves, speculative decoding, real replays) with values checked against independent
computations."""
from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

from edgeinfer.bench.anytime import AnytimeConfig, curve_windows, verdict, whole_horizon
from edgeinfer.engines.models.dct_tokenizer import DctTokenizer, constant_velocity_rad
from edgeinfer.engines.models.policy import feature_increment
from edgeinfer.engines.models.tokenizer import ActionTokenizer
from edgeinfer.engines.training.evaluate import greedy_tokens

H, D = 8, 6


def _offsets(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(n, H, D) smooth chunk offsets, rad: ramps with a little curvature; and the last chunk-step increment q -
    q_prev (n, D) of the same motion."""
    rng = np.random.default_rng(seed)
    h = np.arange(1, H + 1)[None, :, None]
    v, a = rng.normal(0, 2e-3, (n, 1, D)), rng.normal(0, 1e-4, (n, 1, D))
    return v * h + a * h ** 2, (v - a)[:, 0]


def test_a_step_prefix_is_held_at_its_last_step_and_a_dct_prefix_spans_the_horizon():
    off, inc_obs = _offsets(64)
    inc = np.diff(np.concatenate([np.zeros((64, 1, D)), off], axis=1), axis=1).reshape(-1, D)
    step = ActionTokenizer.fit(inc)
    tok = step.encode(off)
    two = whole_horizon(step, tok[:, :2 * D], H, inc_obs)
    assert two.shape == (64, H, D)
    np.testing.assert_array_equal(two[:, :2], step.decode(tok[:, :2 * D]))
    for h in range(2, H):  # held at step 2's target
        np.testing.assert_array_equal(two[:, h], two[:, 1])
    np.testing.assert_array_equal(whole_horizon(step, tok, H, inc_obs), step.decode(tok))  # a whole chunk: as is
    dct = DctTokenizer.fit(off, inc_obs)
    dtok = dct.encode(off, inc_obs)
    one = whole_horizon(dct, dtok[:, :D], H, inc_obs)  # coefficient 0 alone: the whole horizon
    np.testing.assert_array_equal(one, dct.decode(dtok[:, :D], inc_obs))  # the runtime's
    # coefficient 0 is the mean departure from constant velocity times sqrt(H), quantised within half a bin, kept
    departure = off - constant_velocity_rad(inc_obs, H)
    assert np.all(np.abs((one - off).mean(1)) <= dct.width_rad[0] / 2 / np.sqrt(H) + 1e-12)
    assert np.abs(departure.mean(1)).max() > 10 * dct.width_rad[0].max()  # a departure the row does say
    # a departure from constant velocity: the first step is close, not the chunk's mean
    assert np.sqrt(np.mean((one - off)[:, 0] ** 2)) < 0.1 * np.sqrt(np.mean((off.mean(1) - off[:, 0]) ** 2))


def _row(policy, cond, partial, held, rmse):
    return {"policy": policy, "condition": cond, "chunk_rungs": {"partial": partial}, "held_ticks": held,
            "action_rmse_rad": rmse}


def _result(replays, full_step=1e-3, full_dct=1.05e-3):
    curve = {p: {"greedy": [{"tokens": 48, "action_rmse_rad": v}]} for p, v in (("step", full_step), ("dct", full_dct))}
    return {"replays": replays, "curve": curve}


def test_the_verdict_judges_only_where_the_step_policy_sent_partial_chunks():
    good = [_row("step", "budget 2 ms", 5, 40, 3e-3), _row("dct", "budget 2 ms", 0, 2, 2e-3),
            _row("step", "budget 20 ms", 0, 0, 1e-3), _row("dct", "budget 20 ms", 0, 9, 9e-3)]  # not judged
    v = verdict(_result(good))
    assert [r["condition"] for r in v["conditions_with_step_partial"]] == ["budget 2 ms"]
    assert v["dct_better_wherever_step_partial"] and v["full_chunk_within_10pct"] and v["passed"]
    assert v["full_chunk_ratio"] == pytest.approx(1.05)
    none_held = [_row("step", "budget 5 ms", 3, 0, 3e-3), _row("dct", "budget 5 ms", 0, 0, 2e-3)]
    assert verdict(_result(none_held))["passed"]  # neither held a tick: none is as few as can be
    more_holds = [good[0], _row("dct", "budget 2 ms", 0, 41, 2e-3)]
    assert not verdict(_result(more_holds))["passed"]
    higher_rmse = [good[0], _row("dct", "budget 2 ms", 0, 2, 4e-3)]
    assert not verdict(_result(higher_rmse))["conditions_with_step_partial"][0]["lower_action_rmse"]
    assert not verdict(_result(good, full_dct=1.2e-3))["passed"]  # 20 % worse with an unlimited budget


def test_runs_must_be_held_out():
    with pytest.raises(ValueError, match="measurement 2 is a training run"):
        AnytimeConfig(runs=[2])
    with pytest.raises(ValueError, match="slowdowns"):
        AnytimeConfig(slowdowns=[1.0])


@pytest.fixture(scope="module")
def tiny(schunk_dir, tmp_path_factory):
    """`edgeinfer bench anytime` on one short held-out run (0.9 s), a cut budget and a slowed engine, 48 curve
    windows, one spec chunk per held-out run, on the fused engine (its spec section 4x sooner than on torch's),
    through the command line in this process: (config, exit code, the --json result)."""
    from edgeinfer.cli import main

    out = tmp_path_factory.mktemp("anytime")
    cfg = AnytimeConfig(json=out / "anytime.json", out=out / "replays", data_dir=schunk_dir, runs=[61],
                        budgets_ms=[2.0], slowdowns=[2.0], curve_windows=48, spec_per_run=1, spec_ks=[2],
                        backend="fused")
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(["bench", "anytime", "--json", str(cfg.json), "--out", str(cfg.out), "--data-dir", str(schunk_dir),
                     "--runs", "61", "--budgets-ms", "2", "--slowdowns", "2", "--curve-windows", "48", "--spec-per-run",
                     "1", "--spec-ks", "2", "--backend", "fused"])
    return cfg, code, json.loads(cfg.json.read_text())


def test_a_tiny_run_fills_every_section_with_real_values(tiny):
    from edgeinfer.engines.models.policy import load_policy
    from edgeinfer.engines.training.evaluate import evaluate_policy

    cfg, code, result = tiny
    assert result["schema"] == "edgeinfer.bench.anytime/1" and result["config"]["runs"] == [61]
    assert (cfg.json.parent / "anytime.png").stat().st_size > 10_000
    for p, path in (("step", cfg.step_policy), ("dct", cfg.dct_policy)):
        curve = result["curve"][p]
        assert [c["tokens"] for c in curve["greedy"]] == list(range(D, H * D + 1, D))
        policy = load_policy(path)
        feats, offsets, _ = curve_windows(policy, cfg.data_dir, 48)
        # the whole chunk: engines/training/evaluate.py's held-out RMSE on the same windows, computed by its own code
        assert curve["greedy"][-1]["action_rmse_rad"] == pytest.approx(
            evaluate_policy(policy, feats, offsets)["action_rmse_rad"], rel=1e-9)
        first = curve["greedy"][0]["action_rmse_rad"]
        assert np.isfinite(first) and first > curve["tokenizer"][-1]["action_rmse_rad"]
        tokens = greedy_tokens(policy, feats)[:, :D]
        if p == "step":  # one step, then held: broadcast over the horizon
            one = policy.tokenizer.decode(tokens)  # (N, 1, D): step tokens need no increment
            assert one.shape == (48, 1, D)
            assert first == pytest.approx(float(np.sqrt(np.mean((one - offsets) ** 2))), rel=1e-9)
        else:  # coefficient 0 of every joint: the whole horizon
            assert policy.tokenizer.decode(tokens, feature_increment(feats)).shape == (48, H, D)
        spec = result["spec"][p]
        assert spec["pass_ms"] > 0 and spec["target_only"]["tokens_per_target_pass"] == pytest.approx(1.0)
        for drafter in ("kinematic", "learned"):
            for row in spec["drafters"][drafter].values():
                assert row["exact"] and row["speedup"] > 0 and row["tokens_per_target_pass"] >= 1
    assert [(r["policy"], r["condition"]) for r in result["replays"]] == [
        (p, c) for p in ("step", "dct") for c in ("budget 2 ms", "slowed 2x")]
    for r in result["replays"]:
        assert r["ticks"] == 234 and r["runs"] == ["measurement_61"]  # every row of the run
        assert r["engine"] == ["fused fp32 cpu"]  # the engine the spec section timed (--backend), not auto's choice
        assert sum(r["tick_rungs"].values()) + r["deadline_misses"] >= r["ticks"]
        assert 0 <= r["miss_rate_ci95"][0] <= r["miss_rate"] <= r["miss_rate_ci95"][1] <= 1
        assert 0 < r["action_rmse_rad"] < 0.05 and r["process_exit_codes"] == [{"runtime": 0, "control": 0}]
        spec = result["spec"][r["policy"]]  # slowed 2x: one more target pass's worth of delay per pass
        # (rounded to 0.1 us, as the runtime's fault option takes it)
        assert r["pass_delay_ms"] == (0 if r["slowdown"] == 1 else pytest.approx(spec["pass_ms"], abs=5e-5))
        assert r["budget_ms"] == (2.0 if r["slowdown"] == 1 else 20.0)  # the default: 5 ticks at 250 Hz
    assert code == (0 if result["verdict"]["passed"] else 1)


def test_the_suite_is_registered_with_its_own_help(capsys):
    from dataclasses import fields

    from edgeinfer.cli import main
    from edgeinfer.core.config import field_docs

    with pytest.raises(SystemExit) as e:
        main(["bench", "anytime", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "usage: edgeinfer bench anytime" in text
    names = [f.name for f in fields(AnytimeConfig)]
    assert set(field_docs(AnytimeConfig)) == set(names)  # every option described
    assert all(f"--{n.replace('_', '-')}" in text for n in names)


def _report(log, ticks, misses, holds, rungs, chunk_rungs, rmse, n, rmse_all, n_all):
    return {"log": log, "engine": "torch fp32 cpu", "budget_ms": 5.0, "observations_sent": ticks,
            "deadline_misses": misses, "miss_rate_scope": "steady state", "outcomes": {"hold": holds},
            "fallbacks": rungs, "chunks": {"rungs": chunk_rungs}, "spec": {"tokens_per_target_pass": 2.0},
            "quality": {"action_rmse_rad": rmse, "ticks_compared": n, "action_rmse_rad_with_holds": rmse_all,
                        "ticks_compared_with_holds": n_all},
            "process_exit_codes": {"runtime": 0, "control": 0}}


def test_pooled_rows_add_the_runs_up():
    from edgeinfer.bench.anytime_replays import Condition, pooled
    from edgeinfer.sim.stats import clopper_pearson_interval

    a = _report("a", 100, 10, 4, {"partial": 90, "hold": 4}, {"partial": 20}, 1e-3, 96, 2e-3, 100)
    b = _report("b", 300, 0, 0, {"full": 300}, {"full": 60}, 3e-3, 300, 3e-3, 300)
    row = pooled([a, b], Condition(budget_ms=5.0), pass_ms=0.3)
    assert row["ticks"] == 400 and row["deadline_misses"] == 10 and row["miss_rate"] == 0.025
    assert row["miss_rate_ci95"] == list(clopper_pearson_interval(10, 400))
    assert row["held_ticks"] == 4 and row["tick_rungs"]["partial"] == 90 and row["tick_rungs"]["full"] == 300
    assert row["chunk_rungs"] == {"full": 60, "coarse": 0, "partial": 20, "draft": 0, "continue": 0}
    assert row["action_rmse_rad"] == pytest.approx(np.sqrt((100 * 4e-6 + 300 * 9e-6) / 400))
    assert row["action_rmse_rad_without_holds"] == pytest.approx(np.sqrt((96 * 1e-6 + 300 * 9e-6) / 396))
    assert row["condition"] == "budget 5 ms" and row["pass_delay_ms"] == 0
    assert pooled([a], Condition(slowdown=4.0), pass_ms=0.3)["pass_delay_ms"] == pytest.approx(0.9)


def test_an_interrupted_replay_stops_the_bench_instead_of_being_pooled(monkeypatch, tmp_path):
    """Ctrl-C during a replay stops that replay early (report "interrupted"); the bench must stop too (the CLI
    exits 130), not pool the cut run and print a verdict."""
    from edgeinfer.bench import anytime_replays
    from edgeinfer.engines.models.paths import DEFAULT_POLICY

    monkeypatch.setattr("edgeinfer.sim.replay.replay", lambda cfg, console: {"interrupted": True})
    with pytest.raises(KeyboardInterrupt, match="interrupted"):
        anytime_replays.replay_once(DEFAULT_POLICY, tmp_path, anytime_replays.Condition(budget_ms=5.0), 0.5,
                                    tmp_path / "out")
