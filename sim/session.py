"""One run session: the set-up, processes, teardown and outputs that replay (sim/replay.py), hardware in the loop
(sim/hil.py) and fleet replay (sim/fleet_replay.py) share, owned in one place as ros2 launch owns its process
graph, so that each of the three holds only its own steps.

    prepare(cfg, console)        before any process: the log read and cut, the policy's shape, the deadline, the
                                 joint limits (sim/preflight.py checks them) and the ticks the rows are sent on
    with RunSession() as run:    the run's signals, nodes (procs.nodes), real-time priority and CPU pin, ZeroMQ
                                 context; whatever way the block ends, all of it is torn down
    RobotSockets.open(...)       the replayer's five sockets on a run's Endpoints, its handshake and its Stop
    robot_sections, write_outputs  the report's shared sections; report.json, ticks.csv, plots, run.mcap, table

Inside a session the order matters: the nodes start before realtime() (a child inherits the priority and the CPU
pin, and the runtime under test must run as it would on the robot), and the context opens after it (its I/O
thread inherits both: the replayer's sends must not wait behind it on another CPU or priority).
"""
from __future__ import annotations

import os
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import zmq
from rich.console import Console

from edgeinfer.control.limits import ResolvedLimits
from edgeinfer.core import clock, transport
from edgeinfer.core.extras import missing_line
from edgeinfer.core.lifecycle import InterruptSignals
from edgeinfer.core.progress import say
from edgeinfer.core.wire import Stop
from edgeinfer.logs import read_log
from edgeinfer.logs.arm_log import ArmLog, synthetic_log
from edgeinfer.procs.node_spec import NodeSpec
from edgeinfer.procs.nodes import Node, NodeGroup
from edgeinfer.sim import stats
from edgeinfer.sim.host import measure_host, sched_state
from edgeinfer.sim.metrics import write_ticks
from edgeinfer.sim.pacing import scaled_period_ns
from edgeinfer.sim.plots import write_plots
from edgeinfer.sim.preflight import check_run_fits, log_defaults, policy_shape
from edgeinfer.sim.report import print_table, write_report
from edgeinfer.sim.run_config import ReplayConfig
from edgeinfer.sim.run_mcap import run_mcap_section
from edgeinfer.sim.schedule import replay_ticks
from edgeinfer.sim.supervisor import safety_section

# a failed start: how long the Stop it sends a remote runtime has to leave before the context goes (LINGER 0)
ABORT_LINGER_S = 0.1


def load_log(path: Path | None, fmt: str | None = None, **options) -> ArmLog:
    """The log at `path` in any format sim.readers reads (fmt None: detected; options: the reader's, None
    ignored), or the embedded synthetic log when path is None. Raises LogError naming file and record."""
    if path is None:
        return synthetic_log()
    return read_log(path, fmt, **options)


def first_seconds(log: ArmLog, duration_s: float) -> ArmLog:
    """The rows of `log` recorded in its first `duration_s` seconds (t_s < t_s[0] + duration_s; at least one)."""
    n = max(1, int(np.searchsorted(log.t_s, log.t_s[0] + duration_s, side="left")))
    return log.rows(slice(0, n))


@dataclass
class Prepared:
    """What a replay or hil run runs on, read and checked before any process starts."""

    log: ArmLog  # the rows replayed (cut to duration_s)
    policy: dict  # preflight.policy_shape: n_joints, stride_ticks, horizon, ...
    limits: ResolvedLimits  # the joint limits the control loop gets (already set in cfg.control.limits)
    policy_defaults: dict | None  # report.json's "policy_defaults" (preflight.log_defaults)
    deadline_ms: float  # per-tick command deadline, ms
    period_ns: int  # the control period at the run's time scale, ns
    ticks: np.ndarray  # (N,) int64 control tick of each row, gaps over max_gap_s shortened
    shortened: dict  # schedule.replay_ticks: the gaps shortened (count, rows, ticks_removed, max_gap_s)

    @property
    def stride(self) -> int:
        """Control ticks per chunk step of the policy."""
        return self.policy["stride_ticks"]


def prepare(cfg: ReplayConfig, console: Console) -> Prepared:
    """Read the log (reader options: cfg's, else the policy manifest's; cut to cfg.duration_s), check that the policy
    runs on it (preflight.check_run_fits), resolve the joint limits into cfg.control.limits (the control node gets
    every value) and say their warnings on `console`, with the log's shortened gaps and a run.mcap the missing mcap
    library will skip. Raises LogError, ValueError as check_run_fits."""
    options, policy_defaults = log_defaults(cfg, console)
    log = load_log(cfg.log, cfg.log_format, **options)
    if cfg.duration_s is not None:
        log = first_seconds(log, cfg.duration_s)
    policy = policy_shape(cfg.runtime, log)
    period_ns = scaled_period_ns(log.period_ns, cfg.time_scale)
    deadline_ms = cfg.deadline_ms if cfg.deadline_ms is not None else period_ns / 1e6
    limits = check_run_fits(log, policy, cfg, deadline_ms)
    if replan := cfg.runtime.replan_every_ticks or policy["stride_ticks"]:  # the runtime's budget, refused here
        cfg.runtime.scheduler.resolved_budget_ms(replan, period_ns)       # and not at its Start, after the run
    cfg.control.limits = limits.limits
    for warning in limits.warnings:
        say(console, f"limits: {warning}", "yellow")
    # a gap of hours between two sessions of an export replays as max_gap_s, not in hours (reported)
    ticks, shortened = replay_ticks(log, cfg.max_gap_s)
    if shortened["count"]:
        say(console, f"log: {shortened['count']} gap(s) longer than --max-gap-s {cfg.max_gap_s:g} s replayed as "
                     f"{cfg.max_gap_s:g} s ({shortened['ticks_removed'] * log.period_ns / 1e9:.1f} s of log time cut; "
                     f"rows {shortened['rows']})", "yellow")
    if cfg.run_mcap and (why := missing_line("logs", "run.mcap (--run-mcap false skips it)", ("mcap",))):
        say(console, why, "yellow")  # said before the run; the file is skipped after it, silently
    return Prepared(log, policy, limits, policy_defaults, deadline_ms, period_ns, ticks, shortened)


class RunSession:
    """The processes and process state of one run, torn down in one place (a context manager).

    In the block: SIGINT and SIGTERM raise KeyboardInterrupt (core.lifecycle.InterruptSignals); measure_host() (before
    any node: none inherits its priority or loads it), start() the nodes (procs.nodes.NodeGroup `group`), realtime()
    for this process (the replayer), `ctx` the ZeroMQ context (opened at first use: after realtime()), defer()
    what the teardown must do first. On the way out, whatever raised, each step runs even if an earlier one failed:
    the signals ignored (a second Ctrl-C cannot cut the teardown short), the deferred calls (newest first), every
    node still running stopped (SIGTERM, SIGKILL after grace_s, descendants too), the context destroyed (LINGER 0),
    the normal scheduler and the CPUs this process had, the signal handlers there were.
    """

    def __init__(self, grace_s: float = 5.0):
        self.grace_s = grace_s
        self.host: dict | None = None  # measure_host's section
        self.priority = 0  # the SCHED_FIFO priority realtime() asked for
        self.rt_warning: str | None = None  # why realtime() got less than it asked for
        self.sched: dict[str, dict] = {}  # process -> host.sched_state: what each one got
        self._ctx: zmq.Context | None = None
        self._preload = None

    def __enter__(self) -> RunSession:
        self._deferred = ExitStack()
        self._cpus = sorted(os.sched_getaffinity(0))
        self._realtime = False
        self.group = NodeGroup(grace_s=self.grace_s)
        self.signals = InterruptSignals()
        return self

    def __exit__(self, *exc) -> None:
        self.signals.ignore()
        with ExitStack() as steps:  # run last registered first
            steps.callback(self.signals.restore)
            if self._realtime:
                steps.callback(clock.pin_to_cpus, self._cpus)
                steps.callback(clock.leave_realtime)
            if self._ctx is not None:
                steps.callback(self._ctx.destroy, linger=0)
            steps.callback(self.group.close)
            steps.push(self._deferred)

    def measure_host(self, period_ns: int, baseline_s: float, cpus: list[int] | None, priority: int) -> None:
        """self.host: host.measure_host's section (the machine and its wake-up baseline). Before start()."""
        self.host = measure_host(period_ns, baseline_s, cpus, priority)

    def start(self, *specs: NodeSpec) -> list[Node]:
        """Start each of `specs` (procs.nodes: in sessions of their own, logging to spec.log); the nodes. The first
        call also starts stats.preload (the figures at the end then need not wait for scipy's import): not before,
        or the import would load the CPU under measure_host's baseline."""
        if self._preload is None:
            self._preload = stats.preload()
        return [self.group.start(spec) for spec in specs]

    def realtime(self, cpus: list[int] | None, priority: int) -> None:
        """Pin this process to `cpus` and ask for SCHED_FIFO `priority` (best effort: rt_warning says what was
        refused; sched["replayer"] what it got). After the nodes started, before the context opens."""
        self._realtime = True
        self.priority = priority
        self.rt_warning = clock.enter_realtime(cpus, priority)
        self.sched["replayer"] = sched_state(0, priority)

    @property
    def ctx(self) -> zmq.Context:
        """The run's ZeroMQ context, opened at first use (its I/O thread inherits this process's priority and CPUs)."""
        if self._ctx is None:
            self._ctx = zmq.Context()
        return self._ctx

    def authenticate(self, keys) -> None:
        """For a CURVE run (keys: transport.CurveKeys; None: none), a ZAP handler on ctx accepting only the
        authorized client keys (transport.start_authenticator), stopped before the context is destroyed."""
        if (auth := transport.start_authenticator(self.ctx, keys)) is not None:
            self.defer(auth.stop)

    def defer(self, fn: Callable, *args, **kwargs) -> None:
        """Call fn(*args, **kwargs) at the teardown, before the nodes are stopped and the context destroyed (the
        newest first; one that raises does not keep the others from running)."""
        self._deferred.callback(fn, *args, **kwargs)


@dataclass
class RobotSockets:
    """The replayer's side of a run (the robot's), on its Endpoints: the observation PUB, the commands PULL, the
    handshake's ready PULL, and SUBs to the runtime's chunks and the control loop's status."""

    obs_pub: zmq.Socket
    cmd_rx: transport.Receiver
    ready_rx: transport.Receiver
    chunk_rx: transport.Receiver
    status_rx: transport.Receiver
    stop_msg: Stop | None = None  # the Stop sent at the end of the run (None: not yet)

    @classmethod
    def open(cls, ctx: zmq.Context, ep: transport.Endpoints, n_joints: int, keys=None,
             nodrop: bool = False) -> RobotSockets:
        """Bind the PUB and PULLs, connect the SUBs (CURVE with `keys`); commands and chunks must carry n_joints
        joints. nodrop: the PUB counts a full queue instead of dropping (transport.pub). Raises zmq.ZMQError."""
        return cls(transport.pub(ctx, ep.obs, bind=True, curve=keys, nodrop=nodrop),
                   transport.Receiver(transport.pull(ctx, ep.commands, bind=True, hwm=10_000, curve=keys),
                                      joints=n_joints),
                   transport.Receiver(transport.pull(ctx, ep.ready, bind=True, curve=keys)),
                   transport.Receiver(transport.sub(ctx, ep.chunks, hwm=10_000, curve=keys), joints=n_joints),
                   transport.Receiver(transport.sub(ctx, ep.status, hwm=10_000, curve=keys)))

    def handshake(self, timeout_s: float, check: Callable[[], None]) -> None:
        """Wait until the runtime and the control loop are subscribed and the runtime's chunks arrive (its Hello),
        calling check() every poll. Raises TimeoutError, HandshakeError (at once: a peer's CURVE handshake with any
        of the sockets failed for good), and whatever check() raises."""
        def checks() -> None:  # a CURVE mismatch with the runtime ends the wait before the control loop's does
            transport.check_handshakes(self.chunk_rx.sock, self.status_rx.sock, self.cmd_rx.sock)
            check()
        transport.wait_until_subscribed(self.obs_pub, "replayer", self.ready_rx, {"runtime", "control"}, timeout_s,
                                        check=checks)
        transport.wait_for_hello([self.chunk_rx], timeout_s, check=checks)

    def stop(self, interrupted: bool) -> None:
        """Tell the nodes the run is over: Stop("interrupted" or "end of log")."""
        self.stop_msg = Stop("interrupted" if interrupted else "end of log")
        transport.send(self.obs_pub, self.stop_msg)

    def repeat_stop(self) -> None:
        """The Stop again, for a late subscriber (NodeGroup.finish's poke)."""
        transport.send(self.obs_pub, self.stop_msg)

    def abort(self, reason: str) -> None:
        """A run that failed before its end: Stop(reason), so that a remote runtime need not wait for its timeout."""
        if self.stop_msg is None:
            transport.send(self.obs_pub, Stop(reason))
            time.sleep(ABORT_LINGER_S)


def robot_sections(report: dict, rec, prep: Prepared, run: RunSession, node_stats: dict, console: Console,
                   out: Path) -> None:
    """The report's sections every robot-side run has: node_stats, safety (every command checked), limits,
    policy_defaults, harness.replayer_priority (None: not granted) and host (with what each process got); then on
    `console` each node that exited non-zero (say_exit_codes) and a refused real-time priority."""
    report["node_stats"] = node_stats
    report["safety"] = safety_section(rec, prep.log, prep.limits, node_stats)
    report["limits"], report["policy_defaults"] = prep.limits.section(), prep.policy_defaults
    report["harness"]["replayer_priority"] = None if run.rt_warning else run.priority
    report["host"] = run.host | {"realtime": run.sched}
    say_exit_codes(console, report["process_exit_codes"], out)
    if run.rt_warning:
        say(console, f"replayer: {run.rt_warning}", "yellow")


def say_exit_codes(console: Console, exit_codes: dict[str, int | None], out: Path) -> None:
    """A red line for each process that exited non-zero, naming its log (out/<name>.log)."""
    for name, code in exit_codes.items():
        if code != 0:
            say(console, f"{name} process exited with code {code}; see {out / (name + '.log')}", "red")


def write_outputs(report: dict, per_tick: dict, rec, log: ArmLog, cfg, console: Console,
                  plots: Callable[[dict, dict, Path], None] | None = write_plots, stages: dict | None = None,
                  title: str = "edgeinfer replay") -> None:
    """Write a finished run under cfg.out: run.mcap (report["run_mcap"] says what was written, or why not; after the
    run: never timed), report.json, ticks.csv, plots(report, per_tick, cfg.out) (None: none), and the table on
    `console` under `title` (and a line saying so when the run was interrupted). stages: {stage: (n,) ms} for
    run.mcap's /tick instead of per_tick's (hil: this host's clock only)."""
    per_tick_mcap = per_tick if stages is None else per_tick | {"stages_ms": stages}
    report["run_mcap"] = run_mcap_section(rec, log, report, per_tick_mcap, cfg, console)
    write_report(report, cfg.out)
    write_ticks(per_tick, cfg.out / "ticks.csv")
    if plots is not None:
        plots(report, per_tick, cfg.out)
    print_table([report], console, title)
    if report.get("interrupted"):
        say(console, f"interrupted: {report['observations_sent']} of {len(rec.t_sched_ns)} observations sent; the "
                     "figures above cover those only (report.json: interrupted true)", "yellow")
