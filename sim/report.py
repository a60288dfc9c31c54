"""Replay reports: report.json on disk and a side-by-side terminal table (the plots are in sim.plots).

The report dict ("edgeinfer.replay/1", schema_version in sim.metrics) is built elsewhere; these functions
only read it, and tolerate extra keys, older versions and None wherever a value could not be measured (no
speculative decoding, no ground truth, a run too short for an interval, ...).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from edgeinfer.core.progress import say

SCHEMA = "edgeinfer.replay/1"
_MISSING = "-"


@contextlib.contextmanager
def replay_progress(console: Console, total: int, label: str):
    """A rich progress bar over `total` observations while the block runs; yields progress(i), to be called
    every few hundred observations with the index just sent (it redraws at once: no refresh thread wakes
    up during the replay, and a redraw costs ~0.1 ms). The bar is removed when the block ends."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=console, auto_refresh=False, transient=True) as bar:
        task = bar.add_task(label, total=total)

        def progress(i: int) -> None:
            bar.update(task, completed=i + 1)
            bar.refresh()
        progress(-1)
        yield progress


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


def engine_choice_section(report: dict, runtime_stats) -> dict | None:
    """The report's "engine_choice" (None unless the runtime ran backend auto), from the counters of its newest
    Stats (engines/backends/auto.py choice_from_counters): chosen, statistic, start_up_ms, probes, candidates {name:
    {chunk_ms_p50, chunk_ms_p90, exact, mismatched_tokens}}, excluded {name: why}. The "engine" headline then names
    the chosen backend."""
    from edgeinfer.engines.backends.auto import choice_from_counters

    choice = choice_from_counters(runtime_stats.counters) if runtime_stats is not None else None
    if choice is not None and isinstance(report.get("engine"), str):
        report["engine"] = report["engine"].replace("auto", f"{choice['chosen']} (auto)", 1)
    describe_decode(report, choice)
    return choice


def describe_decode(report: dict, choice: dict | None = None) -> None:
    """Make report's "decode" say what ran, not only what was asked for, when speculative decoding was asked for
    and most chunks drafted nothing (adaptive speculation turned itself off, or auto measured target-only as
    faster): "speculative requested, ran target-only in 396 of 400 chunks (auto: ...; adaptive: ...)". Then
    spec.acceptance_rate is measured on the few drafts of the others (the adaptive planner's probes): it is
    kept, and spec.acceptance_from says so (the table shows it with its draft count, or not at all). choice:
    engine_choice (None: not backend auto)."""
    spec, chunks = report.get("spec") or {}, _get(report, "chunks", "received")
    with_drafts = spec.get("speculative_chunks")
    if report.get("decode") != "speculative" or not isinstance(with_drafts, int) or not chunks:
        return
    spec["acceptance_from"] = f"{spec.get('drafted')} drafts in {with_drafts} of {chunks} chunks"
    in_chunks = f"{with_drafts} chunk{'' if with_drafts == 1 else 's'}"
    if 2 * with_drafts >= chunks:
        return  # speculative in most chunks: "speculative" says what ran
    why = []
    if choice is not None and (choice.get("candidates") or {}).get(choice.get("chosen"), {}).get("k") == 0:
        why.append(f"auto: target-only was faster on {choice['chosen']} at start-up")
    why.append("adaptive: speculation off" + (f"; drafts in {in_chunks}, its probes" if with_drafts else ""))
    report["decode_requested"] = "speculative"
    report["decode"] = (f"speculative requested, ran target-only in {chunks - with_drafts} of {chunks} chunks "
                        f"({'; '.join(why)})")
    spec["acceptance_from"] = f"probes only: {spec.get('drafted')} drafts in {in_chunks}"


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


def _latency(report: dict, key: str) -> str:
    """"1.234 [1.1, 1.3]": the percentile with its 95 % interval when the report has one."""
    text = _num(_get(report, "latency_ms", key))
    ci = _get(report, "latency_ci95_ms", key)
    if text != _MISSING and isinstance(ci, (list, tuple)) and len(ci) == 2 and None not in ci:
        text += f" [{ci[0]:.3f}, {ci[1]:.3f}]"
    return text


def _chunk_rungs(report: dict) -> str:
    """The chunks received per rung, e.g. "full 186, partial 2" ("-" without them)."""
    rungs = _get(report, "chunks", "rungs")
    if not isinstance(rungs, dict) or not rungs:
        return _MISSING
    return ", ".join(f"{rung} {n}" for rung, n in rungs.items())


def _slo(report: dict) -> str:
    slo = report.get("slo")
    if not isinstance(slo, dict):
        return _MISSING
    colour = "green" if slo.get("verdict") == "VALID" else "red"
    return f"[{colour}]{slo.get('verdict')}[/{colour}] ({slo.get('objective')})"


def _slo_rows(reports: list[dict]) -> list[tuple[str, Any]]:
    """One row per objective term (union over reports): "VALID" or "INVALID: reason"."""
    terms: list[str] = []
    for r in reports:
        for t in _get(r, "slo", "terms") or []:
            if t.get("term") not in terms:
                terms.append(t.get("term"))

    def cell(r, term):
        t = next((t for t in _get(r, "slo", "terms") or [] if t.get("term") == term), None)
        return _MISSING if t is None else f"{t.get('verdict')}: {t.get('reason')}"
    return [(f"  slo {term}", lambda r, term=term: cell(r, term)) for term in terms]


def _miss_rate(report: dict) -> str:
    rate = report.get("miss_rate")
    if rate is None:
        return _MISSING
    ci = report.get("miss_rate_ci95")
    text = f"{100 * rate:.2f} %"
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and None not in ci:
        text += f" [{100 * ci[0]:.2f}, {100 * ci[1]:.2f}]"
    if scope := report.get("miss_rate_scope"):  # which ticks the headline holds: see sim/metrics.py
        text += f" {scope}"
    return text


def _start_up(report: dict) -> str:
    """The pre-roll's misses over its ticks and length, e.g. "50 / 50 ticks (200 ms)"; "no pre-roll" without one."""
    su = report.get("start_up")
    if not isinstance(su, dict):
        return _MISSING
    if not su.get("pre_roll_ticks"):
        return "no pre-roll"
    return f"{su.get('deadline_misses')} / {su['pre_roll_ticks']} ticks ({_num(su.get('pre_roll_ms'), '{:.0f}')} ms)"


def _host(report: dict) -> str:
    """CPU model, CPUs, governor and load average in one cell."""
    h = report.get("host")
    if not isinstance(h, dict):
        return _MISSING
    load = "/".join(f"{x:.2f}" for x in h.get("load_average") or [])
    return f"{h.get('cpu_model')}, {h.get('cpus')} CPUs, governor {h.get('governor')}, load {load or _MISSING}"


def _wakeup(report: dict) -> str:
    """The wake-up baseline: p50 / p99 / max us over n sleeps."""
    w = _get(report, "host", "wakeup_latency_us")
    if not isinstance(w, dict):
        return _MISSING
    return f"{w.get('p50'):.0f} / {w.get('p99'):.0f} / {w.get('max'):.0f} (n={w.get('n')})"


def _realtime(report: dict) -> str:
    """Per process: its scheduler and priority, and a niceness other than 0, e.g. "replayer FIFO 70, control OTHER 0
    (60 refused), runtime OTHER 0 nice 10"."""
    rt = _get(report, "host", "realtime")
    if not isinstance(rt, dict):
        return _MISSING

    def one(name: str, st: dict) -> str:
        got = f"{str(st.get('policy')).removeprefix('SCHED_')} {st.get('priority')}"
        nice = f" nice {st['nice']}" if st.get("nice") else ""  # absent from reports before it was recorded
        return f"{name} {got}{nice}" + (f" ({st['requested']} refused)" if st.get("granted") is False else "")
    return ", ".join(one(name, st) for name, st in rt.items() if isinstance(st, dict))


def _injected(report: dict) -> str:
    """The faults injected, in one cell: network counts per kind, the runtime stall and kill ("-": none)."""
    inj = report.get("injected")
    if not isinstance(inj, dict):
        return _MISSING
    parts = [f"{kind} {n}" for kind, n in ((_get(inj, "network", "counts") or {}).items()) if n]
    if isinstance(stall := inj.get("runtime_stall"), dict):
        took = stall.get("stopped_ms")
        parts.append(f"stall {took:.1f} ms @row {stall.get('done_at_row')}" if took is not None
                     else f"stall asked @row {stall.get('at_row')}, not done")
    if isinstance(kill := inj.get("runtime_kill"), dict):
        restart = ""
        if kill.get("restarted"):  # whether the new runtime served before the end (runtime_fault.recovered)
            gap = report.get("runtime_fault") or {}
            restart = (f" + restart, recovered in {gap['time_to_recover_ms']:.0f} ms" if gap.get("recovered")
                       else " + restart: NOT recovered before the end of the run (runtime.restarted.log)")
        parts.append(f"kill @row {kill.get('done_at_row')}{restart}")
    if inj.get("garbage_per_row"):
        parts.append(f"garbage {inj['garbage_per_row']}/row")
    return ", ".join(parts) or "none"


def _column_title(report: dict, i: int) -> str:
    # Reports of the same log usually differ by decode mode; a "label" key, if present, wins.
    ran = "speculative (ran target-only)" if report.get("decode_requested") else report.get("decode")
    return str(report.get("label") or ran or f"report {i + 1}")


def _mrad(x: Any) -> Any:
    return x * 1e3 if isinstance(x, (int, float)) else x


def print_table(reports: list[dict], console: Console | None = None, title: str = "edgeinfer replay") -> Table:
    """Print one rich Table with a column per report (e.g. target-only next to speculative); returns it.

    Rows: log, decode, rate, deadline, counts, latency p50/p90/p99/p999 with 95 % CIs and max, misses, miss
    rate with its 95 % CI and scope (steady state, start-up included, whole run), time to first command, the
    pre-roll's misses, the SLO verdict and one row per objective, ticks served per rung (union over reports),
    chunks per rung, acceptance rate, tokens per target pass, action RMSE, the safety section (commands outside the
    limits, commands clamped, the joints the log takes outside the limits), the host (CPU, governor, load, wake-up
    baseline, real-time grants). Missing or None values print as "-". Then each report's safety warnings, one line each.
    """
    console = console or Console()
    table = Table(title=title)
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
        *((f"latency {k} ms [95% CI]", lambda r, k=k: _latency(r, k)) for k in ("p50", "p90", "p99", "p999")),
        ("latency max ms", lambda r: _num(_get(r, "latency_ms", "max"))),
        ("deadline_misses", lambda r: _num(r.get("deadline_misses"))),
        ("miss_rate [95% CI]", _miss_rate),
        *((f"time to first action {k} ms", lambda r, k=k: _num(_get(r, "chunks", "time_to_first_action_ms", k)))
          for k in ("p50", "p99")),
        ("time to first command ms", lambda r: _num(_get(r, "start_up", "time_to_first_command_ms"))),
        ("start-up misses (pre-roll)", _start_up),
        ("chunk boundary jump p99 mrad", lambda r: _num(_mrad(_get(r, "boundaries", "raw_jump_rad", "p99")), "{:.2f}")),
        ("slo", _slo),
        *_slo_rows(reports),
        ("injected", _injected),
    ]
    rungs: list[str] = []
    for r in reports:
        for rung in (r.get("fallbacks") or {}):
            if rung not in rungs:
                rungs.append(rung)
    # ticks by the rung of the chunk that served them (an early first step serves as partial or coarse: docs/replay.md)
    rows += [(f"ticks served by {rung}", lambda r, rung=rung: _num(_get(r, "fallbacks", rung))) for rung in rungs]
    rows.append(("chunks by rung", _chunk_rungs))
    rows += [
        ("acceptance_rate", _acceptance),
        ("tokens_per_target_pass", lambda r: _num(_get(r, "spec", "tokens_per_target_pass"), "{:.2f}")),
        ("action_rmse_rad", lambda r: _num(_get(r, "quality", "action_rmse_rad"), "{:.4f}")),
        ("commands outside limits", lambda r: _num(_get(r, "safety", "outside_position_limits"))),
        ("commands clamped position / velocity", lambda r: f"{_num(_get(r, 'safety', 'clamped_position'))} / "
                                                           f"{_num(_get(r, 'safety', 'clamped_velocity'))}"),
        ("joints the log takes outside the limits", _joints_outside),
        ("host", _host),
        ("host wake-up p50/p99/max us", _wakeup),
        ("real-time scheduling", _realtime),
    ]
    for label, cell in rows:
        table.add_row(label, *(cell(r) for r in reports))
    console.print(table)
    for i, r in enumerate(reports):  # clamped commands and a log outside the limits: said, not only tabled
        for warning in _get(r, "safety", "warnings") or []:
            prefix = f"{_column_title(r, i)}: " if len(reports) > 1 else ""
            say(console, f"safety: {prefix}{warning}", "yellow")
    return table


def _joints_outside(report: dict) -> str:
    """The joints whose recorded range leaves the position limits, by name ("none" when every one fits)."""
    outside = _get(report, "safety", "joints_outside_limits")
    if not isinstance(outside, list):
        return _MISSING
    return ", ".join(str(o.get("joint")) for o in outside if isinstance(o, dict)) or "none"


def _acceptance(report: dict) -> str:
    """The acceptance rate with what it is measured on ("0.812 (4096 drafts in 380 of 400 chunks)"); a rate from
    the adaptive planner's probes alone is not a property of the run: "- (probes only: ...)"."""
    rate, source = _get(report, "spec", "acceptance_rate"), _get(report, "spec", "acceptance_from")
    if not isinstance(source, str):
        return _num(rate)
    return f"- ({source})" if source.startswith("probes only") else f"{_num(rate)} ({source})"
