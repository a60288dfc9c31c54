"""Fleet replay (`edgeinfer fleet-replay`): N robots, each replaying its own real log with its own replayer clock
and control loop, against one fleet runtime (`edgeinfer fleet`, edgeinfer/node/fleet_node.py), or against one runtime
process per robot (runtime_per_robot: the bench's configuration (a)).

    coordinator (here) --start--> robot-group processes (sim/fleet_group.py: robots_per_process robots each)
                                    robot r --DEALER--> fleet runtime ROUTER (Join, Observations, Stop)
    coordinator --DEALER "controller"--> runtime: Hello (ready?), Stop (the end)

The runtime starts first; the coordinator waits for its Hello answer (sent once it has warmed up), starts the robot
groups, waits for each to be subscribed (core/transport.py handshake) and publishes Start(t0): every robot's
schedule counts from t0 (sim/fleet_robot.py). Fault drills: join_at_s (a robot joins mid-run), kill_robot_at_s
(SIGKILL a robot's group process mid-run: it leaves no record and is reported as killed; the runtime drops it after
its lease). At the end each runtime gets a Stop and writes its report (runtime*.json); the figures (sim/
fleet_report.py) go to fleet_report.json, robots/<name>.json, fleet.png and a table on the terminal.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

from rich.console import Console

from edgeinfer.core import transport
from edgeinfer.core.clock import now_ns
from edgeinfer.core.progress import Progress
from edgeinfer.core.wire import Hello, Start, Stop
from edgeinfer.logs.arm_log import list_schunk_runs, split_of
from edgeinfer.node.fleet_config import CONTROLLER, FleetConfig
from edgeinfer.node.runtime import RuntimeConfig
from edgeinfer.procs.node_spec import NodeSpec
from edgeinfer.procs.nodes import Node, NodeGroup
from edgeinfer.sim.fleet_group import SYNTHETIC, FleetRobotsConfig, robot_log
from edgeinfer.sim.fleet_report import fleet_summary, print_fleet, robot_figures, write_plot
from edgeinfer.sim.fleet_robot import load_record
from edgeinfer.sim.preflight import policy_shape
from edgeinfer.sim.session import RunSession, say_exit_codes

SYNTHETIC_SHIFT_S = 0.5  # without real logs, robot i replays the synthetic log from i * this on
START_MARGIN_NS = 200_000_000  # Start is published this long before t0: every group has it in time
DATA_DIR_ENV = "EDGEINFER_DATA_DIR"  # as engines/backends/calibration.py (not imported: it imports torch)
DEFAULT_DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "schunk_lwa4p"


@dataclass(kw_only=True)
class FleetReplayConfig:
    """A fleet replay: the robots (how many, their logs, phases, join and kill times), their budget, the runtime(s)
    they are served by (fleet: every `edgeinfer fleet` option), and where the figures go."""

    robots: int = 4  # N robots, each its own log, clock and control loop
    # One log per robot (fewer: reused, robot i shifted by SYNTHETIC_SHIFT_S per reuse). None: N different Schunk
    # measurements of data_dir (held-out runs first); without them, the embedded synthetic log, robot i from i * 0.5 s.
    logs: list[Path] | None = None
    data_dir: Path | None = None  # the Schunk runs (None: $EDGEINFER_DATA_DIR, else ../shared/data/schunk_lwa4p)
    # sync: every robot's requests at the same instants (the worst case); staggered: robot r offset by r / N of a
    # replan period
    phase: Literal["sync", "staggered"] = "sync"
    duration_s: float = 3.0  # each robot's run from its first request, s (a shorter log is looped)
    budget_ms: float = 20.0  # the chunk budget each robot asks for (Join.budget_ns), ms
    max_budget_ms: float | None = None  # the longest budget a robot accepts, ms (None: budget_ms, none longer)
    runtime_per_robot: bool = False  # one `edgeinfer fleet` process per robot (the bench's configuration (a))
    # fleet runtime processes sharing the robots (robot i served by runtime i % runtimes; one per core spreads the
    # fleet over the host's cores as docs/fleet.md spreads it over hosts); ignored with runtime_per_robot
    runtimes: int = 1
    robots_per_process: int = 0  # robots per robot-group process (0: all in one)
    join_at_s: list[float] | None = None  # per robot, when it sends its Join, s after the start (None: all at 0)
    # per robot, SIGKILL its group process this long after the start, s (< 0: never; None: none killed); the whole
    # group dies, so robots sharing one (robots_per_process) need one kill time
    kill_robot_at_s: list[float] | None = None
    join_lead_ms: float = 100.0  # a robot's first request comes at least this long after its Join, ms
    settle_ms: float = 100.0  # after a robot's last deadline and its Stop: chunks still on their way, ms
    handshake_timeout_s: float = 300.0  # runtime warm-up and the robot groups' start-up, s
    robot_priority: int = 70  # SCHED_FIFO priority of the robot-group processes (best effort; 0 = off)
    keep_chunks: bool = False  # keep every received chunk's steps_rad in robots/<name>.npz (exactness checks)
    plots: bool = True  # write fleet.png
    out: Path = Path("out/fleet")  # fleet_report.json, robots/, fleet.png, runtime*.json, process logs
    fleet: FleetConfig = field(default_factory=FleetConfig)  # the runtime (its endpoint and report are set here)

    def __post_init__(self):
        self.out = Path(self.out)
        self.logs = [Path(p) for p in self.logs] if self.logs is not None else None
        if not 1 <= self.robots <= 1024:
            raise ValueError(f"FleetReplayConfig.robots must be in 1..1024, got {self.robots}")
        if not self.duration_s > 0 or not self.budget_ms > 0:
            raise ValueError(f"FleetReplayConfig.duration_s and budget_ms must be > 0, got {self.duration_s}, "
                             f"{self.budget_ms}")
        if self.max_budget_ms is not None and self.max_budget_ms < self.budget_ms:
            raise ValueError(f"FleetReplayConfig.max_budget_ms ({self.max_budget_ms}) is below budget_ms "
                             f"({self.budget_ms})")
        if not 1 <= self.runtimes <= 64:
            raise ValueError(f"FleetReplayConfig.runtimes must be in 1..64, got {self.runtimes}")
        if self.robots_per_process < 0:
            raise ValueError(f"FleetReplayConfig.robots_per_process must be >= 0, got {self.robots_per_process}")
        for name in ("join_at_s", "kill_robot_at_s"):
            values = getattr(self, name)
            if values is not None and len(values) > self.robots:
                raise ValueError(f"FleetReplayConfig.{name}: {len(values)} values for {self.robots} robots")
            if values is not None and not all(math.isfinite(v) for v in values):
                raise ValueError(f"FleetReplayConfig.{name} must be finite seconds (kill_robot_at_s < 0: never), "
                                 f"got {values}")
        if self.join_at_s is not None and min(self.join_at_s, default=0) < 0:
            raise ValueError(f"FleetReplayConfig.join_at_s must be >= 0, got {self.join_at_s}")

    def per_robot(self, name: str, default: float) -> list[float]:
        values = getattr(self, name) or []
        return [float(v) for v in values] + [default] * (self.robots - len(values))


def robot_logs(cfg: FleetReplayConfig) -> list[tuple[str, float]]:
    """(log, shift_s) of each robot: cfg.logs (reused cyclically, each reuse shifted), else N Schunk measurements
    (held-out first, then the others; reused, shifted, beyond 80), else the synthetic log shifted per robot."""
    if cfg.logs:
        paths = [str(p) for p in cfg.logs]
    else:
        root = cfg.data_dir or Path(os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR)
        runs = list_schunk_runs(root) if root.is_dir() else {}
        paths = [str(p) for n, p in sorted(runs.items(), key=lambda kv: (split_of(kv[0]) != "held_out", kv[0]))]
    if not paths:
        return [(SYNTHETIC, i * SYNTHETIC_SHIFT_S) for i in range(cfg.robots)]
    return [(paths[i % len(paths)], (i // len(paths)) * SYNTHETIC_SHIFT_S) for i in range(cfg.robots)]


@dataclass
class FleetPlan:
    """A fleet replay laid out before any process starts (plan_fleet)."""

    names: list[str]  # the robots' names, robot00..
    logs: list[tuple[str, float]]  # each robot's (log, shift_s): robot_logs
    period_ns: int  # the control period of the first robot's log, ns
    joins: list[float]  # per robot, its join time, s after the start
    kills: list[float]  # per robot, when its group process is SIGKILLed, s after the start (< 0: never)
    runtimes: list[tuple[str, str]]  # (name, ROUTER endpoint) of each fleet runtime process
    groups: list[FleetRobotsConfig]  # each robot-group process
    sockdir: Path  # the ipc endpoints' folder (removed at the end)
    start_ep: str  # the coordinator's PUB (Hello, Start, Stop)
    ready_ep: str  # the coordinator's PULL (the robot groups' ready reports)


def fleet_replay(cfg: FleetReplayConfig, console: Console | None = None) -> dict:
    """Run the fleet replay (see the module docstring) and return its report (also in cfg.out/fleet_report.json).
    Raises LogError for a log the policy cannot run on, RuntimeError when a process dies during start-up,
    TimeoutError when a runtime or robot group does not come up within cfg.handshake_timeout_s."""
    console = console or Console()
    plan = plan_fleet(cfg)
    exit_codes: dict[str, int | None] = {}
    killed, drilled, interrupted = set(), set(), False
    with RunSession() as run:
        run.defer(shutil.rmtree, plan.sockdir, ignore_errors=True)
        controllers = [transport.dealer(run.ctx, ep, CONTROLLER) for _, ep in plan.runtimes]
        run.defer(_stop_runtimes, run.group, controllers, exit_codes)  # each writes its report as it exits
        pub = transport.pub(run.ctx, plan.start_ep)
        try:
            robot_nodes = _start(run, cfg, plan, controllers, pub, console)
            t0 = now_ns() + START_MARGIN_NS
            transport.send(pub, Start(t0, plan.period_ns, 0))
            end_s = max(plan.joins) + (cfg.join_lead_ms + cfg.budget_ms + cfg.settle_ms) / 1e3 + cfg.duration_s
            with Progress(f"fleet-replay: {cfg.robots} robots replaying for {cfg.duration_s:g} s", console=console):
                killed = _supervise(robot_nodes, plan.names, plan.kills, t0, end_s + 30.0, run.group)
            drilled = {g for g, (_, members) in robot_nodes.items() if killed & set(members)}  # SIGKILLed on purpose
            exit_codes |= {g: node.returncode for g, (node, _) in robot_nodes.items()}
        except KeyboardInterrupt:
            run.signals.ignore()  # a second Ctrl-C must not lose the report of the first
            interrupted = True
            transport.send(pub, Stop("interrupted"))
    failed = {name: code for name, code in exit_codes.items() if code not in (0, None) and name not in drilled}
    report = _report(cfg, plan.names, plan.logs, killed, exit_codes, plan.runtimes, interrupted, failed)
    console.print(f"wrote {cfg.out}/: fleet_report.json, robots/*.json{', fleet.png' if cfg.plots else ''}")
    print_fleet(report, console)
    say_exit_codes(console, failed, cfg.out)  # last: a failed process is not to be missed above the table
    return report


def plan_fleet(cfg: FleetReplayConfig) -> FleetPlan:
    """Lay the fleet replay out: each robot's log (every one read here, so that a bad one fails before any process
    starts), phase, join and kill time, runtime and group process; clear cfg.out of an earlier run's records and
    reports (they must not pass for this one's); a new folder for the ipc endpoints (loopback, no port to race
    for). Raises LogError, ValueError for a kill drill that would kill robots sharing its group process."""
    names = [f"robot{i:02d}" for i in range(cfg.robots)]
    logs = robot_logs(cfg)
    shape = policy_shape(RuntimeConfig(policy=cfg.fleet.policy), None)
    first = _check_logs(logs, shape, cfg.duration_s)
    replan_ns = shape["stride_ticks"] * first.period_ns
    phases = [0 if cfg.phase == "sync" else r * replan_ns // cfg.robots for r in range(cfg.robots)]
    joins, kills = cfg.per_robot("join_at_s", 0.0), cfg.per_robot("kill_robot_at_s", -1.0)
    cfg.out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(cfg.out / "robots", ignore_errors=True)
    per = cfg.robots_per_process or cfg.robots
    groups = [list(range(g, min(g + per, cfg.robots))) for g in range(0, cfg.robots, per)]
    for idx in groups:  # a kill drill SIGKILLs a robot's group process: every robot in it at once
        if len({kills[i] for i in idx}) > 1:
            raise ValueError(f"FleetReplayConfig.kill_robot_at_s: robots {[names[i] for i in idx]} share one group "
                             "process (robots_per_process) but not one kill time; a kill drill kills its whole group: "
                             "set robots_per_process 1")
    sockdir = Path(tempfile.mkdtemp(prefix="ei-fleet-"))
    runtimes = ([(f"runtime-{n}", f"ipc://{sockdir}/{n}") for n in names] if cfg.runtime_per_robot
                else [("runtime", f"ipc://{sockdir}/runtime")] if cfg.runtimes == 1
                else [(f"runtime{j}", f"ipc://{sockdir}/runtime{j}") for j in range(min(cfg.runtimes, cfg.robots))])
    for path in [cfg.out / "fleet_report.json", *(cfg.out / f"{n}.json" for n, _ in runtimes)]:
        path.unlink(missing_ok=True)
    start_ep, ready_ep = f"ipc://{sockdir}/start", f"ipc://{sockdir}/ready"
    configs = [FleetRobotsConfig(
        names=[names[i] for i in idx], endpoints=[runtimes[i % len(runtimes)][1] for i in idx],
        logs=[logs[i][0] for i in idx], log_shift_s=[logs[i][1] for i in idx], phase_ns=[phases[i] for i in idx],
        join_at_s=[joins[i] for i in idx], stride_ticks=shape["stride_ticks"], replan_every_ticks=shape["stride_ticks"],
        duration_s=cfg.duration_s, budget_ms=cfg.budget_ms, max_budget_ms=cfg.max_budget_ms or cfg.budget_ms,
        start_endpoint=start_ep, ready_endpoint=ready_ep, out=cfg.out / "robots", group=f"robots{g}",
        join_lead_ms=cfg.join_lead_ms, settle_ms=cfg.settle_ms, keep_chunks=cfg.keep_chunks,
        robot_priority=cfg.robot_priority, handshake_timeout_s=cfg.handshake_timeout_s) for g, idx in enumerate(groups)]
    return FleetPlan(names, logs, first.period_ns, joins, kills, runtimes, configs, sockdir, start_ep, ready_ep)


def _start(run: RunSession, cfg: FleetReplayConfig, plan: FleetPlan, controllers: list, pub,
           console: Console) -> dict[str, tuple[Node, list[str]]]:
    """Start the fleet runtimes and wait until each answers a Hello on its controller DEALER (once warmed up); then
    the robot-group processes, and wait until each is subscribed to `pub`. Returns group -> (node, its robots)."""
    rt_nodes = run.start(*(NodeSpec("fleet", (replace(cfg.fleet, endpoint=ep, report=cfg.out / f"{n}.json"),), n,
                                    cfg.out / f"{n}.log") for n, ep in plan.runtimes))
    with Progress(f"fleet-replay: starting {len(rt_nodes)} fleet runtime(s) (warm-up)", console=console):
        _await_runtimes(controllers, rt_nodes, run.group, cfg.handshake_timeout_s)
    ready = transport.Receiver(transport.pull(run.ctx, plan.ready_ep))
    nodes = run.start(*(NodeSpec("fleet-robots", (g,), g.group, cfg.out / f"{g.group}.log") for g in plan.groups))
    with Progress(f"fleet-replay: starting {len(nodes)} robot group process(es)", console=console):
        transport.wait_until_subscribed(pub, "fleet-replay", ready, {g.group for g in plan.groups},
                                        cfg.handshake_timeout_s, check=lambda: run.group.check_started(nodes))
    return {g.group: (node, g.names) for g, node in zip(plan.groups, nodes)}


def _stop_runtimes(group: NodeGroup, controllers: list, exit_codes: dict) -> None:
    """Stop every fleet runtime of `group` (a Stop on each controller DEALER, repeated while NodeGroup.finish waits,
    SIGTERM for a straggler); their exit codes into `exit_codes`."""
    stop = Stop("end of the fleet replay")
    runtimes = [node for node in group.nodes if node.spec.command == "fleet"]
    exit_codes.update(group.finish(runtimes, poke=lambda: [transport.send(s, stop) for s in controllers]))


def _check_logs(logs: list[tuple[str, float]], shape: dict, duration_s: float):
    """Read every robot's log once here, so a bad one fails before any process starts; the first one."""
    read = {}
    for spec, shift in logs:
        if (spec, shift) not in read:
            log = read[(spec, shift)] = robot_log(spec, shift, duration_s)
            if log.n_joints != shape["n_joints"]:
                raise ValueError(f"{spec}: {log.n_joints} joints, the policy {shape['manifest']} has "
                                 f"{shape['n_joints']}")
    return read[logs[0]]


def _await_runtimes(controllers: list, nodes: list[Node], group: NodeGroup, timeout_s: float) -> None:
    """Send Hellos every 100 ms on each runtime's controller DEALER until every runtime answered (it answers once
    warmed up). Raises RuntimeError when one exits, TimeoutError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    waiting = {k: transport.Receiver(sock) for k, sock in enumerate(controllers)}
    i = 0
    while waiting:
        group.check_started(nodes)
        if time.monotonic() > deadline:
            raise TimeoutError(f"fleet runtime(s) {[nodes[k].name for k in waiting]} did not answer within "
                               f"{timeout_s} s (see their logs)")
        for rx in waiting.values():
            transport.send(rx.sock, Hello("fleet-replay", i, now_ns()))
        i += 1
        t_end = time.monotonic() + 0.1
        while waiting and (left := t_end - time.monotonic()) > 0:
            for k, rx in list(waiting.items()):
                if isinstance(rx.recv(max(1, int(left * 1000 / len(waiting)))), Hello):
                    del waiting[k]


def _supervise(robot_nodes: dict, names: list[str], kills: list[float], t0: int, timeout_s: float,
               group: NodeGroup) -> set[str]:
    """Wait for the robot groups to exit, SIGKILLing a group at its robots' kill times; after timeout_s (from t0)
    SIGTERM the rest (they still write their records). Returns the robots whose process was killed."""
    due = sorted((t0 + int(s * 1e9), names[i]) for i, s in enumerate(kills) if s >= 0)
    killed: set[str] = set()
    while any(node.poll() is None for node, _ in robot_nodes.values()):
        now = now_ns()
        if now - t0 > timeout_s * 1e9:
            for node, _ in robot_nodes.values():
                node.terminate()
            break
        while due and due[0][0] <= now:
            victim = due.pop(0)[1]
            node, members = next((n, m) for n, m in robot_nodes.values() if victim in m)
            if node.poll() is None:
                node.kill()
                killed.update(members)
        group.wait_any(0.05 if not due else max(0.001, min(0.05, (due[0][0] - now_ns()) / 1e9)))
    for node, _ in robot_nodes.values():
        node.wait(timeout=10)
    return killed


def _report(cfg: FleetReplayConfig, names: list[str], logs: list, killed: set[str], exit_codes: dict,
            runtimes: list, interrupted: bool, failed: dict) -> dict:
    """The fleet report (docs/fleet.md); failed: the processes that exited non-zero beside the kill drills (the CLI
    then exits 1)."""
    robots = {}
    for name, (spec, shift) in zip(names, logs):
        path = cfg.out / "robots" / f"{name}.npz"
        if name in killed or not path.exists():
            robots[name] = {"log": Path(spec).name, "killed": name in killed, "admitted": None, "record": False}
            continue
        robots[name] = robot_figures(*load_record(path)) | {"log_shift_s": shift}
        (cfg.out / "robots" / f"{name}.json").write_text(json.dumps(robots[name], indent=1))
    runtime = {}
    for n, _ in runtimes:
        try:
            runtime[n] = json.loads((cfg.out / f"{n}.json").read_text())
        except (OSError, json.JSONDecodeError) as e:
            runtime[n] = {"error": f"no report: {e}"}
    config = asdict(cfg) | {"phase": cfg.phase, "robots": cfg.robots}
    report = {"config": json.loads(json.dumps(config, default=str)), "robots": robots, "fleet": fleet_summary(robots),
              "runtime": runtime, "processes": exit_codes, "failed_processes": failed, "interrupted": interrupted}
    (cfg.out / "fleet_report.json").write_text(json.dumps(report, indent=1))
    if cfg.plots:
        write_plot(report, cfg.out / "fleet.png")
    return report
