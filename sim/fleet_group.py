"""A robot-group process of a fleet replay (`edgeinfer fleet-robots`, started by sim/fleet_replay.py): several
robots (sim/fleet_robot.py) in one event loop, each with its own log, DEALER, schedule and control loop.

Start-up: connect every robot's DEALER, the SUB to the coordinator's PUB and a PUSH to its ready PULL; answer the
coordinator's Hellos (core/transport.py handshake), then wait for its Start(t0_ns): the common time origin of every
robot's schedule. At the end (or on the coordinator's Stop, SIGTERM, or its death) each robot's record goes to
out/<name>.npz (fleet_robot.save_record). A SIGKILL mid-run (the fault drill) leaves no record: the coordinator
reports the robot as killed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zmq

from edgeinfer.core import clock, transport
from edgeinfer.core.lifecycle import InterruptSignals, ParentWatch
from edgeinfer.core.logwriter import emit
from edgeinfer.core.wire import Start, Stop
from edgeinfer.logs import read_log
from edgeinfer.logs.arm_log import ArmLog, synthetic_log
from edgeinfer.sim.fleet_robot import RobotClient, RobotPlan, robot_socket, run_clients, save_record

SYNTHETIC = "synthetic"  # a log entry naming the embedded synthetic log (shifted by its log_shift_s)


@dataclass
class FleetRobotsConfig:
    """One robot-group process: per robot (lists of one length) its name, runtime endpoint, log, shift into the
    log, phase and join time; the schedule and budget they share; the coordinator's endpoints."""

    names: list[str]  # the robots' names (their DEALER routing ids)
    endpoints: list[str]  # each robot's fleet runtime (its ROUTER)
    logs: list[str]  # each robot's log: a path any reader reads, or "synthetic" (the embedded log)
    log_shift_s: list[float]  # each robot starts this far into its log, s
    phase_ns: list[int]  # each robot's offset on the replan grid, ns
    join_at_s: list[float]  # each robot sends its Join this long after the start, s
    stride_ticks: int  # the policy's control ticks per chunk step
    replan_every_ticks: int  # control ticks between a robot's requests
    duration_s: float  # each robot's run from its first request, s (its log looped when shorter)
    budget_ms: float  # the chunk budget each robot asks for, ms
    max_budget_ms: float  # the longest budget each accepts, ms
    start_endpoint: str  # the coordinator's PUB (Hello, Start, Stop)
    ready_endpoint: str  # the coordinator's PULL (ready reports)
    out: Path  # folder for the robots' records (<name>.npz)
    group: str = "robots"  # this process's name in the handshake
    join_lead_ms: float = 100.0  # a robot's first request comes at least this long after its Join, ms
    settle_ms: float = 100.0  # after a robot's last deadline and its Stop: chunks still on their way, ms
    keep_chunks: bool = False  # keep every chunk's steps_rad in the records (the exactness test)
    # SCHED_FIFO priority of this process (best effort; 0 = off): the robots stand in for sensor hardware, whose
    # timing the runtime under test must not delay (as the replayer's, sim/run_config.py)
    robot_priority: int = 70
    handshake_timeout_s: float = 300.0  # for the coordinator's Hello and Start, s

    def __post_init__(self):
        self.out = Path(self.out)
        n = len(self.names)
        for name in ("endpoints", "logs", "log_shift_s", "phase_ns", "join_at_s"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"FleetRobotsConfig.{name}: {len(getattr(self, name))} entries for {n} robots")
        if len(set(self.names)) != n:
            raise ValueError(f"FleetRobotsConfig.names: not unique: {self.names}")
        if not self.duration_s > 0 or not self.budget_ms > 0:
            raise ValueError("FleetRobotsConfig.duration_s and budget_ms must be > 0")


def robot_log(spec: str, shift_s: float, duration_s: float) -> ArmLog:
    """The log a robot replays: `spec` read (a path) or the synthetic log, from shift_s on, its times from 0.
    Raises LogError naming the file."""
    log = synthetic_log(seconds=shift_s + max(duration_s, 3.0) + 1.0) if spec == SYNTHETIC else read_log(spec)
    start = int(np.searchsorted(log.t_s, log.t_s[0] + shift_s))
    if start >= len(log) - 1:
        raise ValueError(f"{log.name}: a shift of {shift_s} s leaves fewer than 2 rows")
    log = log.rows(slice(start, None))
    log.t_s = log.t_s - log.t_s[0]
    return log


def plans(cfg: FleetRobotsConfig) -> list[RobotPlan]:
    out = []
    for i, name in enumerate(cfg.names):
        log = robot_log(cfg.logs[i], cfg.log_shift_s[i], cfg.duration_s)
        period = log.period_ns
        n_requests = max(1, round(cfg.duration_s * 1e9 / (cfg.replan_every_ticks * period)))
        out.append(RobotPlan(name, log, period, cfg.stride_ticks, cfg.replan_every_ticks, n_requests,
                             int(cfg.budget_ms * 1e6), int(cfg.max_budget_ms * 1e6), cfg.phase_ns[i],
                             int(cfg.join_at_s[i] * 1e9), int(cfg.join_lead_ms * 1e6), int(cfg.settle_ms * 1e6)))
    return out


def run_group(cfg: FleetRobotsConfig) -> int:
    """Run the group (see the module docstring); 0 when every robot finished, 1 when stopped early."""
    robot_plans = plans(cfg)  # before any socket: a bad log fails here, named
    cfg.out.mkdir(parents=True, exist_ok=True)
    signals = InterruptSignals()
    parent = ParentWatch()
    if warning := clock.try_realtime(cfg.robot_priority):  # before the context: its I/O thread inherits it
        emit(f"{cfg.group}: {warning}")
    ctx = zmq.Context()
    clients: list[RobotClient] = []
    stopped = False
    try:
        sub = transport.Receiver(transport.sub(ctx, cfg.start_endpoint))
        ready = transport.push(ctx, cfg.ready_endpoint)
        clients = [RobotClient(p, robot_socket(ctx, e, p.name)) for p, e in zip(robot_plans, cfg.endpoints)]
        transport.wait_for_hello([sub], cfg.handshake_timeout_s, check=parent.check)
        transport.announce_ready(ready, cfg.group)
        t0 = _await_start(sub, cfg.handshake_timeout_s, parent)

        def should_stop() -> bool:
            nonlocal stopped
            stopped = stopped or parent.parent_gone() or any(isinstance(m, Stop) for m in sub.drain())
            return stopped

        run_clients(clients, t0, should_stop)
    except KeyboardInterrupt:
        stopped = True
    finally:
        signals.ignore()
        for c in clients:
            save_record(c, cfg.out, cfg.keep_chunks)
        ctx.destroy(linger=0)
        signals.restore()
    return 1 if stopped else 0


def _await_start(sub: transport.Receiver, timeout_s: float, parent: ParentWatch) -> int:
    """The coordinator's Start: t0_ns. Raises TimeoutError, KeyboardInterrupt on its Stop."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        parent.check()
        msg = sub.recv(50)
        if isinstance(msg, Start):
            return msg.t0_ns
        if isinstance(msg, Stop):
            raise KeyboardInterrupt(f"stopped before the start: {msg.reason}")
    raise TimeoutError(f"no Start from the coordinator within {timeout_s} s")
