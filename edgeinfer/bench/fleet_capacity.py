"""`edgeinfer bench fleet`: how many robots one machine serves, five ways of serving them.

    a  one runtime process per robot         N `edgeinfer fleet` processes, one robot each, no batching
    b  one runtime, robots one after another  one process, no batching, arrival order, no admission
    c  batching in arrival order              one process, batched passes, arrival order, k = 0, no deadline cut,
                                              no admission
    d  edgeinfer fleet                        one process, batched passes, EDF, adaptive k, deadline cut, admission
    e  edgeinfer fleet, one runtime per core  d's runtime once per CPU core, robot i served by runtime i % cores
                                              (a fleet spread over a host's cores as docs/fleet.md spreads it over
                                              hosts; a uses every core too)

For each configuration and phase pattern (sync: every robot's planning observations at the same instants, the
worst case; staggered: robot r offset by r x replan period / N), N = 1, 2, 4, 8, ... robots until attainment breaks
(edgeinfer/bench/fleet_ladder.py), each point one fleet replay (edgeinfer.sim.fleet_replay) of `--duration-s`
seconds. The robots (their replayers and control loops) run on this machine beside the runtime: on a 2-core CPU they
compete with it for the cores, as they would on a robot's own computer serving itself; nothing is pinned.

Headline per configuration and phase: the most robots served at >= 99.9 % chunk deadline attainment and <= 0.1 %
steady-state control misses, every served robot (for d and e: the admitted ones), and the ratios d / a and e / a in
the same run.
docs/fleet.md.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from rich.console import Console

from edgeinfer.bench.fleet_configs import CONFIGURATIONS
from edgeinfer.bench.fleet_ladder import breaks, headline, ladder, next_robots, passes, ratio
from edgeinfer.engines.models.paths import DEFAULT_POLICY

SCHEMA = "edgeinfer.bench.fleet_capacity/1"
PHASES = ("sync", "staggered")
POINT_OVERHEAD_S = 9.0  # start-up and teardown of a point beside its replay (measured on the 2-core VM, loaded)
# start-up of each runtime process where every robot has its own (configuration a): a's 32-robot points took
# 69 s (6 s replays) on the quiet 2-core EPYC VM, 1.7 s a process beside the overhead; under load, one point took
# 132 s
PROCESS_START_S = 2.0
# A point starts once the CPUs were at most QUIET_BUSY_PCT busy for QUIET_SECONDS seconds in a row (psutil), so that
# the point before it (up to 32 runtime processes and their robots) has left the cores: on the 2-core VM the
# runtimes of a 32-robot point took ~2 minutes to leave, and the points measured meanwhile broke at 1 robot.
QUIET_BUSY_PCT, QUIET_SECONDS = 25.0, 2


@dataclass
class FleetBenchConfig:
    """The fleet bench: robots served per configuration and phase pattern, N = 1, 2, 4, ... until attainment
    breaks."""

    json: Path | None = None  # write the result here, and the plot next to it (OUT.png)
    out: Path = Path("out/bench/fleet")  # per point replay outputs (reports per robot), and the plot without --json
    policy: Path = DEFAULT_POLICY  # the policy every runtime serves (a manifest)
    # Every runtime's engine: fused (what auto picks on this CPU: the batched kernel with batching, greedy_run
    # without), named so that N runtimes do not each probe every backend at start-up; auto probes.
    backend: Literal["auto", "fused", "torch", "onnxruntime"] = "fused"
    duration_s: float = 6.0  # each point replays this many seconds of every robot's log, s
    # Robots at most: the ladder's last N (a power of two, or this cap as its last step).
    max_robots: int = 32
    configs: list[str] = field(default_factory=lambda: list(CONFIGURATIONS))  # configurations measured (a b c d e)
    phases: list[str] = field(default_factory=lambda: list(PHASES))  # phase patterns measured (sync staggered)
    # Before each point, wait at most this long for the CPUs to be quiet (QUIET_BUSY_PCT), s; the point records
    # the wait and how busy the CPUs were when it started.
    settle_max_s: float = 120.0

    def __post_init__(self):
        self.out = Path(self.out)
        if not self.duration_s > 0:
            raise ValueError(f"FleetBenchConfig.duration_s must be > 0, got {self.duration_s}")
        if self.max_robots < 1:
            raise ValueError(f"FleetBenchConfig.max_robots must be >= 1, got {self.max_robots}")
        if not 0 <= self.settle_max_s <= 3600:
            raise ValueError(f"FleetBenchConfig.settle_max_s must be in [0, 3600] s, got {self.settle_max_s}")
        for name, value, known in (("configs", self.configs, CONFIGURATIONS), ("phases", self.phases, PHASES)):
            unknown = [v for v in value if v not in known]
            if not value or unknown or len(set(value)) != len(value):
                raise ValueError(f"FleetBenchConfig.{name} must be distinct names from {list(known)}, got {value}")


def settle(max_s: float) -> dict:
    """Wait until the CPUs were at most QUIET_BUSY_PCT busy (psutil.cpu_percent, all cores) for QUIET_SECONDS
    one-second samples in a row, at most max_s seconds. Returns {"settle_s": the wait, s, "cpu_busy_pct": the
    last sample, %, "quiet": whether the CPUs got quiet}; both None when max_s left no time for a sample."""
    import psutil

    t0, quiet, busy = time.monotonic(), 0, None
    while quiet < QUIET_SECONDS and time.monotonic() - t0 < max_s:
        busy = psutil.cpu_percent(interval=1.0)
        quiet = quiet + 1 if busy <= QUIET_BUSY_PCT else 0
    return {"settle_s": round(time.monotonic() - t0, 1), "cpu_busy_pct": busy,
            "quiet": None if busy is None else quiet >= QUIET_SECONDS}


def run_fleet(cfg: FleetBenchConfig, console: Console | None = None, command: list[str] | None = None,
              measure=None, wait=settle) -> dict:
    """Every ladder (module docstring), one progress line per point; returns the result (schema SCHEMA) and writes
    it to cfg.json and the plot next to it when set. Ctrl-C (KeyboardInterrupt) stops the bench: the result keeps
    the points measured, "interrupted" true. measure(cfg, config, phase, n, out) -> point: one fleet replay
    (default edgeinfer.bench.fleet_points.measure_point); one that raises RuntimeError, TimeoutError or OSError is
    a failed point (failed_point). wait(max_s) -> dict runs before each point (default settle: the CPUs quiet)
    and its dict is recorded in the point. Raises FileNotFoundError for a missing policy, and what else a fleet replay
    raises (LogError: the logs cannot be served)."""
    from edgeinfer.bench.fleet_capacity_report import point_line, write_plot

    if measure is None:
        from edgeinfer.bench.fleet_points import measure_point as measure
    console = console or Console(stderr=True)
    if not Path(cfg.policy).is_file():
        raise FileNotFoundError(f"FleetBenchConfig.policy: no such policy manifest: {cfg.policy}")
    t0 = time.perf_counter()
    result: dict = {"schema": SCHEMA, "command": command if command is not None else sys.argv,
                    "config": json.loads(json.dumps(asdict(cfg), default=str)), "started_unix_s": time.time(),
                    "machine": _machine(), "load_average_1min": {"start": os.getloadavg()[0], "end": None},
                    "configurations": {c: asdict(CONFIGURATIONS[c]) for c in cfg.configs},
                    "points": [], "interrupted": False}
    console.print(plan_line(cfg), highlight=False, soft_wrap=True)
    try:
        for conf in cfg.configs:
            for phase in cfg.phases:
                ladder: list[dict] = []
                while (n := next_robots(ladder, cfg.max_robots)) is not None:
                    out = cfg.out / conf / phase / f"n{n}"
                    before = wait(cfg.settle_max_s)
                    p0 = time.perf_counter()
                    try:
                        point = measure(cfg, conf, phase, n, out)
                    except (RuntimeError, TimeoutError, OSError) as e:  # a process died or hung: this point failed
                        point = failed_point(n, e)
                    point = {"config": conf, "phase": phase, **point, **before, "passed": passes(point),
                             "breaks": breaks(point), "seconds": round(time.perf_counter() - p0, 1), "out": str(out)}
                    ladder.append(point)
                    result["points"].append(point)
                    console.print(point_line(point), highlight=False, markup=False, soft_wrap=True)
    except KeyboardInterrupt:
        result["interrupted"] = True
        console.print("interrupted: keeping the points measured so far", highlight=False)
    result |= summarize(result["points"], cfg)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["load_average_1min"]["end"] = os.getloadavg()[0]
    plot = Path(cfg.json).with_suffix(".png") if cfg.json else cfg.out / "fleet.png"
    result["plot"] = str(write_plot(result, plot)) if result["points"] else None
    if cfg.json:
        Path(cfg.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


def plan_seconds(cfg: FleetBenchConfig) -> tuple[float, float]:
    """(about, at most) seconds of a run that measures every point of every ladder: each point its duration,
    POINT_OVERHEAD_S, and PROCESS_START_S per runtime process of a process-per-robot configuration (N of them);
    at most, each point also waits the whole cfg.settle_max_s for the CPUs to go quiet."""
    about = 0.0
    for conf in cfg.configs:
        per_process = PROCESS_START_S if CONFIGURATIONS[conf].process_per_robot else 0.0
        about += len(cfg.phases) * sum(cfg.duration_s + POINT_OVERHEAD_S + per_process * n
                                       for n in ladder(cfg.max_robots))
    points = len(cfg.configs) * len(cfg.phases) * len(ladder(cfg.max_robots))
    return about, about + points * cfg.settle_max_s


def plan_line(cfg: FleetBenchConfig) -> str:
    """What the run measures at most, and about how long that takes (plan_seconds): the typical figure, and the
    bound when every point waits its whole settle time."""
    steps = len(ladder(cfg.max_robots))
    points = len(cfg.configs) * len(cfg.phases) * steps
    about, most = plan_seconds(cfg)
    return (f"fleet bench: configurations {' '.join(cfg.configs)}, phases {' '.join(cfg.phases)}, N = "
            f"{', '.join(map(str, ladder(cfg.max_robots)))} until attainment breaks: at most {points} points of "
            f"{cfg.duration_s:g} s, about {about / 60:.0f} min on a quiet machine, at most {most / 60:.0f} min "
            f"(each point waits up to {cfg.settle_max_s:g} s for the CPUs to go quiet: --settle-max-s)")


def failed_point(n: int, error: Exception) -> dict:
    """The point of a fleet replay that failed (a process died or did not come up): nobody served, the error kept;
    it breaks its ladder, and the bench goes on with the next one."""
    return {"robots_requested": n, "robots_admitted": 0, "attainment_worst": None, "attainment_pooled": None,
            "control_miss_worst": None, "error": f"{type(error).__name__}: {error}"}


def summarize(points: list[dict], cfg: FleetBenchConfig) -> dict:
    """{headline: {config: {phase: headline}}, ratio_d_over_a: {phase: ratio}} of the points measured (a ladder
    without points is left out; a ratio needs both d and a)."""
    heads: dict = {}
    for conf in cfg.configs:
        for phase in cfg.phases:
            ladder = [p for p in points if p["config"] == conf and p["phase"] == phase]
            if ladder:
                heads.setdefault(conf, {})[phase] = headline(ladder, cfg.max_robots)
    def ratios(top: str) -> dict:
        return {ph: ratio(heads[top][ph], heads["a"][ph]) for ph in cfg.phases
                if ph in heads.get(top, {}) and ph in heads.get("a", {})}
    return {"headline": heads, "ratio_d_over_a": ratios("d"), "ratio_e_over_a": ratios("e")}


def _machine() -> dict:
    from edgeinfer.bench.engines import machine_info

    return machine_info()


def main(argv: list[str] | None = None) -> int:
    """`edgeinfer bench fleet` as a program of its own: parse FleetBenchConfig options, then run_command."""
    from edgeinfer.bench.suite_cli import parse_suite

    configs = "; ".join(f"{k}: {c.label}" for k, c in CONFIGURATIONS.items())
    return run_command(*parse_suite("fleet", FleetBenchConfig, argv, f"{__doc__.split(chr(10) * 2)[0]} "
                                    f"Configurations (--configs): {configs} (docs/fleet.md#the-fleet-bench)."))


def run_command(cfg: FleetBenchConfig, command: list[str]) -> int:
    """`edgeinfer bench fleet`: run, print the table; 0, or 130 when interrupted. command: the command line as
    typed, recorded in the result. Raises ValueError for a --json that cannot be written (before the run)."""
    from edgeinfer.bench.fleet_capacity_report import print_result
    from edgeinfer.bench.suite_report import check_output

    check_output(cfg.json)
    result = run_fleet(cfg, Console(stderr=True), command=command)
    print_result(result, Console(width=max(Console().width, 150)))
    return 130 if result["interrupted"] else 0
