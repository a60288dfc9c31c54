"""Rendering a bench result (edgeinfer.bench.suite): the terminal table (rich), the markdown table of
benchmarks/results/README.md, and the comparison with a base result. Everything is computed from the JSON, never
typed by hand."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from edgeinfer.bench.figures import compare
from edgeinfer.core.progress import say

HEAD = ("ruler", "scenario", "stat", "target-only", "speculative", "spec / target-only", "vs floor (t-o, spec)")
FLOOR_HEAD = ("floor", "p50", "p95", "p99", "p99.9", "max")
_STAT = {"p999": "p99.9"}


def percentile_us(samples_ns, q: float) -> float:
    """The q-th percentile of durations in ns, in us, rounded to 0.01 us."""
    return round(float(np.percentile(samples_ns, q)) / 1e3, 2)


def check_output(path: Path | None, option: str = "--json") -> None:
    """Before a long run: make `path`'s folder and check that the file can be written, so that a typo costs
    nothing. Raises ValueError naming the option and the path."""
    if path is None:
        return
    path = Path(path)
    try:
        if path.is_dir():
            raise IsADirectoryError(f"{path} is a folder")
        path.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(path if path.exists() else path.parent, os.W_OK):
            raise PermissionError(f"no write permission for {path if path.exists() else path.parent}")
    except OSError as e:
        raise ValueError(f"{option} {path}: cannot be written ({e})") from None


def fmt(value, unit: str) -> str:
    """A figure's value as text in its unit (ms, chunks/s, passes, fraction, rad -> mrad)."""
    if value is None:
        return "-"
    if unit == "fraction":
        return f"{value * 100:.2f} %"
    if unit == "rad":
        return f"{value * 1e3:.3f} mrad"
    if unit == "ms" and abs(value) < 0.1:
        unit, value = "us", value * 1e3
    a = abs(value)
    text = f"{value:.0f}" if a >= 100 else f"{value:.1f}" if a >= 10 else f"{value:.2f}" if a >= 1 else f"{value:.3f}"
    return text if unit in ("passes",) else f"{text} {unit}"


def _ratio(r) -> str:
    return "-" if r is None else f"{r:.2f}x"


def _with_ci(f: dict) -> str:
    text = fmt(f["value"], f["unit"])
    if f["ruler"] == "deadline miss rate" and f["ci95"]:
        text += f" ({f['misses']}/{f['observations']}; 95 % <= {f['ci95'][1] * 100:.2f} %)"
    return text


def rows(result: dict) -> tuple[list[list[str]], list[list[str]]]:
    """(main rows, floor rows) as text cells, in the order the figures were measured."""
    by_key: dict[tuple, dict] = {}
    floors: dict[str, dict] = {}
    for f in result["figures"]:
        if f["decode"] == "floor":
            floors.setdefault(f["ruler"], {})[f["stat"]] = f
        else:
            by_key.setdefault((f["ruler"], f["scenario"], f["stat"]), {})[f["decode"]] = f
    main = []
    for (ruler, scenario, stat), pair in by_key.items():
        t, s = pair.get("target-only"), pair.get("speculative")
        floor = "-" if not (t and t["vs_floor"] is not None) else (
            f"{_ratio(t['vs_floor'])}, {_ratio(s['vs_floor']) if s else '-'}")
        main.append([ruler, scenario, _STAT.get(stat, stat), _with_ci(t) if t else "-", _with_ci(s) if s else "-",
                     _ratio(s["vs_target_only"]) if s else "-", floor])
    floor_rows = [[ruler, *(fmt(stats[k]["value"], stats[k]["unit"]) if k in stats else "-"
                            for k in ("p50", "p95", "p99", "p999", "max"))] for ruler, stats in floors.items()]
    return main, floor_rows


def machine_line(result: dict) -> str:
    m = result["machine"]
    gpu = f"GPU {m['gpu']} (sm {m['gpu_capability']})" if m.get("gpu") else "no GPU"
    return (f"{m['cpu']}, {m['cores']} cores, {gpu}; Python {m['python']}, torch {m['torch']}, "
            f"onnxruntime {m.get('onnxruntime')}, pyzmq {m.get('pyzmq')} (libzmq {m.get('libzmq')}), "
            f"numpy {m['numpy']}")


def setup_line(result: dict) -> str:
    e, sc, d = result["engine"], result["scenarios"], result["data"]
    return (f"engine {e['backend']} {e['precision']} {e['device']} ({e['threads']} thread(s)); "
            f"{sc['repeats']} repeats (median quoted), seed {sc['seed']}, {sc['decode']['observations']} "
            f"observations in-process; logs {', '.join(d['logs'])} ({d['source']}); "
            f"scenarios {Path(sc['source']).name}; {result['seconds']} s; edgeinfer {_commit(result)}{_load(result)}")


def _load(result: dict) -> str:
    load = result.get("load_average_1min")
    if not load:
        return ""
    return f"; 1-min load average {load['start']:.1f} at the start, {load['end']:.1f} at the end"


def _commit(result: dict) -> str:
    src = result.get("source") or {}
    if not src.get("commit"):
        return "(not a git checkout)"
    return src["commit"][:10] + (" + uncommitted changes" if src.get("dirty") else "")


def print_result(result: dict, console: Console | None = None) -> None:
    """The figures as two rich tables (rulers, floors), then the machine, set-up and any scenario errors."""
    console = console or Console()
    main, floor_rows = rows(result)
    t = Table(title="edgeinfer bench")
    for h in HEAD:
        t.add_column(h, justify="left" if h in ("ruler", "scenario", "stat") else "right")
    for r in main:
        t.add_row(*r)
    console.print(t)
    ft = Table(title="floors (same machine, same run)")
    for h in FLOOR_HEAD:
        ft.add_column(h, justify="left" if h == "floor" else "right")
    for r in floor_rows:
        ft.add_row(*r)
    console.print(ft)
    console.print(f"machine: {machine_line(result)}\n{setup_line(result)}", highlight=False, markup=False)
    for name, scen in result.get("e2e", {}).items():
        if scen.get("error"):
            say(console, f"scenario {name}: {scen['error']}", "red")


def markdown(result: dict) -> str:
    """The result as markdown: the rulers table, the floors table, machine, set-up and command line."""
    main, floor_rows = rows(result)

    def table(head, body, n_left):
        align = "|" + "|".join("---" if i < n_left else "--:" for i in range(len(head))) + "|"
        return ["| " + " | ".join(head) + " |", align, *("| " + " | ".join(r) + " |" for r in body)]

    errors = [f"- scenario `{n}` not measured: {s['error']}" for n, s in result.get("e2e", {}).items()
              if s.get("error")]
    return "\n".join([*table(HEAD, main, 3), "", *table(FLOOR_HEAD, floor_rows, 1), "",
                      f"Machine: {machine_line(result)}.", "",
                      f"Set-up: {setup_line(result)}.", "",
                      f"Command: `{' '.join(result['command'])}`", *([""] + errors if errors else [])]) + "\n"


def print_compare(base: dict, new: dict, tolerance: float, console: Console | None = None) -> str:
    """Print new / base per figure and the verdict (see bench_figures.compare); returns the verdict."""
    console = console or Console()
    cmp_rows, verdict = compare(base, new, tolerance)
    t = Table(title=f"new / base (tolerance {tolerance:.0%}; intervals: ci95, else the spread over repeats)")
    for h in ("figure", "base", "new", "new / base", "verdict"):
        t.add_column(h, justify="left" if h in ("figure", "verdict") else "right")
    style = {"regression": "[red]", "improved": "[green]"}
    for r in cmp_rows:
        t.add_row(r["id"], fmt(r["base"], r["unit"]), fmt(r["new"], r["unit"]), _ratio(r["ratio"]),
                  style.get(r["verdict"], "") + r["verdict"])
    console.print(t)
    console.print(f"base machine: {machine_line(base)}\nnew machine:  {machine_line(new)}", highlight=False,
                  markup=False)
    n_reg = sum(r["verdict"] == "regression" for r in cmp_rows)
    console.print(f"verdict: {'REGRESSION' if verdict == 'regression' else 'ok'} ({n_reg} of {len(cmp_rows)} "
                  "figures regressed)", highlight=False)
    return verdict
