"""The figures of a fleet replay: per robot (from its record, sim/fleet_robot.py) and for the fleet.

Per robot, on the robot's own clock:
- chunk deadline attainment: the share of its requests (observations sent) whose chunk with rung "full" arrived by
  t_obs + its admitted budget, with a Clopper-Pearson 95 % interval (sim/stats.py); on_time_any: a chunk of any
  rung by then;
- latency t_obs -> the request's last chunk received (p50/p90/p99/p99.9, ms), and `lost`: requests with no chunk;
- rungs: the best rung each request got ("none": no chunk);
- control: its control loop's ticks, the start-up ticks before its first chunk, steady-state misses (a tick no chunk
  covered after that) with an interval.
The fleet: admitted, refused (with the reason), killed; worst and pooled attainment; misses; and `served`: robots
admitted, not killed, at >= SERVED_ATTAINMENT attainment and <= SERVED_MISS_RATE steady-state misses.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from edgeinfer.core.progress import say
from edgeinfer.core.wire import RUNGS
from edgeinfer.sim.stats import clopper_pearson_interval, latency_summary_ms

SERVED_ATTAINMENT = 0.999  # the fleet's headline bar: >= 99.9 % chunk attainment
SERVED_MISS_RATE = 0.001  # and <= 0.1 % steady-state control misses
_NO_RUNG = 127


def robot_figures(scalars: dict, arrays: dict[str, np.ndarray]) -> dict:
    """One robot's figures (see the module docstring) from fleet_robot.RobotClient.record()'s (scalars, arrays)."""
    adm = scalars["admission"]
    out = {"log": scalars["log"], "killed": False, "state": scalars["state"],
           "admitted": None if adm is None else adm["admitted"],
           "admission": None if adm is None else {"budget_ms": adm["budget_ns"] / 1e6, "batch": adm["batch"],
                                                  "chunk_ms": adm["chunk_ns"] / 1e6, "reason": adm["reason"]},
           "stopped_by_runtime": scalars["stop_reason"], "counts": scalars["counts"]}
    if not (adm and adm["admitted"]):
        return out
    sent = (arrays["req_t_sent_ns"] != 0) & ~arrays["req_skipped"]
    seq, t_obs = arrays["req_seq"][sent], arrays["req_t_sched_ns"][sent]
    deadline = t_obs + adm["budget_ns"]
    c_seq, c_recv, c_rung = arrays["chunk_obs_seq"], arrays["chunk_t_recv_ns"], arrays["chunk_rung"].astype(np.int64)
    i = np.minimum(np.searchsorted(seq, c_seq), max(len(seq) - 1, 0))
    mine = seq[i] == c_seq if len(seq) else np.zeros(len(c_seq), dtype=bool)  # chunks of its own requests
    i, c_recv, c_rung = i[mine], c_recv[mine], c_rung[mine]
    on_time = c_recv <= deadline[i]
    full = np.zeros(len(seq), dtype=bool)
    full[i[on_time & (c_rung == 0)]] = True
    any_rung = np.zeros(len(seq), dtype=bool)
    any_rung[i[on_time]] = True
    best = np.full(len(seq), _NO_RUNG)
    np.minimum.at(best, i, c_rung)
    last = np.zeros(len(seq), dtype=np.int64)
    np.maximum.at(last, i, c_recv)
    got = best != _NO_RUNG
    n, k = len(seq), int(full.sum())
    rungs = {RUNGS[r]: int(np.sum(best == r)) for r in np.unique(best[got])}
    control = scalars["control"]
    misses, steady = control["misses"], control["steady_ticks"]
    send_err = arrays["req_t_sent_ns"][sent] - t_obs
    return out | {
        "requests": n, "skipped": int(arrays["req_skipped"].sum()), "attained": k,
        "attainment": k / n if n else None, "attainment_ci95": list(clopper_pearson_interval(k, n)),
        "on_time_any": int(any_rung.sum()), "on_time_any_rate": float(any_rung.mean()) if n else None,
        "rungs": rungs | {"none": int(np.sum(~got))}, "lost": int(np.sum(~got)),
        "latency_ms": latency_summary_ms(np.where(got, last - t_obs, np.nan)),
        "send_error_us": {key: (v * 1e3 if v is not None else None)
                          for key, v in latency_summary_ms(send_err).items()},
        "control": control | {"miss_rate": misses / steady if steady else None,
                              "miss_rate_ci95": list(clopper_pearson_interval(misses, steady))},
        "chunks_received": int(len(arrays["chunk_obs_seq"])), "chunks_other_robot": int(np.sum(~mine))}


def served(fig: dict) -> bool:
    """Admitted, not killed, with attainment and steady-state misses within the headline bars."""
    if not fig.get("admitted") or fig["killed"] or not fig.get("requests"):
        return False
    rate = fig["control"]["miss_rate"]
    return fig["attainment"] >= SERVED_ATTAINMENT and (rate or 0.0) <= SERVED_MISS_RATE


def fleet_summary(robots: dict[str, dict]) -> dict:
    """The fleet's figures from every robot's (robot_figures, or {"killed": True, ...} for a robot whose process was
    killed)."""
    live = {n: f for n, f in robots.items() if f.get("admitted") and not f["killed"] and f.get("requests")}
    k = sum(f["attained"] for f in live.values())
    n = sum(f["requests"] for f in live.values())
    misses = sum(f["control"]["misses"] for f in live.values())
    steady = sum(f["control"]["steady_ticks"] for f in live.values())
    rates = [f["control"]["miss_rate"] for f in live.values() if f["control"]["miss_rate"] is not None]
    admitted = sum(bool(f.get("admitted")) for f in robots.values())
    return {"robots": len(robots), "admitted": admitted,
            "refused": {name: f["admission"]["reason"] for name, f in robots.items() if f.get("admitted") is False},
            "unanswered": sorted(n_ for n_, f in robots.items() if f.get("admitted") is None and not f["killed"]),
            "killed": sorted(name for name, f in robots.items() if f["killed"]),
            "worst_attainment": min((f["attainment"] for f in live.values()), default=None),
            "pooled_attainment": k / n if n else None, "pooled_attainment_ci95": list(clopper_pearson_interval(k, n)),
            "requests": n, "misses": misses, "steady_ticks": steady,
            "worst_miss_rate": max(rates, default=None), "pooled_miss_rate": misses / steady if steady else None,
            "served": sum(served(f) for f in robots.values()),
            "all_served": admitted > 0 and sum(served(f) for f in live.values()) == admitted}


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.2f}"


def _ms(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def print_fleet(report: dict, console: Console) -> None:
    """The per-robot table and the fleet summary line."""
    table = Table(title=f"fleet replay: {report['config']['robots']} robots, phase {report['config']['phase']} "
                        "(full/any %: chunks by their deadline; latency ms; control misses / steady ticks)")
    for col in ("robot", "adm", "req", "full %", "any %", "p50", "p99", "p99.9", "miss", "ticks"):
        table.add_column(col, justify="left" if col in ("robot", "adm") else "right", no_wrap=True)
    for name, f in report["robots"].items():
        if f["killed"] or not f.get("admitted"):
            why = "killed" if f["killed"] else ("refused" if f.get("admitted") is False else "no answer")
            table.add_row(name, why, *["-"] * 8)
            continue
        lat, ctl = f["latency_ms"], f["control"]
        table.add_row(name, "yes", str(f["requests"]), _pct(f["attainment"]), _pct(f["on_time_any_rate"]),
                      _ms(lat["p50"]), _ms(lat["p99"]), _ms(lat["p999"]), str(ctl["misses"]), str(ctl["steady_ticks"]))
    console.print(table)
    s = report["fleet"]
    for name, reason in s["refused"].items():
        say(console, f"{name} {reason}")
    console.print(f"fleet: {s['admitted']}/{s['robots']} admitted, {len(s['refused'])} refused, "
                  f"{len(s['killed'])} killed; attainment worst {_pct(s['worst_attainment'])} %, pooled "
                  f"{_pct(s['pooled_attainment'])} %; misses {s['misses']}/{s['steady_ticks']} ticks; "
                  f"served at the bar (>= 99.9 % attainment, <= 0.1 % misses) {s['served']}")


def write_plot(report: dict, path: Path) -> None:
    """fleet.png: attainment (full and any rung) and latency p50/p99/p99.9 per admitted robot."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = [(n, f) for n, f in report["robots"].items() if f.get("admitted") and not f["killed"] and f.get("requests")]
    fig = Figure(figsize=(max(6.0, 0.4 * len(rows) + 3), 6), layout="constrained")
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    x = np.arange(len(rows))
    ax1.bar(x - 0.2, [100 * f["attainment"] for _, f in rows], 0.4, label="full by deadline")
    ax1.bar(x + 0.2, [100 * f["on_time_any_rate"] for _, f in rows], 0.4, label="any rung by deadline")
    ax1.axhline(100 * SERVED_ATTAINMENT, color="k", lw=0.8, ls="--")
    low = min((100 * min(f["attainment"], f["on_time_any_rate"]) for _, f in rows), default=100.0)
    ax1.set_ylim(max(0.0, 5 * (low // 5) - 5), 100.5)  # zoomed: 97 % and 100 % must look different
    ax1.set_ylabel("chunk attainment, %")
    ax1.legend(loc="lower left")
    for key, marker in (("p50", "o"), ("p99", "^"), ("p999", "v")):
        ax2.plot(x, [f["latency_ms"][key] if f["latency_ms"][key] is not None else np.nan for _, f in rows],
                 marker, label=key)
    budgets = [f["admission"]["budget_ms"] for _, f in rows]
    ax2.plot(x, budgets, "_", color="k", markersize=14, label="budget")
    ax2.set_ylabel("t_obs -> chunk received, ms")
    ax2.set_xticks(x, [n for n, _ in rows], rotation=60, ha="right")
    ax2.legend(loc="upper left")
    fig.savefig(path, dpi=100)
