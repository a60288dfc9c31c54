"""The replay's three PNGs: latency histogram, latency over time with misses and rungs, per-stage breakdown.

Each function takes per-observation arrays (sim.metrics.summarize's second result) and writes one PNG with
matplotlib's Agg canvas directly (no pyplot: no global backend switch, no display, safe in threads).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from edgeinfer.core.wire import RUNGS

_RUNG_COLOURS = {"full": "tab:green", "coarse": "tab:cyan", "partial": "tab:olive", "draft": "tab:orange",
                 "continue": "tab:purple", "hold": "tab:red", "": "black"}
PLOT_FILES = ("latency_histogram.png", "latency.png", "stages.png")  # latency.png: latency over time


def _figure(size):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _plain_log_y(ax) -> None:
    """Log y axis labelled 1, 2, 5, 10, 20, ... (not 10^0), so that a range under a decade still has labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _bin_width_us(span_us: float, max_bins: int = 400) -> float:
    """1 us (cyclictest's bin) while the span holds at most max_bins of them, else the next 1-2-5 width."""
    for decade in (1, 10, 100, 1_000, 10_000, 100_000):
        for m in (1, 2, 5):
            if span_us / (m * decade) <= max_bins:
                return float(m * decade)
    return span_us / max_bins


def _save(fig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def plot_histogram(latency_ms: np.ndarray, deadline_ms: float, path, title: str) -> Path:
    """Latency histogram (cyclictest style): counts on a log y axis, 1 us bins while the range spans at most
    400 us (1-2-5 wider bins beyond, the width in the legend), the deadline and p50/p99 marked, lost commands
    counted in the legend. latency_ms: (N,) float ms, NaN = no command. Returns the PNG's path."""
    lat = np.asarray(latency_ms, dtype=np.float64).ravel()
    finite = lat[np.isfinite(lat)]
    fig = _figure((9, 4.5))
    ax = fig.subplots()
    if finite.size:
        lo_us, hi_us = np.floor(finite.min() * 1e3), np.ceil(finite.max() * 1e3) + 1
        width_us = _bin_width_us(hi_us - lo_us)
        lo_us = np.floor(lo_us / width_us) * width_us
        edges_ms = np.arange(lo_us, hi_us + width_us, width_us) / 1e3
        counts, _ = np.histogram(finite, bins=edges_ms)
        ax.stairs(counts, edges_ms, fill=True, color="tab:blue", label=f"{finite.size} ticks, {width_us:g} us bins")
        _plain_log_y(ax)
        for q, ls in ((50, ":"), (99, "-.")):
            v = float(np.percentile(finite, q))
            ax.axvline(v, color="tab:gray", ls=ls, lw=1, label=f"p{q} {v:.3f} ms")
    lost = int(lat.size - finite.size)
    ax.axvline(deadline_ms, color="black", ls="--", lw=1, label=f"deadline {deadline_ms:g} ms")
    if lost:
        ax.plot([], [], " ", label=f"lost (no command): {lost}")
    ax.set(xlabel="latency, observation due -> command received (ms)", ylabel="ticks", title=title)
    ax.legend(loc="upper right", fontsize="small")
    return _save(fig, path)


def plot_timeline(t_s: np.ndarray, latency_ms: np.ndarray, miss: np.ndarray, rung: np.ndarray,
                  deadline_ms: float, path, title: str, spans: list | None = None) -> Path:
    """Latency over time (top; log y) with misses in red and lost commands as red x on the deadline, and the
    rung of every tick's command (bottom strip; "none" = no command). All inputs (N,): t_s seconds since the
    first observation was due, latency_ms (NaN = lost), miss bool, rung str. spans: injected runtime faults
    as (t_from_s, t_to_s, label), shaded on both panels. Raises ValueError if the shapes differ. Returns the
    PNG's path."""
    t = np.asarray(t_s, dtype=np.float64).ravel()
    lat = np.asarray(latency_ms, dtype=np.float64).ravel()
    miss = np.asarray(miss, dtype=bool).ravel()
    rung = np.asarray(rung, dtype=object).ravel()
    if not t.shape == lat.shape == miss.shape == rung.shape:
        raise ValueError(f"t_s {t.shape}, latency_ms {lat.shape}, miss {miss.shape}, rung {rung.shape} differ")
    finite = np.isfinite(lat)
    fig = _figure((12, 5.5))
    ax, ax_r = fig.subplots(2, 1, sharex=True, height_ratios=[4, 1])
    ax.plot(t[finite], lat[finite], lw=0.6, color="tab:blue", label="latency")
    shown = miss & finite
    ax.scatter(t[shown], lat[shown], s=10, color="red", zorder=3, label=f"miss ({int(miss.sum())})")
    lost = ~finite
    if lost.any():
        ax.scatter(t[lost], np.full(int(lost.sum()), deadline_ms), marker="x", color="red", zorder=3,
                   label=f"lost ({int(lost.sum())})")
    ax.axhline(deadline_ms, color="black", ls="--", lw=1, label=f"deadline {deadline_ms:g} ms")
    for (t_from, t_to, label), colour in zip(spans or [], ("tab:orange", "tab:gray", "tab:cyan")):
        for a in (ax, ax_r):  # at least 2 ms wide, so that a short stall stays visible on a long run
            a.axvspan(t_from, max(t_to, t_from + 0.002), color=colour, alpha=0.25, lw=0,
                      label=label if a is ax else None)
    if finite.any():
        _plain_log_y(ax)
    ax.set(ylabel="latency (ms)", title=title)
    ax.legend(loc="upper right", fontsize="small")
    names = [r for r in RUNGS if np.any(rung == r)] + (["none"] if np.any(rung == "") else [])
    for row, name in enumerate(names):
        sel = rung == ("" if name == "none" else name)
        ax_r.scatter(t[sel], np.full(int(sel.sum()), row), marker="|", s=60,
                     color=_RUNG_COLOURS.get("" if name == "none" else name, "black"))
    ax_r.set_yticks(range(len(names)), names)
    ax_r.set_ylim(-0.5, len(names) - 0.5)
    ax_r.set(xlabel="time since the first observation was due (s)", ylabel="rung")
    return _save(fig, path)


def plot_stages(stages_ms: dict[str, np.ndarray], descriptions: dict[str, str], unmeasured: tuple[str, ...],
                path, title: str) -> Path:
    """Per-stage breakdown: one horizontal box (p1..p99 whiskers) per stage on a log time axis, with its
    p50/p99/max. stages_ms: {stage: (N,) float ms, NaN = not measured for that observation}; a stage with
    no finite value is left out and named in the note with `unmeasured` (stages no message timestamps).
    descriptions: {stage: what it spans}. Returns the PNG's path."""
    shown = {k: v[np.isfinite(v)] for k, v in ((k, np.asarray(v, dtype=np.float64)) for k, v in stages_ms.items())}
    missing = [k for k, v in shown.items() if v.size == 0] + list(unmeasured)
    shown = {k: v for k, v in shown.items() if v.size}
    fig = _figure((11, 1.2 + 0.8 * max(1, len(shown))))
    ax = fig.subplots()
    names = list(shown)[::-1]  # first stage on top
    if names:
        # A log axis cannot show <= 0 (a command received within the clock's resolution): clip to 1 us.
        data = [np.clip(shown[k], 1e-3, None) for k in names]
        ax.boxplot(data, orientation="horizontal", whis=(1, 99), showfliers=True, widths=0.6,
                   flierprops={"markersize": 2, "alpha": 0.4})
        ax.set_yticks(range(1, len(names) + 1), [
            f"{k}: {descriptions.get(k, '')}\np50 {np.percentile(v, 50):.3f}  p99 {np.percentile(v, 99):.3f}  "
            f"max {v.max():.3f} ms (n={v.size})" for k, v in ((k, shown[k]) for k in names)], fontsize="small")
        ax.set_xscale("log")
    ax.set(xlabel="time (ms, log; whiskers p1..p99)", title=title)
    if missing:
        ax.plot([], [], " ", label="not measured: " + ", ".join(missing))
        ax.legend(loc="lower right", fontsize="small")
    return _save(fig, path)


def write_plots(report: dict, per_obs: dict, out_dir) -> list[Path]:
    """The three PNGs (PLOT_FILES) under out_dir from sim.metrics.summarize's (report, per-observation
    arrays). Returns their paths."""
    from edgeinfer.sim.metrics import STAGES, UNMEASURED_STAGES

    out_dir = Path(out_dir)
    title = f"{report.get('log')} ({report.get('decode')})"
    deadline_ms = float(report["deadline_ms"])
    lat = per_obs["latency_ms"]
    miss = np.asarray(per_obs["outcome"]) != "on_time"
    t_s = np.asarray(per_obs["t_s"])
    spans = []
    if (stall := report.get("runtime_stall")) and stall["stalled_at_row"] < len(t_s):
        t = float(t_s[stall["stalled_at_row"]])
        spans.append((t, t + stall["stopped_ms"] / 1e3, f"runtime stalled {stall['stopped_ms']:.1f} ms"))
    if (kill := report.get("runtime_fault")) and kill["killed_at_row"] < len(t_s):
        t = float(t_s[kill["killed_at_row"]])
        restart = kill.get("restart_after_ms")
        spans.append((t, t + (restart / 1e3 if restart is not None else 0.0), "runtime killed"
                      + (f", restarted after {restart:.0f} ms" if restart is not None else "")))
    return [plot_histogram(lat, deadline_ms, out_dir / PLOT_FILES[0], title),
            plot_timeline(t_s, lat, miss, per_obs["rung"], deadline_ms, out_dir / PLOT_FILES[1], title, spans),
            plot_stages(per_obs["stages_ms"], STAGES, UNMEASURED_STAGES, out_dir / PLOT_FILES[2],
                        f"{title}: per-stage times")]
