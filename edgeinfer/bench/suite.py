"""`edgeinfer bench`: every ruler, measured the same way every time, on real recordings, with quality
checked in the same run. Target-only and the runtime's speculative decoding side by side.

    edgeinfer bench [--log DIR ...] [--backend torch] [--scenarios default] --json out/bench.json
    edgeinfer bench --compare BASE.json [--current NEW.json]     # ratios per figure, regression verdict
    python scripts/perf_table.py out/bench.json                  # the markdown table of benchmarks/results/README.md

Rulers (edgeinfer.bench.decode, bench_e2e, bench_floors; scenarios from benchmarks/*.toml):
    in-process   time to first action, chunk latency, time per output token, target passes per token,
                 quality (greedy token agreement with target-only, action RMSE against the recorded future)
    offline      chunk throughput, chunks decoded back to back as fast as possible
    <replay>     end-to-end latency (observation sent -> command received through the real processes and
                 sockets), tails p50/p95/p99/p99.9/max, time to chunk (observation sent -> its chunk received),
                 deadline miss rate with its Clopper-Pearson bound, action RMSE;
                 one scenario per [[replay]] table (steady at the log's rate, idle gaps, 2x overload)
    floor        raw pyzmq round trip with an Observation's payload (back to back and after idle gaps),
                 a bare sleep-then-spin loop's wake error
Methodology: warm-up excluded; fixed observations, seeds and output length (the full H x D chunk, no
budget in-process); target-only and speculative interleaved repeat by repeat; `repeats` repeats, the
median quoted; machine, library versions, seeds and the command line recorded in the JSON.
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from rich.console import Console

from edgeinfer.bench.scenarios import Scenarios, load_scenarios
from edgeinfer.core.progress import say
from edgeinfer.node.runtime import Backend, RuntimeConfig

SCHEMA = "edgeinfer.bench.suite/1"
DECODES = ("target-only", "speculative")


@dataclass
class BenchConfig:
    """The bench: every ruler on real logs, target-only vs speculative."""

    # Schunk measurement directories (None: the held-out measurement_1 under the data directory; the embedded
    # synthetic log, with a warning, when there is none).
    log: list[Path] | None = None
    backend: Backend = "torch"  # the engine the target runs on (the runtime's choices; auto: the fastest exact here)
    precision: Literal["fp32", "bf16", "fp8"] = "fp32"  # the engine's precision
    device: str = "cpu"  # the engine's device (cpu, cuda, cuda:1, ...)
    threads: int = 1  # intra-op threads of the engine
    scenarios: str = "default"  # a scenarios file: a name in benchmarks/ (default, quick) or a TOML path
    repeats: int | None = None  # measurements per ruler, the median quoted (None: the scenarios file's)
    seed: int | None = None  # seed of the held-out observation sample (None: the scenarios file's)
    json: Path | None = None  # write the result here
    out: Path = Path("out/bench")  # replay artefacts (reports, ticks.csv, process logs)
    compare: Path | None = None  # a saved result to compare against (ratios and a regression verdict)
    current: Path | None = None  # compare this saved result instead of running a new bench
    tolerance: float = 0.10  # relative change below which a figure counts as the same (0.1 = 10 %)

    def __post_init__(self):
        self.out = Path(self.out)
        if self.threads < 1:
            raise ValueError(f"BenchConfig.threads must be >= 1, got {self.threads}")
        if self.repeats is not None and self.repeats < 1:
            raise ValueError(f"BenchConfig.repeats must be >= 1, got {self.repeats}")
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"BenchConfig.tolerance must be in [0, 1), got {self.tolerance}")
        if self.current is not None and self.compare is None:
            raise ValueError("BenchConfig.current needs compare (the base to compare it with)")
        for name in ("compare", "current"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise FileNotFoundError(f"BenchConfig.{name}: no such file: {path}")
        for path in self.log or []:
            if not Path(path).is_dir():
                raise FileNotFoundError(f"BenchConfig.log: log directory not found: {path}")


def _logs(cfg: BenchConfig, console: Console) -> tuple[list, str]:
    """The ArmLogs to measure on and a one-line description of where they come from."""
    from edgeinfer.engines.backends.calibration import resolve_data_dir
    from edgeinfer.logs.arm_log import read_schunk, synthetic_log

    if cfg.log:
        logs = [read_schunk(p) for p in cfg.log]
        return logs, "real: " + ", ".join(str(p) for p in cfg.log)
    default = resolve_data_dir() / "measurement_1"
    if default.is_dir():
        return [read_schunk(default)], f"real: {default} (held out from training)"
    console.print(f"[yellow]WARNING: {default} not found; measuring on the embedded synthetic log: these "
                  "figures are NOT on real data[/yellow]")
    return [synthetic_log(seconds=10.0)], "synthetic: the embedded minimum-jerk log (no real data found)"


def machine() -> dict:
    """CPU, cores, GPU and library versions (engines.bench_engines.machine_info plus the transport's)."""
    import zmq

    from edgeinfer.bench.engines import machine_info

    info = machine_info()
    info["pyzmq"], info["libzmq"] = zmq.__version__, zmq.zmq_version()
    for dist in ("msgpack", "rich", "edgeinfer"):
        try:
            info[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            info[dist] = None
    return info


def source_version() -> dict:
    """{commit, dirty} of the checkout edgeinfer runs from (None when it is not a git checkout)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None, "dirty": None}
    if commit.returncode != 0:
        return {"commit": None, "dirty": None}
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}


@dataclass
class _Windows:
    """The chunk windows the bench decodes: feats (N, 3D) raw and offsets (N, H, D) rad of every log, and the
    observations drawn from them with the seed (in-process single stream, offline, warm-up)."""

    logs: list
    source: str
    feats: np.ndarray
    offsets: np.ndarray
    pick: np.ndarray
    obs: list
    off_obs: list
    warm: list


def run_bench(cfg: BenchConfig, sc: Scenarios | None = None, console: Console | None = None,
              command: list[str] | None = None) -> dict:
    """Measure every ruler (see the module docstring); returns the result dict (schema edgeinfer.bench.suite/1)
    and writes it to cfg.json when set. A scenario that fails is recorded with its error, not fatal.
    Raises FileNotFoundError/ValueError for a bad scenarios file or log, LogError for a malformed log."""
    from edgeinfer.bench.figures import add_ratios
    from edgeinfer.engines.models.policy import load_policy

    console = console or Console(stderr=True)
    sc = sc or load_scenarios(cfg.scenarios)
    repeats = cfg.repeats or sc.repeats
    seed = sc.seed if cfg.seed is None else cfg.seed
    t_start = time.perf_counter()
    if sc.replay:  # the e2e nodes' fork server imports while we load; ready before the first measurement
        from edgeinfer.procs import forkserver

        forkserver.start(wait=False)
    policy = load_policy()
    win = _windows(cfg, sc, policy, seed, console)
    result = _result_head(cfg, sc, command, repeats, seed, win)
    log_line = lambda text: console.print(text, highlight=False, soft_wrap=True)  # noqa: E731  (one line each)
    floors = _floors(sc, win, policy.cfg.n_joints, repeats, result, log_line, console)
    decode = _in_process(cfg, sc, win, seed, repeats, log_line)
    e2e = _e2e(cfg, sc, win, seed, repeats, log_line, console)
    figures = _figures(decode, e2e, floors, sc)
    add_ratios(figures, {s.name: ("zmq round trip after idle" if s.burst_s is not None else "zmq round trip")
                         for s in sc.replay})
    result["decode"] = {m: _decode_record(decode[m], decode["target-only"]) for m in DECODES}
    result["e2e"] = {name: {**v, "runs": {m: [_run_record(x) for x in runs] for m, runs in v["runs"].items()}}
                     for name, v in e2e.items()}
    result["figures"] = figures
    result["seconds"] = round(time.perf_counter() - t_start, 1)
    result["load_average_1min"]["end"] = os.getloadavg()[0]
    if cfg.json:
        Path(cfg.json).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


def _windows(cfg: BenchConfig, sc: Scenarios, policy, seed: int, console: Console) -> _Windows:
    """The logs' chunk windows and the observations drawn from them with `seed`. Raises ValueError when the
    logs are too short for one window."""
    from edgeinfer.bench.decode import observations
    from edgeinfer.engines.training.dataset import chunk_windows

    logs, source = _logs(cfg, console)
    d = policy.cfg.n_joints
    pcfg = policy.cfg
    parts = [chunk_windows(log.q_rad, log.qd_rad_s, pcfg.horizon, pcfg.stride_ticks, log.t_s)[:2] for log in logs]
    feats, offsets = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    if len(feats) == 0:
        raise ValueError(f"the logs ({source}) are too short for one chunk window")
    rng = np.random.default_rng(seed)
    n_obs, n_off = sc.decode.observations, sc.decode.offline_chunks
    pick = np.sort(rng.choice(len(feats), n_obs, replace=n_obs > len(feats)))
    pick_off = rng.choice(len(feats), n_off, replace=n_off > len(feats))
    obs, off_obs = observations(feats[pick], d), observations(feats[pick_off], d)
    warm = observations(feats[rng.choice(len(feats), min(sc.decode.warmup_chunks, len(feats)), replace=False)], d)
    return _Windows(logs, source, feats, offsets, pick, obs, off_obs, warm)


def _runtime_config(cfg: BenchConfig, seed: int, decode: str, warmup_chunks: int) -> RuntimeConfig:
    return RuntimeConfig(backend=cfg.backend, precision=cfg.precision, device=cfg.device, decode=decode,
                         threads=cfg.threads, seed=seed, warmup_chunks=warmup_chunks)


def _result_head(cfg: BenchConfig, sc: Scenarios, command: list[str] | None, repeats: int, seed: int,
                 win: _Windows) -> dict:
    """The result's sections known before the first measurement: what ran, where, on which data."""
    return {
        "schema": SCHEMA, "command": command if command is not None else sys.argv,
        "config": json.loads(json.dumps(dataclasses.asdict(cfg), default=str)),  # paths as text
        "scenarios": {**dataclasses.asdict(sc), "repeats": repeats, "seed": seed},
        "machine": machine(), "source": source_version(), "started_unix_s": time.time(),
        # 1-minute load average: other work on the machine while the bench ran (a figure's context)
        "load_average_1min": {"start": os.getloadavg()[0], "end": None},
        "data": {"source": win.source, "logs": [log.name for log in win.logs], "windows": int(len(win.feats)),
                 "rate_hz": [round(log.rate_hz, 3) for log in win.logs]},
        "seeds": {"observations": seed, "runtime": seed},
        "engine": {"backend": cfg.backend, "precision": cfg.precision, "device": cfg.device, "threads": cfg.threads},
    }


def _floors(sc: Scenarios, win: _Windows, d: int, repeats: int, result: dict, log_line, console: Console) -> list:
    """The floors, first: nothing else of ours is running (the fork server, when e2e scenarios need it, is
    waited for before). One measure_floors per repeat; puts the "floors" section in `result`."""
    from edgeinfer.bench.floor_loop import measure_floors, observation_payload_bytes

    if sc.replay:
        from edgeinfer.procs import forkserver

        try:
            forkserver.start(wait=True)
        except (RuntimeError, TimeoutError) as e:  # the e2e scenarios will record their failure
            say(console, f"fork server for the e2e nodes: {e}", "red")
    payload = observation_payload_bytes(d)
    fl = sc.floors
    period_ns = win.logs[0].period_ns
    floors = [measure_floors(payload, period_ns, fl.round_trips, fl.idle_gap_ms, fl.idle_round_trips, fl.wake_ticks)
              for _ in range(repeats)]
    result["floors"] = {"payload_bytes": payload, "period_ms": period_ns / 1e6}
    log_line(f"floors: {repeats} x ({fl.round_trips} zmq round trips, {fl.wake_ticks} wakes)")
    return floors


def _in_process(cfg: BenchConfig, sc: Scenarios, win: _Windows, seed: int, repeats: int, log_line) -> dict:
    """In-process: both decode modes open, repeats interleaved so that drift of the machine hits both alike.
    Returns decode mode -> {"single": [per repeat], "offline": [per repeat]}."""
    from edgeinfer.bench.decode import offline, open_runtime, single_stream

    runtimes = {m: open_runtime(_runtime_config(cfg, seed, m, sc.decode.warmup_chunks), win.warm) for m in DECODES}
    decode = {m: {"single": [], "offline": []} for m in DECODES}
    for r in range(repeats):
        for m in DECODES:
            decode[m]["single"].append(single_stream(runtimes[m], win.obs, win.offsets[win.pick]))
            decode[m]["offline"].append(offline(runtimes[m], win.off_obs))
        log_line(f"in-process repeat {r + 1}/{repeats}: chunk p50 " + ", ".join(
            f"{m} {np.median(decode[m]['single'][-1]['chunk_ms']):.2f} ms" for m in DECODES))
    runtimes.clear()
    return decode


def _e2e(cfg: BenchConfig, sc: Scenarios, win: _Windows, seed: int, repeats: int, log_line,
         console: Console) -> dict:
    """End to end: every scenario x log x repeat x decode mode, through real processes. Returns scenario name ->
    {"scenario", "runs": {decode mode: [run]}, "error"}; a scenario's failure is recorded in its "error"."""
    e2e: dict = {}
    for scen in sc.replay:
        e2e[scen.name] = {"scenario": dataclasses.asdict(scen), "runs": {m: [] for m in DECODES}, "error": None}
        try:
            from edgeinfer.bench.e2e import run_scenario

            n_rep = cfg.repeats or scen.repeats or repeats  # an explicit --repeats applies everywhere
            for log in win.logs:
                for r in range(n_rep):
                    for m in DECODES:
                        out = cfg.out / scen.name / log.name / m / f"r{r}"
                        run = run_scenario(log, scen, _runtime_config(cfg, seed, m, scen.warmup_chunks), out)
                        run["repeat"] = r
                        e2e[scen.name]["runs"][m].append(run)
                        log_line(f"{scen.name} {log.name} {m} repeat {r + 1}/{n_rep}: "
                                 f"{run['deadline_misses']}/{run['observations']} misses, latency p50 "
                                 f"{np.nanmedian(run['latency_ms']):.2f} ms")
        except (RuntimeError, ValueError, OSError, TimeoutError) as e:  # one scenario's failure is recorded
            e2e[scen.name]["error"] = f"{type(e).__name__}: {e}"
            say(console, f"{scen.name}: {e}", "red")
    return e2e


def _agreement(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(a == b))


def _decode_record(runs: dict, base: dict) -> dict:
    """Per repeat: counts and quality of one decode mode (the samples themselves are in the figures)."""
    return {"repeats": [{"chunks": len(s["chunk_ms"]), "incomplete": s["incomplete"],
                         "tokens": int(s["tokens"].size), "action_rmse_rad": s["action_rmse_rad"],
                         "token_agreement": _agreement(s["tokens"], b["tokens"]),
                         "chunks_identical": float(np.mean(np.all(s["tokens"] == b["tokens"], axis=1))),
                         "offline_chunks": o["chunks"], "offline_seconds": o["seconds"]}
                        for s, o, b in zip(runs["single"], runs["offline"], base["single"])]}


def _run_record(run: dict) -> dict:
    from edgeinfer.bench.figures import tails

    return {**{k: v for k, v in run.items() if k != "latency_ms"}, "latency_ms": tails(run["latency_ms"]),
            "lost": int(np.sum(~np.isfinite(run["latency_ms"])))}


def _figures(decode: dict, e2e: dict, floors: list[dict], sc: Scenarios) -> list[dict]:
    from edgeinfer.bench.figures import figure, miss_rate_figure, tail_figures

    figs = []
    base = decode["target-only"]["single"]
    for m in DECODES:
        single, off = decode[m]["single"], decode[m]["offline"]
        figs += tail_figures("time to first action", "in-process", m, [s["ttfa_ms"] for s in single])
        figs += tail_figures("chunk latency", "in-process", m, [s["chunk_ms"] for s in single], stats=("p50", "p99"))
        figs.append(figure("time per output token", "in-process", m, "p50", "ms", "lower",
                           [float(np.median(s["ms_per_token"])) for s in single]))
        figs.append(figure("target passes per token", "in-process", m, "mean", "passes", "lower",
                           [float(np.mean(s["passes_per_token"])) for s in single]))
        figs.append(figure("chunk throughput", "offline", m, "rate", "chunks/s", "higher",
                           [o["chunks_per_s"] for o in off]))
        figs.append(figure("token agreement with target-only", "in-process", m, "fraction", "fraction", "higher",
                           [_agreement(s["tokens"], b["tokens"]) for s, b in zip(single, base)]))
        figs.append(figure("action RMSE", "in-process", m, "rmse", "rad", "lower",
                           [s["action_rmse_rad"] for s in single]))
    for name, scen in e2e.items():
        for m, runs in scen["runs"].items():
            if not runs:
                continue
            figs += tail_figures("latency", name, m, [r["latency_ms"] for r in runs])
            figs.append(miss_rate_figure(name, m, [r["deadline_misses"] for r in runs],
                                         [r["observations"] for r in runs]))
            figs += [figure("time to chunk", name, m, stat, "ms", "lower", [r["time_to_chunk_ms"][stat] for r in runs])
                     for stat in ("p50", "p99", "max")]
            figs.append(figure("action RMSE", name, m, "rmse", "rad", "lower", [r["action_rmse_rad"] for r in runs]))
    for key, ruler in (("zmq_round_trip_ms", "zmq round trip"), ("zmq_round_trip_idle_ms", "zmq round trip after idle"),
                       ("wake_error_ms", "wake error")):
        figs += tail_figures(ruler, "floor", "floor", [f[key] for f in floors])
    return figs


def main(argv: list[str] | None = None) -> int:
    """`edgeinfer bench` as a program of its own: parse BenchConfig options (core.config.parse), then
    run_command."""
    from edgeinfer.core.config import parse

    cfg = parse(BenchConfig, argv, prog="edgeinfer bench", description=__doc__.split("\n\n")[0])
    return run_command(cfg, ["edgeinfer", *(sys.argv[1:] if argv is None else ["bench", *argv])])


def run_command(cfg: BenchConfig, command: list[str]) -> int:
    """`edgeinfer bench` without a suite: run (or load) and print; 0, or 1 when --compare finds a regression.
    command: the command line as typed, recorded in the result. Raises ValueError for a --json that cannot be
    written (before the run)."""
    from edgeinfer.bench.suite_report import check_output, print_compare, print_result

    check_output(cfg.json)
    console = Console(width=max(Console().width, 150))  # never squeeze the table's columns
    if cfg.current is not None:
        result = json.loads(Path(cfg.current).read_text())
    else:
        result = run_bench(cfg, console=Console(stderr=True), command=command)
        print_result(result, console)
        if cfg.json:
            console.print(f"wrote {cfg.json}")
    if cfg.compare is not None:
        return 1 if print_compare(json.loads(Path(cfg.compare).read_text()), result, cfg.tolerance,
                                  console) == "regression" else 0
    return 0
