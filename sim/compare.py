"""Compare two replay reports figure by figure, with a verdict that accounts for the confidence intervals.

`edgeinfer compare A.json B.json`: A is the baseline, B the candidate. Per figure: A, B, the ratio B/A and
a verdict, "better", "worse", "no significant change", "changed" (a significant change in a figure
with no good direction: more ticks on a middle rung of the fallback ladder may replace full chunks or
holds) or "not judged" (no interval or counts to test):

- latency percentiles, time to chunk, action RMSE: the two 95 % intervals do not overlap (a conservative
  test: for intervals of equal width, about 0.3 % of identical runs would differ in each direction);
- miss rate, outcomes (late, lost, hold), ticks per rung, acceptance rate: Fisher's exact test on the
  counts, one-sided in each direction at ALPHA;
- max latency: Rosenbaum's exceedance test on the 1 us histograms (how many of B's ticks lie above A's
  maximum, and the reverse), one-sided in each direction at ALPHA;
- injected faults: observations dropped on the network are the replayer's own exact count (no sampling), so
  any difference is real: more is "worse"; the miss rate while the runtime was stalled and in the gap a
  killed runtime left: Fisher's exact test of those rows' misses against the other run's same window, or
  its whole run's miss rate when it had no such fault;
- time to first command: one sample per run, not judged;
- the host (CPU, governor, kernel, load, wake-up baseline, real-time grants): shown where the two reports
  differ, not judged (it says the runs were measured on different machines or conditions, not which is better).

Every figure is a separate test at ALPHA, so with some twenty figures a clean rerun is flagged somewhere
now and then; a regression that matters shows in several figures or again on a rerun.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from edgeinfer.sim.report import _jsonable
from edgeinfer.sim.stats import exceedance_p, fisher_exact_p

ALPHA = 0.05
BETTER, WORSE, SAME, CHANGED, NOT_JUDGED = "better", "worse", "no significant change", "changed", "not judged"
KNOWN_VERSIONS = (1, 2)  # reports before schema_version existed are 1: no intervals, nothing judged by CI


class ReportError(ValueError):
    """A file that is not a replay report this code can read; the text names the file."""


def load_report(path: str | Path) -> dict:
    """Read a report.json. Raises ReportError naming the file for a missing file, invalid JSON, another
    schema, or a newer schema_version than KNOWN_VERSIONS."""
    path = Path(path)
    try:
        report = json.loads(path.read_text())
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ReportError(f"{path}: not JSON ({e})") from None
    if not isinstance(report, dict) or not str(report.get("schema", "")).startswith("edgeinfer.replay/"):
        schema = report.get("schema") if isinstance(report, dict) else None
        raise ReportError(f"{path}: not an edgeinfer replay report (schema {schema!r})")
    version = report.get("schema_version", 1)
    if version not in KNOWN_VERSIONS:
        raise ReportError(f"{path}: schema_version {version!r}, this edgeinfer reads {KNOWN_VERSIONS}")
    return report


def _get(d: Any, *keys) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _interval(ci) -> tuple[float, float] | None:
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(isinstance(v, (int, float)) for v in ci):
        return float(ci[0]), float(ci[1])
    return None


def _by_intervals(ci_a, ci_b, lower_is_better: bool) -> tuple[str, str]:
    a, b = _interval(ci_a), _interval(ci_b)
    if a is None or b is None:
        return NOT_JUDGED, "no 95% interval"
    if b[0] > a[1]:
        return (WORSE if lower_is_better else BETTER), "95% intervals apart"
    if b[1] < a[0]:
        return (BETTER if lower_is_better else WORSE), "95% intervals apart"
    return SAME, "95% intervals overlap"


def _by_counts(k_a, n_a, k_b, n_b, lower_is_better: bool | None, alpha: float) -> tuple[str, str]:
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (k_a, n_a, k_b, n_b)) or not n_a or not n_b:
        return NOT_JUDGED, "no counts"
    up = fisher_exact_p(k_a, n_a, k_b, n_b, "b_greater")
    down = fisher_exact_p(k_a, n_a, k_b, n_b, "b_less")
    if min(up, down) >= alpha:
        return SAME, f"Fisher p={min(up, down):.2g}"
    if lower_is_better is None:
        return CHANGED, f"Fisher p={min(up, down):.2g}"
    higher = up < alpha
    return (WORSE if higher == lower_is_better else BETTER), f"Fisher p={min(up, down):.2g}"


def _histogram(report: dict) -> list[tuple[int, int]] | None:
    bins = _get(report, "latency_histogram_us", "bins")
    if not isinstance(bins, list) or not bins:
        return None
    return [(int(b), int(c)) for b, c in bins]


def _by_exceedance(a: dict, b: dict, alpha: float) -> tuple[str, str]:
    """Rosenbaum: m of B's ticks above A's maximum (bins strictly above A's highest bin), and the reverse."""
    ha, hb = _histogram(a), _histogram(b)
    if ha is None or hb is None:
        return NOT_JUDGED, "no histogram"
    n_a, n_b = sum(c for _, c in ha), sum(c for _, c in hb)
    m_b = sum(c for x, c in hb if x > ha[-1][0])
    m_a = sum(c for x, c in ha if x > hb[-1][0])
    p_worse, p_better = exceedance_p(m_b, n_a, n_b), exceedance_p(m_a, n_b, n_a)
    if p_worse < alpha:
        return WORSE, f"{m_b} of B above A's max, p={p_worse:.2g}"
    if p_better < alpha:
        return BETTER, f"{m_a} of A above B's max, p={p_better:.2g}"
    return SAME, f"exceedance p={min(p_worse, p_better):.2g}"


def _row(figure: str, va, vb, verdict: tuple[str, str], unit: str = "") -> dict:
    ratio = vb / va if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va else None
    return {"figure": figure, "unit": unit, "a": va, "b": vb, "ratio": ratio, "verdict": verdict[0],
            "test": verdict[1]}


def _dropped(report: dict) -> int | None:
    counts = _get(report, "replayer", "faults", "counts")
    return None if not isinstance(counts, dict) else int(counts.get("dropped", 0) + counts.get("burst_dropped", 0))


def _window(misses, rows) -> tuple[int, int] | None:
    return (int(misses), int(rows)) if isinstance(misses, int) and isinstance(rows, int) and rows > 0 else None


def _gap_rows(report: dict) -> int | None:
    gap = report.get("runtime_fault")
    if not isinstance(gap, dict):
        return None
    if "rows_in_gap" in gap:
        return gap["rows_in_gap"]
    n, k = report.get("observations_sent"), gap.get("killed_at_row")  # older reports: a gap to the end of the run
    return n - k - 1 if not gap.get("recovered") and isinstance(n, int) and isinstance(k, int) else None


# figure -> (misses, rows) of a fault's window in a report; None when that fault was not injected
FAULT_WINDOWS = {
    "miss rate while the runtime stalled": lambda r: _window(_get(r, "runtime_stall", "window", "during", "misses"),
                                                             _get(r, "runtime_stall", "window", "during", "rows")),
    "miss rate in a killed runtime's gap": lambda r: _window(_get(r, "runtime_fault", "misses_in_gap"),
                                                             _gap_rows(r)),
}


def compare(a: dict, b: dict, alpha: float = ALPHA) -> list[dict]:
    """Rows {figure, unit, a, b, ratio (B/A or None), verdict, test} for two report dicts (A = baseline).

    Figures missing from either report are skipped; those present without intervals or counts are "not
    judged". Raises ValueError unless 0 < alpha < 1.
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    rows = []
    for key in ("p50", "p90", "p99", "p999"):
        va, vb = _get(a, "latency_ms", key), _get(b, "latency_ms", key)
        if va is not None or vb is not None:
            rows.append(_row(f"latency {key}", va, vb, _by_intervals(_get(a, "latency_ci95_ms", key),
                                                                     _get(b, "latency_ci95_ms", key), True), "ms"))
    rows.append(_row("latency max", _get(a, "latency_ms", "max"), _get(b, "latency_ms", "max"),
                     _by_exceedance(a, b, alpha), "ms"))
    n_a, n_b = a.get("observations_sent"), b.get("observations_sent")
    verdict, test = _by_counts(a.get("deadline_misses"), n_a, b.get("deadline_misses"), n_b, True, alpha)
    if (scope_a := a.get("miss_rate_scope")) != (scope_b := b.get("miss_rate_scope")):
        test += f"; A {scope_a or 'whole run'}, B {scope_b or 'whole run'}"  # reports before pre-rolls: whole run
    rows.append(_row("miss rate", a.get("miss_rate"), b.get("miss_rate"), (verdict, test)))
    for outcome in ("late", "lost", "hold"):
        ka, kb = _get(a, "outcomes", outcome), _get(b, "outcomes", outcome)
        if ka is not None or kb is not None:
            rows.append(_row(f"ticks {outcome}", ka, kb, _by_counts(ka, n_a, kb, n_b, True, alpha)))
    rungs = list(dict.fromkeys([*(a.get("fallbacks") or {}), *(b.get("fallbacks") or {})]))
    for rung in rungs:
        ka, kb = _get(a, "fallbacks", rung) or 0, _get(b, "fallbacks", rung) or 0
        direction = {"full": False, "hold": True}.get(rung)  # middle rungs: no direction
        rows.append(_row(f"ticks served by {rung}", ka, kb, _by_counts(ka, n_a, kb, n_b, direction, alpha)))
    ka, kb = _dropped(a), _dropped(b)
    if ka is not None or kb is not None:
        ka, kb = ka or 0, kb or 0
        exact = (SAME if ka == kb else WORSE if kb > ka else BETTER), "exact count (injected)"
        rows.append(_row("observations dropped", ka, kb, exact))
    for figure, window in FAULT_WINDOWS.items():
        wa, wb = window(a), window(b)
        if wa is None and wb is None:
            continue
        # the other run's counterpart: its own window, else its whole run (no such fault: its usual miss rate)
        wa = wa or (a.get("deadline_misses"), n_a)
        wb = wb or (b.get("deadline_misses"), n_b)
        rate = lambda w: w[0] / w[1] if isinstance(w[0], int) and w[1] else None  # noqa: E731
        rows.append(_row(figure, rate(wa), rate(wb), _by_counts(wa[0], wa[1], wb[0], wb[1], True, alpha)))
    for key in ("p50", "p99"):
        va, vb = _get(a, "chunks", "time_to_chunk_ms", key), _get(b, "chunks", "time_to_chunk_ms", key)
        if va is not None or vb is not None:
            rows.append(_row(f"time to chunk {key}", va, vb, _by_intervals(
                _get(a, "chunks", "time_to_chunk_ci95_ms", key), _get(b, "chunks", "time_to_chunk_ci95_ms", key),
                True), "ms"))
    rows.append(_row("time to first command", _get(a, "start_up", "time_to_first_command_ms"),
                     _get(b, "start_up", "time_to_first_command_ms"), (NOT_JUDGED, "one sample per run"), "ms"))
    if _get(a, "spec", "acceptance_rate") is not None or _get(b, "spec", "acceptance_rate") is not None:
        rows.append(_row("acceptance rate", _get(a, "spec", "acceptance_rate"), _get(b, "spec", "acceptance_rate"),
                         _by_counts(_get(a, "spec", "accepted"), _get(a, "spec", "drafted"),
                                    _get(b, "spec", "accepted"), _get(b, "spec", "drafted"), False, alpha)))
    rows.append(_row("tokens per target pass", _get(a, "spec", "tokens_per_target_pass"),
                     _get(b, "spec", "tokens_per_target_pass"), (NOT_JUDGED, "no interval")))
    rows.append(_row("action RMSE", _get(a, "quality", "action_rmse_rad"), _get(b, "quality", "action_rmse_rad"),
                     _by_intervals(_get(a, "quality", "action_rmse_rad_ci95"),
                                   _get(b, "quality", "action_rmse_rad_ci95"), True), "rad"))
    rows += host_rows(a, b)
    return [r for r in rows if r["a"] is not None or r["b"] is not None]


def _granted(sched) -> str | None:
    """A process's real-time grant in a report's host.realtime: "granted", "refused", "not asked" (None: absent)."""
    if not isinstance(sched, dict):
        return None
    return {True: "granted", False: "refused"}.get(sched.get("granted"), "not asked")


# host figure -> its value in a report (sim/host.py)
HOST_FIGURES = {
    "host CPU": lambda r: _get(r, "host", "cpu_model"),
    "host CPUs": lambda r: _get(r, "host", "cpus"),
    "host governor": lambda r: _get(r, "host", "governor"),
    "host kernel": lambda r: _get(r, "host", "kernel"),
    "host load (1 min)": lambda r: (_get(r, "host", "load_average") or [None])[0],
    "host wake-up p99 (us)": lambda r: _get(r, "host", "wakeup_latency_us", "p99"),
    "host wake-up max (us)": lambda r: _get(r, "host", "wakeup_latency_us", "max"),
    **{f"real-time {name}": (lambda r, name=name: _granted(_get(r, "host", "realtime", name)))
       for name in ("replayer", "control")},
}


def host_rows(a: dict, b: dict) -> list[dict]:
    """One "not judged" row per HOST_FIGURES figure whose values differ between the reports (none when both
    reports come from one host in the same state, or neither has a host section)."""
    return [_row(figure, value(a), value(b), (NOT_JUDGED, "host state, not a test"))
            for figure, value in HOST_FIGURES.items() if value(a) != value(b)]


def regressions(rows: list[dict]) -> list[str]:
    """The figures whose verdict is "worse"."""
    return [r["figure"] for r in rows if r["verdict"] == WORSE]


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if math.isinf(v):
        return "inf"
    return f"{v:.4g}"


def print_comparison(rows: list[dict], label_a: str, label_b: str, console=None):
    """Print the rows as a rich table (verdicts coloured); returns the Table."""
    from rich.console import Console
    from rich.table import Table

    from edgeinfer.sim.tables import whole_words

    console = console or Console()
    table = Table(title=f"edgeinfer compare: A = {label_a}, B = {label_b}")
    for col, justify in (("figure", "left"), ("A", "right"), ("B", "right"), ("B/A", "right"),
                         ("verdict", "left"), ("test", "left")):
        table.add_column(col, justify=justify, no_wrap=col in ("figure", "verdict"))
    colour = {WORSE: "red", BETTER: "green", SAME: "default", CHANGED: "yellow", NOT_JUDGED: "dim"}
    for r in rows:
        unit = f" {r['unit']}" if r["unit"] else ""
        table.add_row(r["figure"] + unit, _fmt(r["a"]), _fmt(r["b"]), _fmt(r["ratio"]),
                      f"[{colour[r['verdict']]}]{r['verdict']}[/]", r["test"])
    console.print(whole_words(table))  # figures whole at 80 columns: the names and tests wrap instead
    return table


def main(path_a: Path, path_b: Path, json_out: Path | None = None, fail_on_regression: bool = False,
         alpha: float = ALPHA, console=None) -> int:
    """The `edgeinfer compare` command: print the comparison, write it as JSON when asked; exit code 1 when
    fail_on_regression and any figure is worse, else 0. Raises ReportError for an unreadable report."""
    a, b = load_report(path_a), load_report(path_b)
    rows = compare(a, b, alpha)
    label = lambda r, p: str(r.get("label") or p)  # noqa: E731
    print_comparison(rows, label(a, path_a), label(b, path_b), console)
    worse = regressions(rows)
    if json_out is not None:
        json_out = Path(json_out)
        json_out.parent.mkdir(parents=True, exist_ok=True)
        doc = {"schema": "edgeinfer.compare/1", "a": str(path_a), "b": str(path_b), "alpha": alpha, "rows": rows,
               "regressions": worse}
        json_out.write_text(json.dumps(_jsonable(doc), indent=2, allow_nan=False) + "\n")
    return 1 if fail_on_regression and worse else 0
