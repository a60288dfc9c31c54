"""Replay reports: report.json on disk, a side-by-side terminal table, and a latency plot.

The report dict ("edgeinfer.replay/1") is built elsewhere; these functions only read it, and tolerate extra
keys and None wherever a value could not be measured (no speculative decoding, no ground truth, ...).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

SCHEMA = "edgeinfer.replay/1"
_MISSING = "-"


def _jsonable(x: Any) -> Any:
    """numpy scalars/arrays -> Python; NaN/inf -> None, because json.dump would write invalid JSON for them."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, Path):
        return str(x)
    return x


def write_report(report: dict, out_dir: str | Path) -> Path:
    """Write `report` as out_dir/report.json (indent 2, dir created) and return its path.

    Non-finite floats become null. Written to a temporary file and renamed, so a reader never sees half a
    report. Raises TypeError for values JSON cannot hold.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_jsonable(report), indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def _get(report: dict, *keys: str) -> Any:
    """report[k1][k2]... or None where any level is missing or not a dict."""
    for k in keys:
        if not isinstance(report, dict):
            return None
        report = report.get(k)
    return report


def _num(x: Any, fmt: str = "{:.3f}") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return _MISSING
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return str(int(x))
    try:
        return fmt.format(x)
    except (TypeError, ValueError):
        return str(x)


def _miss_rate(report: dict) -> str:
    rate = report.get("miss_rate")
    if rate is None:
        return _MISSING
    ci = report.get("miss_rate_ci95")
    text = f"{100 * rate:.2f} %"
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and None not in ci:
        text += f" [{100 * ci[0]:.2f}, {100 * ci[1]:.2f}]"
    return text


def _column_title(report: dict, i: int) -> str:
    # Reports of the same log usually differ by decode mode; a "label" key, if present, wins.
    return str(report.get("label") or report.get("decode") or f"report {i + 1}")


def print_table(reports: list[dict], console: Console | None = None) -> Table:
    """Print one rich Table with a column per report (e.g. target-only next to speculative); returns it.

    Rows: log, decode, rate, deadline, counts, latency p50/p99/max, misses, miss rate with 95 % CI,
    fallbacks per rung (union over reports), acceptance rate, tokens per target pass, action RMSE.
    Missing or None values print as "-".
    """
    console = console or Console()
    table = Table(title="edgeinfer replay")
    table.add_column("metric", style="bold")
    for i, r in enumerate(reports):
        table.add_column(_column_title(r, i), justify="right")

    rows: list[tuple[str, Any]] = [
        ("log", lambda r: str(r.get("log") or _MISSING)),
        ("decode", lambda r: str(r.get("decode") or _MISSING)),
        ("engine", lambda r: str(r.get("engine") or _MISSING)),
        ("rate_hz", lambda r: _num(r.get("rate_hz"), "{:.1f}")),
        ("deadline_ms", lambda r: _num(r.get("deadline_ms"), "{:.2f}")),
        ("observations_sent", lambda r: _num(r.get("observations_sent"))),
        ("commands_received", lambda r: _num(r.get("commands_received"))),
        ("latency p50 ms", lambda r: _num(_get(r, "latency_ms", "p50"))),
        ("latency p99 ms", lambda r: _num(_get(r, "latency_ms", "p99"))),
        ("latency max ms", lambda r: _num(_get(r, "latency_ms", "max"))),
        ("deadline_misses", lambda r: _num(r.get("deadline_misses"))),
        ("miss_rate [95% CI]", _miss_rate),
    ]
    rungs: list[str] = []
    for r in reports:
        for rung in (r.get("fallbacks") or {}):
            if rung not in rungs:
                rungs.append(rung)
    rows += [(f"fallback {rung}", lambda r, rung=rung: _num(_get(r, "fallbacks", rung))) for rung in rungs]
    rows += [
        ("acceptance_rate", lambda r: _num(_get(r, "spec", "acceptance_rate"))),
        ("tokens_per_target_pass", lambda r: _num(_get(r, "spec", "tokens_per_target_pass"), "{:.2f}")),
        ("action_rmse_rad", lambda r: _num(_get(r, "quality", "action_rmse_rad"), "{:.4f}")),
    ]
    for label, cell in rows:
        table.add_row(label, *(cell(r) for r in reports))
    console.print(table)
    return table


def plot_latency(latencies_ms: np.ndarray, deadline_ms: float, miss_mask: np.ndarray, path: str | Path,
                 title: str) -> Path:
    """Save a two-panel PNG: latency per tick with misses in red (left), log-y histogram (right).

    latencies_ms: (N,) float ms per tick, NaN for ticks with no command (a missed one is drawn as a red x on
    the deadline line). miss_mask: (N,) bool, True where the tick missed its deadline.
    Raises ValueError if the shapes differ.
    """
    # Figure + Agg canvas directly (no pyplot): no global backend switch, no display needed, thread-safe.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    lat = np.asarray(latencies_ms, dtype=np.float64).ravel()
    miss = np.asarray(miss_mask, dtype=bool).ravel()
    if lat.shape != miss.shape:
        raise ValueError(f"latencies_ms {lat.shape} and miss_mask {miss.shape} differ")
    ticks = np.arange(lat.size)
    finite = np.isfinite(lat)

    fig = Figure(figsize=(12, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax_t, ax_h = fig.subplots(1, 2, width_ratios=[2, 1])
    ax_t.plot(ticks[finite], lat[finite], lw=0.6, color="tab:blue", label="latency")
    shown = miss & finite
    ax_t.scatter(ticks[shown], lat[shown], s=10, color="red", zorder=3, label=f"miss ({int(miss.sum())})")
    lost = miss & ~finite
    if lost.any():  # no latency to plot, but a lost command is still a miss: mark it on the deadline line
        ax_t.scatter(ticks[lost], np.full(int(lost.sum()), deadline_ms), marker="x", color="red", zorder=3,
                     label=f"lost ({int(lost.sum())})")
    ax_t.axhline(deadline_ms, color="black", ls="--", lw=1, label=f"deadline {deadline_ms:g} ms")
    ax_t.set(xlabel="tick", ylabel="latency (ms)", title="latency per tick")
    ax_t.legend(loc="upper right", fontsize="small")

    if finite.any():
        ax_h.hist(lat[finite], bins=min(100, max(10, int(finite.sum()) // 10)), color="tab:blue")
        ax_h.set_yscale("log")
    ax_h.axvline(deadline_ms, color="black", ls="--", lw=1)
    ax_h.set(xlabel="latency (ms)", ylabel="ticks", title="histogram")
    fig.suptitle(title)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
