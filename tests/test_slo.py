"""SLO parsing and the VALID/INVALID verdict with confidence bounds and LoadGen-style sample counts."""
import numpy as np
import pytest
from synthetic_runs import report

from edgeinfer.sim.run_config import ReplayConfig
from edgeinfer.sim.slo import SLOError, evaluate, parse_slo
from edgeinfer.sim.stats import min_passing_samples


def test_parse_terms_and_units():
    objs = parse_slo("p99<=5ms, miss<=0.1%,p50<=800us,max<=20ms,mean<=2ms,p999<=7.5ms")
    assert [(o.metric, o.limit) for o in objs] == [("p99", 5.0), ("miss", 0.001), ("p50", 0.8), ("max", 20.0),
                                                   ("mean", 2.0), ("p999", 7.5)]
    assert parse_slo("miss<=0.002")[0].limit == 0.002 and parse_slo("P90<=1MS")[0].limit == 1.0


@pytest.mark.parametrize("text, names", [
    ("p98<=5ms", "p98"), ("p99<5ms", "p99<5ms"), ("p99<=5", "p99<=5"), ("p99<=5s", "p99<=5s"),
    ("miss<=150%", "miss<=150%"), ("miss<=1ms", "miss<=1ms"), ("p99<=0ms", "p99<=0ms"), ("", "empty"),
    ("p99<=5ms,p99<=6ms", "given twice"), ("p99<=5ms,,miss<=1%", "''"),
])
def test_bad_terms_name_the_term(text, names):
    with pytest.raises(SLOError, match=names if names != "''" else "slo term ''"):
        parse_slo(text)


def test_replay_config_checks_the_slo_up_front():
    assert ReplayConfig(slo="p99<=5ms").slo == "p99<=5ms"
    with pytest.raises(ValueError, match="p42"):
        ReplayConfig(slo="p42<=5ms")


def test_valid_needs_the_bound_not_the_estimate():
    rng = np.random.default_rng(0)
    lat = rng.gamma(4.0, 0.25, 2000)  # ms, p99 ~ 2.5 ms
    p99 = float(np.quantile(lat, 0.99, method="inverted_cdf"))
    v = evaluate(parse_slo("p99<=10ms,miss<=1%"), lat, misses=2)
    assert v["verdict"] == "VALID" and all(t["met"] and t["enough_samples"] for t in v["terms"])
    t99 = v["terms"][0]
    assert t99["estimate"] == pytest.approx(p99) and t99["upper_bound"] >= t99["estimate"]
    # a limit between the estimate and its bound: not enough samples, and how many would do
    tight = (t99["estimate"] + t99["upper_bound"]) / 2
    v = evaluate(parse_slo(f"p99<={tight}ms"), lat, misses=0)
    t = v["terms"][0]
    assert v["verdict"] == "INVALID" and not t["enough_samples"] and "not enough samples" in t["reason"]
    over = int(np.sum(lat > tight))
    assert t["min_samples"] == min_passing_samples(over, 0.99, 0.975) + over > 2000
    # a point estimate over the limit is plainly not met
    v = evaluate(parse_slo("p50<=0.5ms"), lat, misses=0)
    assert v["verdict"] == "INVALID" and "over the limit" in v["terms"][0]["reason"]


def test_short_runs_are_invalid_for_tails_loadgen_style():
    lat = np.full(300, 1.0)  # every tick 1 ms, far below the limit, but 300 samples cannot bound a p99
    t = evaluate(parse_slo("p99<=5ms"), lat, misses=0)["terms"][0]
    assert not t["met"] and t["upper_bound"] is None and t["min_samples"] == min_passing_samples(0, 0.99, 0.975)
    t = evaluate(parse_slo("miss<=0.1%"), lat, misses=0)["terms"][0]
    # 0 misses: the exact upper bound 1 - 0.025^(1/n) reaches 0.1 % only at n = 3,688
    assert not t["met"] and t["min_samples"] == 3688
    assert evaluate(parse_slo("miss<=0.1%"), np.ones(3688), misses=0)["verdict"] == "VALID"


def test_lost_commands_are_infinite_latency():
    lat = np.r_[np.full(1980, 1.0), np.full(20, np.nan)]
    v = evaluate(parse_slo("p99<=5ms,max<=10ms,mean<=5ms,p50<=5ms"), lat, misses=20)
    by = {t["metric"]: t for t in v["terms"]}
    assert by["max"]["estimate"] == np.inf and not by["max"]["met"]
    assert not by["mean"]["met"] and by["p50"]["met"]
    assert not by["p99"]["met"] and by["p99"]["upper_bound"] == np.inf  # 1 % lost: p99 cannot be bounded
    few = evaluate(parse_slo("p99<=5ms"), np.r_[np.full(1995, 1.0), np.full(5, np.nan)], misses=5)
    assert few["verdict"] == "VALID"  # 0.25 % lost is still a p99 under 5 ms at 97.5 %
    assert v["verdict"] == "INVALID"


def test_verdict_in_the_report():
    clean, _ = report(slo="p99<=5ms,miss<=1%")
    assert clean["slo"]["verdict"] == "VALID" and clean["slo"]["objective"] == "p99<=5ms,miss<=1%"
    killed, _ = report(slo="p99<=5ms,miss<=1%", kill_at_tick=300)
    terms = {t["metric"]: t for t in killed["slo"]["terms"]}
    assert killed["slo"]["verdict"] == "INVALID" and not terms["miss"]["met"] and terms["p99"]["met"]
    assert report()[0]["slo"] is None
