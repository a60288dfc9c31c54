"""Rendering `edgeinfer bench fleet`'s result (edgeinfer/bench/fleet_capacity.py): the progress line of a point, the
terminal tables (rich) and the plot (matplotlib: chunk deadline attainment vs robots per configuration, both phase
patterns). Everything is computed from the result dict, never typed by hand."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from edgeinfer.bench.fleet_ladder import ATTAINMENT_BAR


def _pct(v, digits: int = 2) -> str:
    return "-" if v is None else f"{v * 100:.{digits}f}%"


def _ms(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def point_line(p: dict) -> str:
    """One line per measured point (the bench's progress)."""
    head = f"{p['config']} {p['phase']:<9} N={p['robots_requested']:<3}"
    if p.get("error"):
        return f"{head} FAILED: {p['error']}"
    figures = [f"admitted {p['robots_admitted']}",
               f"attainment worst {_pct(p['attainment_worst'])} pooled {_pct(p.get('attainment_pooled'))}",
               f"control misses worst {_pct(p['control_miss_worst'], 3)}",
               f"p99 {_ms((p.get('latency_ms') or {}).get('p99'))} ms"]
    bad = p.get("process_failures") or {}
    figures += [f"exit code {code} from {name}" for name, code in bad.items()]
    if p.get("quiet") is False:  # the CPUs were still busy when it started (bench/fleet.settle gave up)
        figures.append(f"started with the CPUs {p['cpu_busy_pct']:.0f} % busy after {p['settle_s']:.0f} s")
    return f"{head} {', '.join(figures)}: {'passes' if p.get('passed') else 'BREAKS'} ({p['seconds']:.0f} s)"


def print_result(result: dict, console: Console | None = None) -> None:
    """The points table, the headline table and the run's line."""
    console = console or Console(width=150)
    t = Table(title="fleet points: chunk attainment ('full' by the deadline; any rung: on time), latency (worst "
                    "robot's), steady-state control misses")
    for col in ("config", "phase", "N", "admitted", "attain worst", "pooled", "95 % >=", "any rung",
                "p50 ms", "p99 ms", "p99.9 ms", "ctl miss worst", "k", "batch", ""):
        t.add_column(col, justify="left" if col in ("config", "phase", "") else "right")
    for p in result["points"]:
        lat = p.get("latency_ms") or {}
        ci = p.get("attainment_pooled_ci95") or [None, None]
        t.add_row(p["config"], p["phase"], str(p["robots_requested"]), str(p["robots_admitted"]),
                  _pct(p["attainment_worst"]), _pct(p.get("attainment_pooled")), _pct(ci[0]),
                  _pct(p.get("on_time_any_pooled")), _ms(lat.get("p50")), _ms(lat.get("p99")), _ms(lat.get("p999")),
                  _pct(p.get("control_miss_worst"), 3), _hist(p.get("k_histogram")), _hist(p.get("batch_histogram")),
                  "ok" if p.get("passed") else "failed" if p.get("error") else "breaks")
    console.print(t)
    for p in result["points"]:
        if p.get("error"):
            console.print(f"{p['config']} {p['phase']} N={p['robots_requested']} failed: {p['error']}", markup=False,
                          highlight=False)
    t = Table(title=f"robots served at >= {ATTAINMENT_BAR * 100:g} % chunk attainment and <= 0.1 % control misses")
    for col in ("configuration", *result["config"]["phases"]):
        t.add_column(col, justify="left" if col == "configuration" else "right")
    for conf, heads in result["headline"].items():
        label = result["configurations"][conf]["label"]
        t.add_row(f"{conf}: {label}", *(_served(heads.get(ph)) for ph in result["config"]["phases"]))
    for top in ("d", "e"):
        if result.get(f"ratio_{top}_over_a"):
            t.add_row(f"{top} / a", *(_ratio(result[f"ratio_{top}_over_a"].get(ph))
                                      for ph in result["config"]["phases"]))
    console.print(t)
    console.print(f"{'INTERRUPTED, ' if result['interrupted'] else ''}{len(result['points'])} points, "
                  f"{result['seconds']:.0f} s; load average {result['load_average_1min']['start']:.1f} -> "
                  f"{result['load_average_1min']['end']:.1f}; plot {result['plot']}", highlight=False)


def _served(h: dict | None) -> str:
    if h is None:
        return "-"
    text = str(h["robots_served"]) + ("+" if h["capped"] else "")
    return text + (" (noisy)" if h["non_monotone"] else "")


def _ratio(r) -> str:
    return "-" if r is None else f"{r:.1f}x"


def _hist(h: dict | None) -> str:
    """The most frequent bin of a histogram {bin: count} (the whole histogram is in the JSON)."""
    if not h:
        return "-"
    top = max(h, key=h.get)
    return f"{top}: {h[top] / sum(h.values()) * 100:.0f}%"


TOP = 0.9999  # a perfect attainment is drawn here (a logit axis cannot show 1)
BOTTOM = 0.01  # and one below this (or none: no robot served) here


def write_plot(result: dict, path: Path) -> Path:
    """fleet.png at `path`: chunk deadline attainment (worst served robot) vs robots requested, log2 x axis and a
    logit y axis (90 %, 99 %, 99.9 % equally spaced), one line per configuration, solid for sync and dashed for
    staggered phases, the bar dotted. Returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(11, 4.5))
    for i, conf in enumerate(dict.fromkeys(p["config"] for p in result["points"])):
        for phase, style in (("sync", "-o"), ("staggered", "--s")):
            pts = [p for p in result["points"] if p["config"] == conf and p["phase"] == phase]
            if pts:
                ax.plot([p["robots_requested"] for p in pts],
                        [min(TOP, max(BOTTOM, p["attainment_worst"] or 0.0)) for p in pts], style, color=f"C{i}",
                        label=f"{conf}: {result['configurations'][conf]['label']} ({phase})")
    ax.axhline(ATTAINMENT_BAR, color="k", linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    ns = sorted({p["robots_requested"] for p in result["points"]})
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_yscale("logit")
    ticks = [BOTTOM, 0.5, 0.9, 0.99, ATTAINMENT_BAR, TOP]
    ax.set_yticks(ticks, [f"{t:.2%}".replace(".00%", "%") for t in ticks])
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set(xlabel="robots requested", ylim=(BOTTOM / 2, (1 + TOP) / 2),
           ylabel="chunk deadline attainment, worst robot",
           title=f"attainment vs robots (100 % drawn at {TOP:.2%}; dotted: the bar)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: it hides no point
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
