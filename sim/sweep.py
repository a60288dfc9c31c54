"""`edgeinfer sweep`: many replays, a grid of logs x configurations from a TOML file, run as Ray tasks on a cluster
(`--address`) or on local Ray, gathered into one table (terminal, sweep.csv, sweep.json).

Sweep file (paths relative to its folder; benchmarks/sweep.toml is an example):

    [sweep]
    logs = ["../../shared/data/schunk_lwa4p/measurement_1*"]   # log paths or glob patterns
    out = "../out/sweep"                                         # one folder per run below it
    [base]                      # ReplayConfig options every run shares, as a launch file's [replay] table
    duration_s = 2.0
    slo = "p99<=5ms,miss<=1%"
    [configs.speculative]       # named variations laid over base (dotted keys = nested tables)
    runtime.decode = "speculative"
    [configs.target-only]
    runtime.decode = "target-only"
    [grid]                      # optional: every combination of these values, crossed with the configs
    "runtime.scheduler.budget_ms" = [10.0, 20.0]

Each run is one `edgeinfer replay` child process (its own runtime and control processes) writing its out folder;
the Ray task returns the report, so the table needs no shared disk. A run that fails (an option ReplayConfig
rejects, which is found before anything starts, a log it cannot read, a dead process, a Ray error) is a row with
its error; the other runs go on. On a cluster every node needs edgeinfer installed and the logs at the same paths.
"""
from __future__ import annotations

import copy
import csv
import glob
import itertools
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from edgeinfer.core.commands import SLO_INVALID_EXIT
from edgeinfer.core.config import load, read_toml, to_argv
from edgeinfer.core.extras import require
from edgeinfer.core.progress import Progress, say
from edgeinfer.logs import require_reader
from edgeinfer.procs.node_spec import NodeSpec
from edgeinfer.procs.nodes import run_to_exit
from edgeinfer.sim.tables import whole_words

CSV_COLUMNS = ("run", "log", "config", "status", "latency_p50_ms", "latency_p50_ci95_lo", "latency_p50_ci95_hi",
               "latency_p99_ms", "latency_p99_ci95_lo", "latency_p99_ci95_hi", "miss_rate", "miss_rate_upper95",
               "verdict", "observations", "out", "error")


@dataclass
class SweepConfig:
    """Where and how the sweep's replays run."""

    # Ray cluster to join (e.g. ray://HOST:10001, or "auto" on a cluster node); None starts local Ray with this
    # machine's CPUs.
    address: str | None = None
    # CPUs Ray reserves per replay (a replay keeps about two busy: the runtime, and the replayer with the
    # control loop; 2 on a 2-core machine runs one at a time).
    num_cpus_per_task: float = 2.0
    out: Path | None = None  # output folder, overriding the file's [sweep] out
    replay_timeout_s: float = 3600.0  # a replay still running after this long is stopped and fails, s

    def __post_init__(self):
        self.out = Path(self.out) if self.out is not None else None
        if not self.num_cpus_per_task > 0:
            raise ValueError(f"SweepConfig.num_cpus_per_task must be > 0, got {self.num_cpus_per_task}")
        if not self.replay_timeout_s > 0:
            raise ValueError(f"SweepConfig.replay_timeout_s must be > 0, got {self.replay_timeout_s}")


@dataclass
class SweepHead:
    """The [sweep] table of a sweep file."""

    logs: list[str]  # log paths or glob patterns, relative to the sweep file's folder
    out: str = "out/sweep"  # one folder per run below it, relative to the sweep file's folder


@dataclass
class SweepFile:
    """A sweep file (see the module docstring); every table but [sweep] is optional."""

    sweep: SweepHead  # the logs and the output folder
    base: dict = field(default_factory=dict)  # ReplayConfig options every run shares, as a launch file's [replay]
    configs: dict[str, dict] = field(default_factory=dict)  # named variations laid over base
    grid: dict[str, list] = field(default_factory=dict)  # every combination of these values, crossed with configs


@dataclass
class Run:
    """One replay of the sweep: log x configuration. argv: the `edgeinfer replay` options; error: why it cannot
    start (an option ReplayConfig rejects), None when it can."""

    name: str
    log: str
    config: str
    out: Path
    argv: list[str]
    error: str | None = None


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def _nested(dotted: str, value) -> dict:
    *parents, leaf = dotted.split(".")
    node = {leaf: value}
    for p in reversed(parents):
        node = {p: node}
    return node


def _variations(configs: dict, grid: dict, where: Path) -> list[tuple[str, dict]]:
    """(name, options) per configuration x grid point; ValueError naming the key for a malformed table."""
    if not isinstance(configs, dict) or not all(isinstance(v, dict) for v in configs.values()):
        raise ValueError(f"{where}: [configs] must hold one table per configuration ([configs.NAME])")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"{where}: grid.{key} must be a non-empty list of values, got {values!r}")
    points = [dict(zip(grid, combo)) for combo in itertools.product(*grid.values())] if grid else [{}]
    out = []
    for (cname, copts), point in itertools.product((configs or {"base": {}}).items(), points):
        parts = [cname] if configs or not point else []  # a grid alone names its runs by their values only
        name = ",".join(parts + [f"{k.split('.')[-1]}={v}" for k, v in point.items()])
        opts = copts
        for key, value in point.items():
            opts = _merge(opts, _nested(key, value))
        out.append((name, opts))
    return out


def expand_logs(patterns: list, where: Path) -> list[Path]:
    """Log paths from paths or glob patterns relative to `where`'s folder, in order, without repeats. Raises
    ValueError naming a pattern that matches nothing."""
    if not isinstance(patterns, list) or not patterns or not all(isinstance(p, str) for p in patterns):
        raise ValueError(f"{where}: sweep.logs must be a non-empty list of paths or glob patterns")
    logs: list[Path] = []
    for pattern in patterns:
        full = pattern if Path(pattern).is_absolute() else str(where.parent / pattern)
        found = sorted(Path(p).resolve() for p in glob.glob(full))
        if not found:
            raise ValueError(f"{where}: sweep.logs pattern {pattern!r} matches nothing (looked for {full})")
        logs += [p for p in found if p not in logs]
    return logs


def plan(path: Path, out: Path | None = None) -> tuple[list[Run], Path]:
    """The runs of the sweep file at `path` (logs x configurations, in that order) and the sweep's out folder.

    Each run's options (base, then its configuration, then log and out) are checked by building its
    ReplayConfig: a run whose options are rejected keeps the error and is never started. Raises ValueError naming
    the file for invalid TOML, an unknown table or a log pattern that matches nothing."""
    path = Path(path).resolve()
    doc = load(SweepFile, read_toml(path), file=path)
    logs = expand_logs(doc.sweep.logs, path)
    out = Path(out) if out is not None else (path.parent / doc.sweep.out).resolve()
    from edgeinfer.sim.run_config import ReplayConfig  # here: Ray workers import this module without torch

    runs, names = [], set()
    for log in logs:
        for cname, opts in _variations(doc.configs, doc.grid, path):
            name = f"{log.name}/{cname}"
            while name in names:  # two logs of one name in different folders
                name += "+"
            names.add(name)
            run_out = out / name.replace("/", "__")
            table = _merge(_merge(doc.base, opts), {"log": str(log), "out": str(run_out)})
            try:
                argv = to_argv(load(ReplayConfig, table, base_dir=path.parent))
                runs.append(Run(name, str(log), cname, run_out, argv))
            except (ValueError, TypeError) as e:
                runs.append(Run(name, str(log), cname, run_out, [], f"{path}: configs.{cname}: {e}"))
    return runs, out


def run_replay(argv: list[str], out: str, timeout_s: float) -> dict:
    """One `edgeinfer replay ARGV` node (procs.nodes.run_to_exit; stdout and stderr to OUT/replay.log). Returns
    {"returncode" (None: timed out), "report" (OUT/report.json, or None), "error" (None when it exited 0 or with
    SLO_INVALID_EXIT: else the CLI's error line or the log's tail), "wall_s"}. The body of each Ray task; never
    raises for a failed replay."""
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").unlink(missing_ok=True)  # a report left by an earlier sweep must not pass for this one
    t0 = time.monotonic()
    code = run_to_exit(NodeSpec("replay", options=argv, log=out_dir / "replay.log"), timeout_s)
    report_path = out_dir / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    error = None
    if code not in (0, SLO_INVALID_EXIT):  # an INVALID verdict is a result (the table's SLO column), not a failure
        lines = (out_dir / "replay.log").read_text(errors="replace").strip().splitlines()
        named = [ln for ln in lines if "error:" in ln]
        why = f"timed out after {timeout_s} s" if code is None else f"exit code {code}"
        error = f"{why}: " + (named[-1] if named else " | ".join(lines[-3:]) or "no output")
    return {"returncode": code, "report": report, "error": error, "wall_s": time.monotonic() - t0}


def row(run: Run, result: dict) -> dict:
    """The table row of a run from run_replay's result: its figures from the report (None when missing)."""
    r = result.get("report") or {}
    lat, ci = r.get("latency_ms") or {}, r.get("latency_ci95_ms") or {}
    slo = r.get("slo") or {}
    error = run.error or result.get("error")
    return {"run": run.name, "log": run.log, "config": run.config, "status": "failed" if error else "ok",
            "latency_p50_ms": lat.get("p50"), "latency_p50_ci95_ms": ci.get("p50"),
            "latency_p99_ms": lat.get("p99"), "latency_p99_ci95_ms": ci.get("p99"),
            "miss_rate": r.get("miss_rate"), "miss_rate_upper95": (r.get("miss_rate_ci95") or [None, None])[1],
            "verdict": slo.get("verdict"), "observations": r.get("observations_sent"), "out": str(run.out),
            "error": error, "wall_s": result.get("wall_s"), "report": result.get("report")}


def sweep(path: Path, cfg: SweepConfig, console: Console | None = None) -> list[dict]:
    """Run every replay of the sweep file as a Ray task (joining cfg.address, the Ray already initialised in this
    process, or a local Ray started here and stopped at the end); write OUT/sweep.json (rows with their reports)
    and OUT/sweep.csv; print the table. Returns the rows in plan order. Ctrl-C cancels the runs not finished and
    still writes the table (their rows: failed, "cancelled"). Raises ValueError for a bad sweep file or more CPUs
    per task than any Ray node has, core.extras.MissingExtra (a RuntimeError) without Ray (`pip install
    'edgeinfer[sweep]'`) or a log's reader, before Ray starts."""
    console = console or Console()
    runs, out = plan(path, cfg.out)
    require("sweep", "edgeinfer sweep")  # before Ray starts: one line naming the extra
    for log in sorted({r.log for r in runs}):
        require_reader(log)
    import ray

    started = not ray.is_initialized()
    if started and cfg.address:
        ray.init(address=cfg.address, log_to_driver=False)
    elif started:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    results: dict[str, dict] = {r.name: {} for r in runs if r.error}
    try:
        most = max((n.get("Resources", {}).get("CPU", 0) for n in ray.nodes() if n.get("Alive")), default=0)
        if cfg.num_cpus_per_task > most:
            raise ValueError(f"SweepConfig.num_cpus_per_task={cfg.num_cpus_per_task} exceeds the CPUs of every Ray "
                             f"node (at most {most}): no replay could be scheduled")
        task = ray.remote(run_replay).options(num_cpus=cfg.num_cpus_per_task, max_retries=0)
        pending = {task.remote(r.argv, str(r.out), cfg.replay_timeout_s): r for r in runs if not r.error}
        for r in runs:
            if r.error:
                say(console, f"{r.name}: not started: {r.error}", "red")
        with Progress(f"sweep: {len(runs)} replays on Ray", total=len(runs), console=console) as bar:
            bar.update(len(results))
            try:
                while pending:
                    done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                    for ref in done:
                        r = pending.pop(ref)
                        try:
                            results[r.name] = ray.get(ref)
                        except ray.exceptions.RayError as e:  # the worker died, the task was cancelled, ...
                            results[r.name] = {"error": f"ray: {type(e).__name__}: {str(e).splitlines()[0]}"}
                        if err := results[r.name].get("error"):
                            say(console, f"{r.name}: failed: {err}", "red")
                        bar.advance()
                    if not done:
                        bar.update()  # elapsed time, while the runs run
            except KeyboardInterrupt:
                for ref, r in pending.items():
                    ray.cancel(ref, force=True)
                    results[r.name] = {"error": "cancelled (interrupted)"}
    finally:
        if started:
            ray.shutdown()
    rows = [row(r, results.get(r.name, {"error": "not run"})) for r in runs]
    write_rows(rows, out)
    print_rows(rows, console)
    console.print(f"wrote {out / 'sweep.json'}, {out / 'sweep.csv'}; one folder per run under {out}")
    return rows


def write_rows(rows: list[dict], out: Path) -> None:
    """OUT/sweep.json (every row, with its full report) and OUT/sweep.csv (CSV_COLUMNS; a CI as lo, hi)."""
    out.mkdir(parents=True, exist_ok=True)  # rows hold plain values: reports come from JSON files
    (out / "sweep.json").write_text(json.dumps({"schema": "edgeinfer.sweep/1", "runs": rows}, indent=1,
                                               allow_nan=False) + "\n")
    with open(out / "sweep.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            flat = dict(r)
            for k in ("latency_p50", "latency_p99"):
                flat[f"{k}_ci95_lo"], flat[f"{k}_ci95_hi"] = r[f"{k}_ci95_ms"] or (None, None)
            w.writerow(flat)


def print_rows(rows: list[dict], console: Console) -> Table:
    """One rich Table row per run: status, latency p50/p99 with 95 % CIs, miss rate and its 95 % upper bound,
    the SLO verdict, the error of a failed run."""
    table = Table(title="edgeinfer sweep")
    for col in ("run", "status", "p50 ms [95% CI]", "p99 ms [95% CI]", "miss rate (<= 95% bound)", "verdict",
                "error"):
        table.add_column(col, justify="left" if col in ("run", "error") else "right", no_wrap=col == "run",
                         overflow="ellipsis" if col == "error" else "fold", max_width=60 if col == "error" else None)
    for r in rows:
        ci = {k: ("-" if r[f"latency_{k}_ms"] is None else f"{r[f'latency_{k}_ms']:.3f}")
              + (" [{:.3f}, {:.3f}]".format(*r[f"latency_{k}_ci95_ms"]) if r[f"latency_{k}_ci95_ms"] else "")
              for k in ("p50", "p99")}
        miss = ("-" if r["miss_rate"] is None
                else f"{100 * r['miss_rate']:.2f} % (<= {100 * r['miss_rate_upper95']:.2f})")
        table.add_row(r["run"], "[green]ok[/green]" if r["status"] == "ok" else "[red]failed[/red]", ci["p50"],
                      ci["p99"], miss, r["verdict"] or "-", escape(r["error"] or ""))  # a hint's [extra]
    console.print(whole_words(table))  # figures whole at 80 columns (wrapped at spaces, never split)
    return table
