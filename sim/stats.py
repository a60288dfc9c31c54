"""Statistics of latency and deadline misses: quantile summaries and confidence intervals.

A miss rate from a few thousand ticks is an estimate; reports carry an interval so that "0 misses in 750
ticks" reads as "below 0.5 % at 95 % confidence", not as "never misses".
"""
from __future__ import annotations

import importlib
import math
import threading

import numpy as np


def preload() -> threading.Thread:
    """Import scipy.stats in a background thread and return it (started). scipy.stats takes about 0.5 s to import
    on a 2-core CPU; a replay starts this while its nodes warm up, so that the figures at the end of the run do
    not wait for it (the functions here import it on first use; one that runs mid-import waits for it)."""
    thread = threading.Thread(target=importlib.import_module, args=("scipy.stats",), name="preload scipy.stats")
    thread.start()
    return thread

# Quantiles reported for latency, as (key, percent).
SUMMARY_PERCENTILES: tuple[tuple[str, float], ...] = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0),
                                                      ("p999", 99.9))


def _finite(samples) -> np.ndarray:
    """(N,) float64 of the finite entries; lost ticks may be recorded as NaN and are not latencies."""
    x = np.asarray(samples, dtype=np.float64).ravel()
    return x[np.isfinite(x)]


def _nan_as_inf(samples) -> np.ndarray:
    """(N,) float64 with NaN (a lost sample: no latency at all) as +inf, so that it fails every threshold."""
    x = np.asarray(samples, dtype=np.float64).ravel()
    return np.where(np.isnan(x), np.inf, x)


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


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def _check_k_n(k: int, n: int) -> None:
    if n < 0 or not 0 <= k <= max(n, 0):
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion k/n (Wilson 1927, JASA 22:209), via
    scipy.stats.binomtest(k, n).proportion_ci(method="wilson").

    Chosen over the Wald interval because it stays inside [0, 1] and keeps near-nominal coverage for rare
    events such as deadline misses (Agresti & Coull 1998, Am. Stat. 52:119). n == 0 gives (0.0, 1.0).
    Raises ValueError unless 0 <= k <= n and 0 < confidence < 1.
    """
    return _binomial_interval(k, n, confidence, "wilson")


def _binomial_interval(k: int, n: int, confidence: float, method: str) -> tuple[float, float]:
    from scipy import stats as st  # imported on first use: see preload()
    _check_confidence(confidence)
    _check_k_n(k, n)
    if n == 0:
        return 0.0, 1.0
    ci = st.binomtest(k, n).proportion_ci(confidence, method=method)
    return float(ci.low), float(ci.high)


def clopper_pearson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper & Pearson 1934, Biometrika 26:404) interval for a binomial proportion k/n, via
    scipy.stats.binomtest(k, n).proportion_ci(method="exact").

    The bounds solve P(B >= k | p_lo) = a/2 and P(B <= k | p_hi) = a/2 with a = 1 - confidence. Coverage is
    at least the nominal level for every p (it is conservative), which is what a bound on a deadline-miss
    rate should be. n == 0 gives (0.0, 1.0). Raises ValueError unless 0 <= k <= n and 0 < confidence < 1.
    """
    return _binomial_interval(k, n, confidence, "exact")


def quantile_ci(samples, q: float, confidence: float = 0.95) -> tuple[float, float] | None:
    """Distribution-free confidence interval for the q-quantile from order statistics (binomial method),
    via scipy.stats.quantile_test(samples, p=q).confidence_interval(confidence).

    With X_(1) <= ... <= X_(n) and B ~ Binomial(n, q), P(X_(l) <= xi_q < X_(u)) >= P(l <= B <= u-1)
    (Hahn & Meeker 1991, Statistical Intervals, sec. 5.2; Conover 1999, sec. 3.2); l and u are chosen so
    that each tail is at most a/2, a = 1 - confidence.
    samples: (N,) numbers in any unit, non-finite ignored. Returns (X_(l), X_(u)) in the samples' unit, or
    None when n is too small for such ranks to exist (e.g. p99 needs n >= 368 at 95 %).
    Raises ValueError unless 0 < q < 1 and 0 < confidence < 1.
    """
    from scipy import stats as st  # imported on first use: see preload()
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q}")
    _check_confidence(confidence)
    x = _finite(samples)
    if x.size == 0:
        return None
    ci = st.quantile_test(x, p=q).confidence_interval(confidence)  # NaN where a rank does not exist
    if np.isnan(ci.low) or np.isnan(ci.high):
        return None
    return float(ci.low), float(ci.high)


# --- MLPerf LoadGen early stopping --------------------------------------------------------------------------

def min_passing_samples(n_over: int, percentile: float, confidence: float = 0.99) -> int:
    """MLPerf LoadGen's early-stopping sample count: the least number h of samples at or under a latency
    threshold such that, with n_over samples over it, "the `percentile` quantile is <= the threshold" holds
    with the given confidence.

    LoadGen (mlcommons/inference, loadgen/early_stopping.cc, tolerance d = 0) treats each sample as a
    Bernoulli trial that is over the threshold with probability 1 - percentile when the quantile sits exactly
    at the threshold, and passes when P(Binomial(h + n_over, 1 - percentile) <= n_over) < 1 - confidence
    (scipy.stats.binom.cdf).
    percentile: in (0, 1), e.g. 0.99. Raises ValueError for n_over < 0 or arguments out of range.
    """
    if n_over < 0:
        raise ValueError(f"n_over must be >= 0, got {n_over}")
    if not 0.0 < percentile < 1.0:
        raise ValueError(f"percentile must be in (0, 1), got {percentile}")
    _check_confidence(confidence)

    def passes(h: int) -> bool:
        return early_stopping_passes(n_over, h + n_over, percentile, confidence)

    lo = math.ceil(math.log(1.0 - confidence) / math.log(percentile))  # the exact answer for n_over == 0
    if passes(lo - 1):  # float rounding at the boundary
        lo -= 1
    hi = max(lo, 1)
    while not passes(hi):
        lo, hi = hi, hi * 2
    while lo < hi:  # least h in [lo, hi] that passes; passes() is monotone in h
        mid = (lo + hi) // 2
        if passes(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


def early_stopping_passes(n_over: int, n: int, percentile: float, confidence: float = 0.99) -> bool:
    """True when n samples of which n_over exceed a threshold show, at `confidence`, that the `percentile`
    quantile is at or under that threshold (LoadGen's early-stopping criterion, see min_passing_samples).
    Raises ValueError unless 0 <= n_over <= n and 0 <= percentile <= 1."""
    from scipy import stats as st  # imported on first use: see preload()
    if not 0 <= n_over <= n:
        raise ValueError(f"need 0 <= n_over <= n, got n_over={n_over}, n={n}")
    if not 0.0 <= percentile <= 1.0:
        raise ValueError(f"percentile must be in [0, 1], got {percentile}")
    return bool(st.binom.cdf(n_over, n, 1.0 - percentile) < 1.0 - confidence)


def early_stopping_estimate(samples, percentile: float, confidence: float = 0.99) -> float | None:
    """Upper confidence bound on the `percentile` quantile: the smallest sample x such that the samples above
    x still pass early_stopping_passes (LoadGen's SingleStream "early stopping percentile estimate").

    samples: (N,) numbers in any unit; NaN counts as +inf (a lost sample fails any latency threshold).
    Returns the bound in the samples' unit (inf when lost samples decide it), or None when N is too small
    for any bound (fewer than min_passing_samples(0, percentile, confidence) samples).
    It equals the upper end of quantile_ci(samples, percentile, 2 * confidence - 1) (same binomial event).
    """
    x = np.sort(_nan_as_inf(samples))
    n = x.size
    if n == 0 or not early_stopping_passes(0, n, percentile, confidence):
        return None
    lo, hi = 0, n - 1  # largest t with early_stopping_passes(t, n): monotone decreasing in t
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if early_stopping_passes(mid, n, percentile, confidence):
            lo = mid
        else:
            hi = mid - 1
    return float(x[n - lo - 1])  # exactly lo samples lie above it (fewer with ties)


# --- means and two-sample tests ----------------------------------------------------------------------------

def mean_ci(samples, confidence: float = 0.95) -> tuple[float, float] | None:
    """Normal-approximation (central limit theorem) interval for the mean: mean -+ z * s / sqrt(n), via
    scipy.stats.norm.interval and scipy.stats.sem.

    samples: (N,) numbers, NaN counted as +inf (the mean is then unbounded: (inf, inf)). Consecutive ticks
    are correlated, so this interval is optimistic for time series; it is reported, and used for a mean
    objective, because no distribution-free bound on a mean exists. None for N < 2.
    Raises ValueError unless 0 < confidence < 1.
    """
    from scipy import stats as st  # imported on first use: see preload()
    _check_confidence(confidence)
    x = _nan_as_inf(samples)
    if x.size < 2:
        return None
    if not np.all(np.isfinite(x)):
        return math.inf, math.inf
    lo, hi = st.norm.interval(confidence, loc=x.mean(), scale=st.sem(x))
    return float(lo), float(hi)


# alternative names as the caller reads them -> scipy's, for the table [[k_a, n_a - k_a], [k_b, n_b - k_b]]:
# B's proportion higher <=> the table's odds ratio below 1.
_FISHER_ALTERNATIVES = {"two-sided": "two-sided", "b_greater": "less", "b_less": "greater"}


def fisher_exact_p(k_a: int, n_a: int, k_b: int, n_b: int, alternative: str = "two-sided") -> float:
    """p-value of Fisher's exact test that two binomial proportions k_a/n_a and k_b/n_b are equal, via
    scipy.stats.fisher_exact.

    Conditions on the total k_a + k_b (hypergeometric). alternative: "two-sided" sums the probabilities of
    all tables no more likely than the observed one (the convention of R's fisher.test); "b_greater" is
    P(B's count >= k_b), the one-sided test that B's proportion is higher; "b_less" is P(B's count <= k_b).
    Raises ValueError unless 0 <= k <= n for both samples and alternative is one of those.
    """
    from scipy import stats as st  # imported on first use: see preload()
    for k, n in ((k_a, n_a), (k_b, n_b)):
        _check_k_n(k, n)
    if alternative not in _FISHER_ALTERNATIVES:
        raise ValueError(f"alternative must be two-sided, b_greater or b_less, got {alternative!r}")
    table = [[k_a, n_a - k_a], [k_b, n_b - k_b]]
    return float(st.fisher_exact(table, alternative=_FISHER_ALTERNATIVES[alternative]).pvalue)


def exceedance_p(m: int, n_a: int, n_b: int) -> float:
    """P(at least m of sample B exceed the maximum of sample A) when both come from one distribution:
    C(n_b, m) / C(n_a + n_b, m), the exceedance test of Rosenbaum (1954, Ann. Math. Stat. 25:146).

    Judges a worse maximum from two runs: 5 of 1000 new ticks above the old run's max gives p ~ 0.03.
    Raises ValueError unless 0 <= m <= n_b and n_a >= 1.
    """
    if n_a < 1 or not 0 <= m <= n_b:
        raise ValueError(f"need n_a >= 1 and 0 <= m <= n_b, got m={m}, n_a={n_a}, n_b={n_b}")
    # The product prod_i (n_b - i) / (n_a + n_b - i) in log space, not scipy.stats.hypergeom.pmf(m, n_a + n_b,
    # n_b, m): that rounds m == 0 to 0.9999999999999999, and a report should read p = 1 there.
    i = np.arange(m, dtype=np.float64)
    return float(np.exp(np.sum(np.log(n_b - i) - np.log(n_a + n_b - i))))


# --- report helpers ----------------------------------------------------------------------------------------

def latency_ci_ms(latencies_ns, confidence: float = 0.95) -> dict[str, list[float] | None]:
    """{p50, p90, p99, p999: [lo, hi] ms or None} from quantile_ci on the finite entries of (N,) ns
    latencies; None where N is too small for that percentile (p999 needs N >= 3,689 at 95 %)."""
    x_ms = _finite(latencies_ns) / 1e6
    out: dict[str, list[float] | None] = {}
    for key, p in SUMMARY_PERCENTILES:
        ci = quantile_ci(x_ms, p / 100.0, confidence)
        out[key] = None if ci is None else [ci[0], ci[1]]
    return out


def histogram_us(latencies_ns, bin_us: int = 1) -> list[list[int]]:
    """cyclictest-style latency histogram, sparse: [[bin start in us, count], ...] ascending, for the finite
    entries of (N,) ns latencies in `bin_us` bins (negative latencies get negative bins). Raises ValueError
    for bin_us < 1."""
    if bin_us < 1:
        raise ValueError(f"bin_us must be >= 1, got {bin_us}")
    x = _finite(latencies_ns)
    bins, counts = np.unique(np.floor(x / (1000.0 * bin_us)).astype(np.int64), return_counts=True)
    return [[int(b) * bin_us, int(c)] for b, c in zip(bins, counts)]


def rms_ci(errors, batch: int = 50, confidence: float = 0.95) -> tuple[float, float] | None:
    """Batch-means interval for the root mean square of a time series of errors.

    errors: (N, ...) per-tick errors (any unit; all trailing axes are averaged per tick). Consecutive ticks
    are strongly correlated, so the interval is built on the means of non-overlapping batches of `batch`
    ticks (the batch-means method, Law & Kelton, Simulation Modeling and Analysis, ch. 9) with a normal
    quantile (scipy.stats.norm.interval), then square-rooted. Returns (lo, hi) in the errors' unit, or None
    for fewer than 2 batches. Raises ValueError unless 0 < confidence < 1.
    """
    from scipy import stats as st  # imported on first use: see preload()
    _check_confidence(confidence)
    e = np.asarray(errors, dtype=np.float64)
    if e.ndim == 0 or e.shape[0] < 2 * batch:
        return None
    per_tick = np.square(e).reshape(e.shape[0], -1).mean(axis=1)
    k = per_tick.size // batch
    means = per_tick[: k * batch].reshape(k, batch).mean(axis=1)
    lo, hi = st.norm.interval(confidence, loc=means.mean(), scale=st.sem(means))
    return math.sqrt(max(0.0, float(lo))), math.sqrt(float(hi))
