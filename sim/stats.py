"""Statistics of latency and deadline misses: quantile summaries and confidence intervals.

A miss rate from a few thousand ticks is an estimate; reports carry an interval so that "0 misses in 750
ticks" reads as "below 0.5 % at 95 % confidence", not as "never misses".
"""
from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

# Quantiles reported for latency, as (key, percent).
SUMMARY_PERCENTILES: tuple[tuple[str, float], ...] = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0),
                                                      ("p999", 99.9))


def _finite(samples) -> np.ndarray:
    """(N,) float64 of the finite entries; lost ticks may be recorded as NaN and are not latencies."""
    x = np.asarray(samples, dtype=np.float64).ravel()
    return x[np.isfinite(x)]


def latency_summary_ms(latencies_ns: np.ndarray) -> dict[str, float | None]:
    """Summarise latencies: (N,) int or float nanoseconds -> {p50, p90, p99, p999, max, mean} in ms.

    Quantiles use numpy's default (linear interpolation). Non-finite entries are ignored; with no finite
    entry every value is None, so the result never holds NaN and stays valid JSON.
    """
    x_ms = _finite(latencies_ns) / 1e6
    keys = [k for k, _ in SUMMARY_PERCENTILES] + ["max", "mean"]
    if x_ms.size == 0:
        return dict.fromkeys(keys)
    qs = np.percentile(x_ms, [p for _, p in SUMMARY_PERCENTILES])
    out = {k: float(v) for (k, _), v in zip(SUMMARY_PERCENTILES, qs)}
    out["max"] = float(x_ms.max())
    out["mean"] = float(x_ms.mean())
    return out


def _z(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion k/n (Wilson 1927, JASA 22:209).

    Chosen over the Wald interval because it stays inside [0, 1] and keeps near-nominal coverage for rare
    events such as deadline misses (Agresti & Coull 1998, Am. Stat. 52:119). n == 0 gives (0.0, 1.0).
    Raises ValueError unless 0 <= k <= n and 0 < confidence < 1.
    """
    z = _z(confidence)
    if n < 0 or not 0 <= k <= max(n, 0):
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = k / n
    z2n = z * z / n
    center = (p + z2n / 2.0) / (1.0 + z2n)
    half = z * math.sqrt(p * (1.0 - p) / n + z2n / (4.0 * n)) / (1.0 + z2n)
    # Exact endpoints at k == 0 / k == n; the formula gives them only up to rounding.
    lo = 0.0 if k == 0 else max(0.0, center - half)
    hi = 1.0 if k == n else min(1.0, center + half)
    return lo, hi


def _binom_cdf(n: int, q: float) -> np.ndarray:
    """(n+1,) CDF of Binomial(n, q), built in log space so n in the millions neither overflows nor underflows."""
    i = np.arange(1, n + 1, dtype=np.float64)
    log_ratio = np.log(n - i + 1) - np.log(i) + math.log(q) - math.log1p(-q)
    log_pmf = np.concatenate([[n * math.log1p(-q)], n * math.log1p(-q) + np.cumsum(log_ratio)])
    pmf = np.exp(log_pmf - log_pmf.max())
    return np.cumsum(pmf) / pmf.sum()


def quantile_ci(samples, q: float, confidence: float = 0.95) -> tuple[float, float] | None:
    """Distribution-free confidence interval for the q-quantile from order statistics (binomial method).

    With X_(1) <= ... <= X_(n) and B ~ Binomial(n, q), P(X_(l) <= xi_q < X_(u)) >= P(l <= B <= u-1)
    (Hahn & Meeker 1991, Statistical Intervals, sec. 5.2). We take the largest l with P(B <= l-1) <= a/2
    and the smallest u with P(B <= u-1) >= 1 - a/2, a = 1 - confidence, so each tail is at most a/2.
    samples: (N,) numbers in any unit, non-finite ignored. Returns (X_(l), X_(u)) in the samples' unit, or
    None when n is too small for such ranks to exist (e.g. p99 needs n >= 368 at 95 %).
    Raises ValueError unless 0 < q < 1 and 0 < confidence < 1.
    """
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q}")
    _z(confidence)
    x = np.sort(_finite(samples))
    n = x.size
    if n == 0:
        return None
    alpha = 1.0 - confidence
    cdf = _binom_cdf(n, q)  # cdf[j] = P(B <= j)
    # Rank r (1-based) uses cdf[r-1]; valid ranks are 1..n.
    lower_ok = np.flatnonzero(cdf[:n] <= alpha / 2.0)
    upper_ok = np.flatnonzero(cdf[:n] >= 1.0 - alpha / 2.0)
    if lower_ok.size == 0 or upper_ok.size == 0:
        return None
    l_rank, u_rank = int(lower_ok[-1]) + 1, int(upper_ok[0]) + 1
    return float(x[l_rank - 1]), float(x[u_rank - 1])
