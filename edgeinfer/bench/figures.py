"""From per-repeat samples to the bench's figures: one flat record per (ruler, scenario, decode, statistic).

A figure's `value` is the median over repeats of that statistic measured in each repeat (MLPerf-style:
several runs, the median quoted), `repeats` holds each repeat's value, `spread` their [min, max], and
`ci95` a 95 % interval where one is statistically defined: order-statistic intervals for latency quantiles
over the pooled samples (sim.stats.quantile_ci, Hahn & Meeker 1991) and the exact Clopper-Pearson interval
for miss rates (sim.stats.clopper_pearson_interval, as the replay report). `vs_target_only` = value / the
same figure of target-only decoding; `vs_floor` = value / the same statistic of the matching transport floor.
"""
from __future__ import annotations

import numpy as np

from edgeinfer.sim.stats import clopper_pearson_interval, quantile_ci

TAILS: tuple[tuple[str, float], ...] = (("p50", 50.0), ("p95", 95.0), ("p99", 99.0), ("p999", 99.9))
TAIL_KEYS = tuple(k for k, _ in TAILS) + ("max",)


def tails(samples) -> dict:
    """{n, p50, p95, p99, p999, max, mean} of the finite entries of samples (any unit; numpy's linear
    quantiles). Every statistic is None when there is no finite sample."""
    x = np.asarray(samples, dtype=np.float64).ravel()
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"n": 0, **dict.fromkeys(TAIL_KEYS + ("mean",))}
    qs = np.percentile(x, [p for _, p in TAILS])
    return {"n": int(x.size), **{k: float(v) for (k, _), v in zip(TAILS, qs)}, "max": float(x.max()),
            "mean": float(x.mean())}


def _median(values: list) -> float | None:
    v = [x for x in values if x is not None]
    return float(np.median(v)) if v else None


def figure(ruler: str, scenario: str, decode: str, stat: str, unit: str, better: str, repeats: list,
           ci95=None) -> dict:
    """One figure record (see the module docstring); better: "lower" | "higher"."""
    vals = [None if v is None else float(v) for v in repeats]
    finite = [v for v in vals if v is not None]
    return {"id": f"{scenario}/{ruler}/{decode}/{stat}", "ruler": ruler, "scenario": scenario, "decode": decode,
            "stat": stat, "unit": unit, "better": better, "value": _median(vals), "repeats": vals,
            "spread": [min(finite), max(finite)] if finite else None,
            "ci95": list(ci95) if ci95 is not None else None, "vs_target_only": None, "vs_floor": None}


def tail_figures(ruler: str, scenario: str, decode: str, per_repeat: list[np.ndarray], unit: str = "ms",
                 stats: tuple[str, ...] = TAIL_KEYS) -> list[dict]:
    """Figures for the tail statistics of samples measured once per repeat (lower is better)."""
    summaries = [tails(s) for s in per_repeat]
    pooled = np.concatenate([np.asarray(s, dtype=np.float64) for s in per_repeat])
    pct = dict(TAILS)
    out = []
    for stat in stats:
        ci = quantile_ci(pooled, pct[stat] / 100) if stat in pct else None
        out.append(figure(ruler, scenario, decode, stat, unit, "lower", [s[stat] for s in summaries], ci))
    return out


def miss_rate_figure(scenario: str, decode: str, misses: list[int], n: list[int]) -> dict:
    """The deadline miss rate: value = pooled misses / pooled observations over the repeats (not the
    median: rare events need every tick), with its exact (Clopper-Pearson) 95 % interval."""
    f = figure("deadline miss rate", scenario, decode, "rate", "fraction", "lower",
               [m / k if k else None for m, k in zip(misses, n)], clopper_pearson_interval(sum(misses), sum(n)))
    f["value"] = sum(misses) / sum(n) if sum(n) else None
    f["misses"], f["observations"] = sum(misses), sum(n)
    return f


def _ratio(a, b) -> float | None:
    return a / b if a is not None and b not in (None, 0) else None


def add_ratios(figures: list[dict], floor_of: dict[str, str]) -> None:
    """Fill vs_target_only (every figure with a target-only twin) and vs_floor (figures of a scenario in
    floor_of, against that floor's figure of the same statistic), in place."""
    by_id = {f["id"]: f for f in figures}
    for f in figures:
        if f["decode"] in ("target-only", "speculative"):
            twin = by_id.get(f"{f['scenario']}/{f['ruler']}/target-only/{f['stat']}")
            f["vs_target_only"] = _ratio(f["value"], twin["value"]) if twin else None
        floor_ruler = floor_of.get(f["scenario"])
        if floor_ruler and f["ruler"] == "latency":
            floor = by_id.get(f"floor/{floor_ruler}/floor/{f['stat']}")
            f["vs_floor"] = _ratio(f["value"], floor["value"]) if floor else None


def compare(base: dict, new: dict, tolerance: float) -> tuple[list[dict], str]:
    """Figures present in both results, each with ratio = new / base and a verdict:
    "regression" when the new value is worse by more than `tolerance` (relative) and the two intervals
    (ci95, else the spread over repeats) do not overlap; "improved" likewise in the better direction;
    "noise" when the change is beyond tolerance but the intervals overlap; "same" otherwise.
    Returns (rows, overall verdict: "regression" if any row is one, else "ok")."""
    base_by_id = {f["id"]: f for f in base["figures"]}
    rows = []
    for f in new["figures"]:
        b = base_by_id.get(f["id"])
        if b is None or b["value"] is None or f["value"] is None:
            continue
        ratio = _ratio(f["value"], b["value"])
        if ratio is None:
            verdict = "same" if f["value"] == b["value"] else ("regression" if (f["value"] > b["value"]) == (
                f["better"] == "lower") else "improved")
        else:
            worse = ratio > 1 + tolerance if f["better"] == "lower" else ratio < 1 - tolerance
            better = ratio < 1 - tolerance if f["better"] == "lower" else ratio > 1 + tolerance
            ia, ib = f["ci95"] or f["spread"], b["ci95"] or b["spread"]
            overlap = ia is not None and ib is not None and ia[0] <= ib[1] and ib[0] <= ia[1]
            verdict = "same" if not (worse or better) else ("noise" if overlap else
                                                              ("regression" if worse else "improved"))
        rows.append({"id": f["id"], "unit": f["unit"], "base": b["value"], "new": f["value"], "ratio": ratio,
                     "verdict": verdict})
    return rows, "regression" if any(r["verdict"] == "regression" for r in rows) else "ok"
