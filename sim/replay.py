"""Replay a recorded arm log through the runtime node and the control loop, as separate processes over
ZeroMQ, and measure every observation-to-command latency and deadline miss on the replayer's clock.

    replayer --Observation--> runtime --ActionChunk--> control --JointCommand--> replayer
        (PUB, at recorded times)   (PUB; the replayer listens too)    (PUSH)

Deadline miss: control tick n (one per recorded observation n) is a miss when, by the absolute deadline
t_sched[n] + deadline_ms on the replayer's clock, the replayer has not received a JointCommand for tick n
produced from a valid chunk. So a command that arrives late, one that never arrives (lost), and a
watchdog hold (no valid chunk covered the tick) are all misses. Every observation ends in exactly one
outcome: on_time, late, lost or hold.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zmq
from edgeinfer.control.loop import ControlConfig
from edgeinfer.engines.engine import unavailable_reason
from edgeinfer.sim.logs import ArmLog, LogError, read_schunk, synthetic_log
from edgeinfer.sim.metrics import summarize, write_ticks
from edgeinfer.sim.plots import write_plots
from edgeinfer.sim.report import print_table, replay_progress, write_report
from edgeinfer.sim.schedule import previous_rows, tick_grid
from rich.console import Console

from edgeinfer import clock, transport
from edgeinfer.clock import now_ns, sleep_until
from edgeinfer.config_cli import to_argv
from edgeinfer.lifecycle import PARENT_PID_ENV
from edgeinfer.runtime import RuntimeConfig
from edgeinfer.wire import ActionChunk, JointCommand, Observation, Start, Stop


@dataclass
class ReplayConfig:
    """log: a Schunk measurement directory; None replays the embedded synthetic log (fresh clones).
    deadline_ms: per-tick command deadline; None means one control period of the log."""

    log: Path | None = None
    out: Path = Path("out")
    deadline_ms: float | None = None
    settle_ms: float = 200.0
    handshake_timeout_s: float = 120.0
    kill_runtime_at_tick: int | None = None  # fault injection: SIGKILL the runtime when this row is sent
    replayer_priority: int = 50  # SCHED_FIFO priority of the replayer (best effort; 0 = off)
    # Pin the replayer and control loop to CPU 0 and the runtime to the others (when there are >= 2 and
    # the runtime/control CPU options are unset), so real-time wake-ups never preempt a decode.
    pin_cpus: bool = True
    # Service-level objective judged with confidence bounds, e.g. "p99<=5ms,miss<=0.1%" (see sim/slo.py)
    slo: str | None = None
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    control: ControlConfig = field(default_factory=ControlConfig)

    def __post_init__(self):
        self.out = Path(self.out)
        self.log = Path(self.log) if self.log is not None else None
        if self.deadline_ms is not None and not self.deadline_ms > 0:
            raise ValueError(f"ReplayConfig.deadline_ms must be > 0, got {self.deadline_ms}")
        if not 0 < self.settle_ms <= 60_000:
            raise ValueError(f"ReplayConfig.settle_ms must be in (0, 60000], got {self.settle_ms}")
        if not self.handshake_timeout_s > 0:
            raise ValueError(f"ReplayConfig.handshake_timeout_s must be > 0, got {self.handshake_timeout_s}")
        if self.kill_runtime_at_tick is not None and self.kill_runtime_at_tick < 0:
            raise ValueError(f"ReplayConfig.kill_runtime_at_tick must be >= 0, got {self.kill_runtime_at_tick}")
        if not 0 <= self.replayer_priority <= 99:
            raise ValueError(f"ReplayConfig.replayer_priority must be in 0..99, got {self.replayer_priority}")
        if self.slo is not None:
            from edgeinfer.sim.slo import parse_slo

            parse_slo(self.slo)  # raises SLOError (a ValueError) naming the bad term


@dataclass
class Recording:
    """What the replayer saw, all on its own clock (ns). Index i is a log row (one observation)."""

    t0_ns: int
    period_ns: int
    n_ticks: int
    tick: np.ndarray  # (N,) control tick of observation i
    t_sched_ns: np.ndarray  # (N,) scheduled send time of observation i: t0 + tick * period
    t_sent_ns: np.ndarray  # (N,) actual send time (0 = not sent: the run was interrupted)
    commands: dict[int, tuple[int, JointCommand]] = field(default_factory=dict)  # tick -> (t_recv, first command)
    chunks: list[tuple[int, ActionChunk]] = field(default_factory=list)  # (t_recv, chunk)
    rejected_commands: int = 0  # for a tick out of range or not yet due: no real control loop sends those
    duplicate_commands: int = 0  # a second command for a tick (the first one counts): a second sender?
    malformed: int = 0
    interrupted: bool = False


def load_log(path: Path | None) -> ArmLog:
    """The log at `path` (a Schunk measurement directory), or the embedded synthetic log when None."""
    if path is None:
        return synthetic_log()
    if not Path(path).is_dir():
        raise LogError(f"log directory not found: {path}")
    return read_schunk(path)


def policy_shape(runtime: RuntimeConfig, log: ArmLog) -> dict:
    """n_joints, stride_ticks (control ticks per chunk step) and control_rate_hz (None: any) of the policy the
    runtime will serve: the action-token policy's manifest, or a bring-your-own spec (one step per period)."""
    if runtime.byo_spec is not None:
        from edgeinfer.engines.byo import ByoSpec

        spec = ByoSpec.load(runtime.byo_spec, model=runtime.byo_model)
        return {"n_joints": spec.n_joints, "stride_ticks": max(1, round(log.rate_hz / spec.rate_hz)),
                "control_rate_hz": None}
    manifest = json.loads(runtime.policy.read_text())
    return {"n_joints": manifest["config"]["n_joints"], "stride_ticks": manifest["config"]["stride_ticks"],
            "control_rate_hz": manifest.get("control_rate_hz")}


def check_run_fits(log: ArmLog, policy: dict, cfg: ReplayConfig, deadline_ms: float) -> None:
    """Raise LogError when the policy (see policy_shape) cannot run on this log (joint count, control rate),
    ValueError when the control settings cannot (limits for another joint count, a phase past the deadline)."""
    if log.n_joints != policy["n_joints"]:
        raise LogError(f"{log.name}: log has {log.n_joints} joints, the policy expects {policy['n_joints']}")
    rate = policy["control_rate_hz"]
    if rate is not None and abs(log.rate_hz - rate) > 0.01 * rate:
        raise LogError(f"{log.name}: log rate {log.rate_hz:.1f} Hz, the policy was trained at {rate:.1f} Hz "
                       f"(its chunk step is {policy['stride_ticks']} ticks)")
    n_limits = {len(cfg.control.limits.q_min_rad), len(cfg.control.limits.q_max_rad)}
    if n_limits != {log.n_joints}:
        raise ValueError(f"SafetyLimits: q_min_rad/q_max_rad have {sorted(n_limits)} entries, the log has "
                         f"{log.n_joints} joints")
    if cfg.control.phase_ms >= deadline_ms:
        raise ValueError(f"ControlConfig.phase_ms={cfg.control.phase_ms} is not before the {deadline_ms} ms "
                         "deadline: every command would be late")


def replay(cfg: ReplayConfig, console: Console | None = None) -> dict:
    """Run one replay end to end; writes report.json, ticks.csv and the plots.PLOT_FILES PNGs under cfg.out.

    Returns the report dict. Raises LogError for a log the policy cannot run on, RuntimeError when a
    child process dies during start-up, TimeoutError when the handshake does not complete. SIGINT or
    SIGTERM during the run stop it early with a report of what was sent (`interrupted: true`).
    """
    console = console or Console()
    log = load_log(cfg.log)
    policy = policy_shape(cfg.runtime, log)
    deadline_ms = cfg.deadline_ms if cfg.deadline_ms is not None else log.period_ns / 1e6
    check_run_fits(log, policy, cfg, deadline_ms)
    if cfg.runtime.byo_spec is None and (reason := unavailable_reason(cfg.runtime.backend, cfg.runtime.device)):
        raise RuntimeError(f"backend {cfg.runtime.backend!r} on {cfg.runtime.device}: {reason}")
    stride = policy["stride_ticks"]
    ticks = tick_grid(log)
    cfg.out.mkdir(parents=True, exist_ok=True)
    if cfg.pin_cpus:
        _assign_cpus(cfg)
    ep = transport.Endpoints.free_loopback()
    previous = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    # Children first, so that they do not inherit the replayer's real-time priority: the runtime is the
    # system under test and runs as it would on the robot. ZMQ connects retry until the binds below exist.
    procs = [_spawn("serve", cfg.runtime, ep, cfg.out / "runtime.log"),
             _spawn("control", cfg.control, ep, cfg.out / "control.log")]
    # before the context: its I/O thread inherits both
    original_cpus = sorted(os.sched_getaffinity(0))
    rt_warning = clock.enter_realtime(cfg.control.control_cpus, cfg.replayer_priority)
    ctx = zmq.Context()
    try:
        obs_pub = transport.pub(ctx, ep.obs, bind=True)
        cmd_rx = transport.Receiver(transport.pull(ctx, ep.commands, bind=True, hwm=10_000))
        ready_rx = transport.Receiver(transport.pull(ctx, ep.ready, bind=True))
        chunk_rx = transport.Receiver(transport.sub(ctx, ep.chunks, hwm=10_000))
        with console.status(f"starting runtime ({cfg.runtime.decode}) and control processes"):
            transport.wait_until_subscribed(obs_pub, "replayer", ready_rx, {"runtime", "control"},
                                            cfg.handshake_timeout_s, check=lambda: _check_alive(procs, cfg.out))
            transport.wait_for_hello([chunk_rx], cfg.handshake_timeout_s)
        with replay_progress(console, len(log), f"replaying at {log.rate_hz:.0f} Hz") as progress:
            fault = (cfg.kill_runtime_at_tick, procs[0].kill) if cfg.kill_runtime_at_tick is not None else None
            rec = _stream(log, ticks, stride, obs_pub, cmd_rx, chunk_rx, deadline_ms, cfg.settle_ms, fault,
                          progress=progress)
            for s in previous:  # a second Ctrl-C must not lose the report of the first
                signal.signal(s, signal.SIG_IGN)
            transport.send(obs_pub, Stop("interrupted" if rec.interrupted else "end of log"))
            exit_codes = _finish(procs, cmd_rx, chunk_rx, rec)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        ctx.destroy(linger=0)
        clock.leave_realtime()
        clock.pin_to_cpus(original_cpus)
        for s, handler in previous.items():
            signal.signal(s, handler)
    report, per_tick = summarize(rec, log, cfg, deadline_ms, stride)
    report["process_exit_codes"] = exit_codes
    report["harness"]["replayer_priority"] = None if rt_warning else cfg.replayer_priority
    for role, code in exit_codes.items():
        if code != 0:
            console.print(f"[red]{role} process exited with code {code}; see {cfg.out / (role + '.log')}[/red]")
    if rt_warning:
        console.print(f"[yellow]replayer: {rt_warning}[/yellow]")
    write_report(report, cfg.out)
    write_ticks(per_tick, cfg.out / "ticks.csv")
    write_plots(report, per_tick, cfg.out)
    print_table([report], console)
    return report


def _assign_cpus(cfg: ReplayConfig) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or cfg.runtime.runtime_cpus is not None or cfg.control.control_cpus is not None:
        return
    cfg.control.control_cpus, cfg.runtime.runtime_cpus = cpus[:1], cpus[1:]


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _spawn(role: str, role_cfg, ep: transport.Endpoints, log_path: Path) -> subprocess.Popen:
    argv = [sys.executable, "-m", "edgeinfer", role, *to_argv(role_cfg), *to_argv(ep)]
    # A session of their own: Ctrl-C reaches only the replayer, which stops the children with a Stop message.
    env = {**os.environ, PARENT_PID_ENV: str(os.getpid())}  # the child exits if this process dies
    return subprocess.Popen(argv, stdout=log_path.open("w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, env=env)


def _check_alive(procs, out: Path) -> None:
    for p, role in zip(procs, ("runtime", "control")):
        if p.poll() is not None:
            tail = (out / f"{role}.log").read_text()[-2000:]
            raise RuntimeError(f"{role} process exited with code {p.returncode} during start-up:\n{tail}")


def _stream(log: ArmLog, ticks: np.ndarray, stride: int, obs_pub, cmd_rx, chunk_rx, deadline_ms: float,
            settle_ms: float, fault=None, progress=None) -> Recording:
    """Publish every sample at its tick on an absolute schedule; stop early (keeping what was sent) on
    KeyboardInterrupt."""
    t0 = now_ns() + int(settle_ms * 1e6)
    period = log.period_ns
    rec = Recording(t0, period, int(ticks[-1]) + 1, ticks, t0 + ticks * period, np.zeros(len(log), dtype=np.int64))
    prev = previous_rows(ticks, stride)
    transport.send(obs_pub, Start(t0, period, rec.n_ticks))
    try:
        for i in range(len(log)):
            _collect_until(int(rec.t_sched_ns[i]), cmd_rx, chunk_rx, rec)
            rec.t_sent_ns[i] = now_ns()
            obs = Observation(int(ticks[i]), int(rec.t_sched_ns[i]), log.q_rad[i], log.qd_rad_s[i], log.q_rad[prev[i]])
            transport.send(obs_pub, obs)
            if fault is not None and i == fault[0]:
                fault[1]()
            if progress is not None and i % 128 == 0:  # a progress bar, redrawn twice a second at 250 Hz
                progress(i)
        _collect_until(int(rec.t_sched_ns[-1]) + int(deadline_ms * 1e6) + 20_000_000, cmd_rx, chunk_rx, rec)
    except KeyboardInterrupt:
        rec.interrupted = True
    return rec


def _collect_until(deadline_ns: int, cmd_rx, chunk_rx, rec: Recording, spin_ns: int = 200_000) -> None:
    """Timestamp arriving commands and chunks as they come until deadline_ns, then spin briefly so the
    next observation leaves on time.

    Waits with select() on the sockets' notification fds, which takes sub-ms timeouts (zmq_poll counts
    whole ms), so the process wakes only when a message arrives or the deadline nears. Those fds are
    edge-triggered: ZMQ_EVENTS is checked, and the sockets drained, before every wait.
    """
    socks = (cmd_rx.sock, chunk_rx.sock)
    fds = [s.getsockopt(zmq.FD) for s in socks]
    while True:
        if any(s.getsockopt(zmq.EVENTS) & zmq.POLLIN for s in socks):
            _collect(cmd_rx, chunk_rx, rec)
            continue
        remaining = deadline_ns - now_ns()
        if remaining <= spin_ns:
            break
        select.select(fds, [], [], (remaining - spin_ns) / 1e9)
    sleep_until(deadline_ns, spin_ns)


def _collect(cmd_rx, chunk_rx, rec: Recording) -> None:
    t = now_ns()
    for msg in cmd_rx.drain():
        if not isinstance(msg, JointCommand):
            continue
        if not (0 <= msg.seq < rec.n_ticks and t >= rec.t0_ns + msg.seq * rec.period_ns):
            rec.rejected_commands += 1
        elif msg.seq in rec.commands:
            rec.duplicate_commands += 1
        else:
            rec.commands[msg.seq] = (t, msg)
    for msg in chunk_rx.drain():
        if isinstance(msg, ActionChunk):
            rec.chunks.append((t, msg))
    rec.malformed = cmd_rx.malformed + chunk_rx.malformed


def _finish(procs, cmd_rx, chunk_rx, rec: Recording, timeout_s: float = 10.0) -> dict[str, int]:
    """Wait for both children to exit after Stop (terminate stragglers); return their exit codes.

    A child that died mid-run does not lose the run: its missing commands are already counted as
    misses, and the report records the exit code.
    """
    for p in procs:
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.terminate()
            p.wait(timeout=5)
    _collect(cmd_rx, chunk_rx, rec)
    return {role: p.returncode for p, role in zip(procs, ("runtime", "control"))}
