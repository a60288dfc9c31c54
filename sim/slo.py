"""Service-level objectives for a replay: parse `p99<=5ms,miss<=0.1%` and judge a run VALID or INVALID.

The verdict follows MLPerf LoadGen: an objective is met only when a confidence bound meets it, not the point
estimate, and a run too short to show it says how many samples it would have needed (LoadGen's early
stopping). Bounds are the upper ends of the report's two-sided 95 % intervals (one-sided 97.5 %):

- pXX (p50, p90, p99, p999): the order-statistic bound (stats.early_stopping_estimate, which equals the upper
  end of stats.quantile_ci). A tick whose command never arrived counts as an infinite latency.
- max: the observed maximum, the cyclictest headline (no bound exists for a maximum; a lost tick is inf).
- mean: the CLT bound of stats.mean_ci (optimistic for correlated ticks; lost ticks make it inf).
- miss: the Clopper-Pearson upper bound on the deadline-miss rate.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from edgeinfer.sim.stats import (
    SUMMARY_PERCENTILES,
    _nan_as_inf,
    clopper_pearson_interval,
    early_stopping_estimate,
    mean_ci,
    min_passing_samples,
)

CONFIDENCE = 0.95  # two-sided; each verdict uses the upper end, a one-sided (1 + CONFIDENCE) / 2 bound
_ONE_SIDED = (1.0 + CONFIDENCE) / 2.0
_PERCENTILES = {k: p / 100.0 for k, p in SUMMARY_PERCENTILES}
_LATENCY_UNITS_MS = {"ms": 1.0, "us": 1e-3}
_TERM = re.compile(r"^\s*([a-z0-9]+)\s*<=\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*([a-z%]*)\s*$")


class SLOError(ValueError):
    """An objective string that cannot be parsed; the text names the bad term."""


@dataclass(frozen=True)
class Objective:
    """One term: `metric` (p50, p90, p99, p999, max, mean or miss) <= `limit` (ms for latency, a fraction
    in [0, 1] for miss); `text` is the term as written."""

    metric: str
    limit: float
    text: str


def parse_slo(text: str) -> list[Objective]:
    """Parse "p99<=5ms,miss<=0.1%" into Objectives (terms separated by commas).

    Latency terms (p50/p90/p99/p999/max/mean) need a unit, ms or us; miss takes a percentage ("0.1%") or a
    fraction ("0.001"). Raises SLOError naming the term for an unknown metric, a missing or wrong unit, a
    limit out of range, a repeated metric or an empty string.
    """
    terms = [t for t in (text or "").split(",")]
    if not any(t.strip() for t in terms):
        raise SLOError(f"slo {text!r}: empty; expected terms like 'p99<=5ms,miss<=0.1%'")
    out: list[Objective] = []
    for raw in terms:
        m = _TERM.match(raw.lower())
        if m is None:
            raise SLOError(f"slo term {raw.strip()!r}: expected METRIC<=VALUE[UNIT], e.g. 'p99<=5ms' or "
                           "'miss<=0.1%'")
        metric, value, unit = m.group(1), float(m.group(2)), m.group(3)
        if metric == "miss":
            if unit not in ("", "%"):
                raise SLOError(f"slo term {raw.strip()!r}: miss takes a percentage (0.1%) or a fraction, "
                               f"not {unit!r}")
            limit = value / 100.0 if unit == "%" else value
            if not 0.0 <= limit <= 1.0:
                raise SLOError(f"slo term {raw.strip()!r}: a miss rate must be in [0, 100] % ")
        elif metric in _PERCENTILES or metric in ("max", "mean"):
            if unit not in _LATENCY_UNITS_MS:
                raise SLOError(f"slo term {raw.strip()!r}: latency needs a unit, ms or us (got {unit or 'none'!r})")
            limit = value * _LATENCY_UNITS_MS[unit]
            if not limit > 0:
                raise SLOError(f"slo term {raw.strip()!r}: a latency limit must be > 0")
        else:
            raise SLOError(f"slo term {raw.strip()!r}: unknown metric {metric!r}; expected one of "
                           f"{', '.join([*_PERCENTILES, 'max', 'mean', 'miss'])}")
        if any(o.metric == metric for o in out):
            raise SLOError(f"slo term {raw.strip()!r}: {metric} is given twice")
        out.append(Objective(metric, limit, raw.strip()))
    return out


def _min_samples_for_rate(k: int, limit: float) -> int | None:
    """Least n with clopper_pearson upper(k, n) <= limit (the sample count a miss objective needs at this
    many misses); None when no n can show it (limit 0 with misses, or limit >= 1 never needs samples)."""
    if limit <= 0.0:
        return None
    if limit >= 1.0:
        return max(k, 1)
    upper = lambda n: clopper_pearson_interval(k, n, CONFIDENCE)[1]  # noqa: E731, decreasing in n
    lo, hi = max(k, 1), max(k, 1)
    while upper(hi) > limit:
        lo, hi = hi, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if upper(mid) <= limit:
            hi = mid
        else:
            lo = mid + 1
    return hi


def evaluate(objectives: list[Objective], latency_ms: np.ndarray, misses: int) -> dict:
    """Judge a run against `objectives`.

    latency_ms: (N,) float ms, one per observation, NaN where no command arrived. misses: deadline misses
    among those N (late, lost or held). Returns {"verdict": "VALID"|"INVALID", "confidence", "terms": [{term,
    metric, limit (ms or fraction), estimate, upper_bound, met, enough_samples, min_samples, verdict,
    reason}]}; VALID only when every term's bound meets its limit. A term whose point estimate meets the
    limit but whose bound does not is INVALID for "not enough samples" and says how many would do (with the
    same count over the limit, LoadGen style).
    """
    x = _nan_as_inf(latency_ms)
    n = x.size
    terms = []
    for o in objectives:
        t = {"term": o.text, "metric": o.metric, "limit": o.limit, "estimate": None, "upper_bound": None,
             "min_samples": None}
        if n == 0:
            t.update(met=False, enough_samples=False, reason="no samples")
        elif o.metric == "miss":
            lo_hi = clopper_pearson_interval(misses, n, CONFIDENCE)
            t.update(estimate=misses / n, upper_bound=lo_hi[1], min_samples=_min_samples_for_rate(misses, o.limit))
        elif o.metric in _PERCENTILES:
            p = _PERCENTILES[o.metric]
            over = int(np.sum(x > o.limit))
            t.update(estimate=float(np.quantile(x, p, method="inverted_cdf")),
                     upper_bound=early_stopping_estimate(x, p, _ONE_SIDED),
                     min_samples=min_passing_samples(over, p, _ONE_SIDED) + over if over < n else None)
        elif o.metric == "max":
            t.update(estimate=float(x.max()), upper_bound=float(x.max()), min_samples=1)
        else:  # mean
            ci = mean_ci(x, CONFIDENCE)
            t.update(estimate=float(x.mean()), upper_bound=None if ci is None else ci[1], min_samples=2)
        if n:
            _judge(t, n)
        t["verdict"] = "VALID" if t["met"] else "INVALID"
        terms.append(t)
    return {"verdict": "VALID" if terms and all(t["met"] for t in terms) else "INVALID",
            "confidence": CONFIDENCE, "samples": n, "terms": terms}


def _judge(t: dict, n: int) -> None:
    est, ub, limit = t["estimate"], t["upper_bound"], t["limit"]
    t["enough_samples"] = t["min_samples"] is not None and n >= t["min_samples"]
    if est > limit:
        t.update(met=False, reason=f"estimate {_fmt(est, t)} is over the limit {_fmt(limit, t)}")
    elif ub is None or ub > limit:
        need = "no sample count can show it" if t["min_samples"] is None else f"needs {t['min_samples']}"
        t.update(met=False, enough_samples=False,
                 reason=f"not enough samples: bound {_fmt(ub, t)} over {_fmt(limit, t)} with {n} ({need})")
    else:
        t.update(met=True, enough_samples=True, reason=f"bound {_fmt(ub, t)} <= {_fmt(limit, t)}")


def _fmt(v: float | None, t: dict) -> str:
    if v is None:
        return "none"
    if t["metric"] == "miss":
        return f"{100 * v:.3g} %"
    return "inf" if math.isinf(v) else f"{v:.3f} ms"
