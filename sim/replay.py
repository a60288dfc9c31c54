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
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zmq
from edgeinfer.control.loop import ControlConfig
from edgeinfer.sim.logs import ArmLog, read_schunk, synthetic_log
from edgeinfer.sim.metrics import summarize, write_ticks
from edgeinfer.sim.report import plot_latency, print_table, write_report
from rich.console import Console

from edgeinfer import transport
from edgeinfer.clock import now_ns, sleep_until
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
    kill_runtime_at_tick: int | None = None  # fault injection: SIGKILL the runtime when this tick is sent
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    control: ControlConfig = field(default_factory=ControlConfig)

    def __post_init__(self):
        self.out = Path(self.out)
        self.log = Path(self.log) if self.log is not None else None
        if self.deadline_ms is not None and self.deadline_ms <= 0:
            raise ValueError(f"ReplayConfig.deadline_ms must be > 0, got {self.deadline_ms}")


@dataclass
class Recording:
    """What the replayer saw, all on its own clock (ns)."""

    t_sched_ns: np.ndarray  # (N,) scheduled send time of observation n
    t_sent_ns: np.ndarray  # (N,) actual send time
    commands: dict[int, tuple[int, JointCommand]] = field(default_factory=dict)  # tick -> (t_recv, first command)
    chunks: list[tuple[int, ActionChunk]] = field(default_factory=list)  # (t_recv, chunk)
    malformed: int = 0


def load_log(path: Path | None) -> ArmLog:
    return synthetic_log() if path is None else read_schunk(path)


def replay(cfg: ReplayConfig, console: Console | None = None) -> dict:
    """Run one replay end to end; writes cfg.out/report.json and latency.png. Returns the report dict."""
    console = console or Console()
    log = load_log(cfg.log)
    deadline_ms = cfg.deadline_ms if cfg.deadline_ms is not None else log.period_ns / 1e6
    stride = json.loads(cfg.runtime.policy.read_text())["config"]["stride_ticks"]
    cfg.out.mkdir(parents=True, exist_ok=True)
    ep = transport.Endpoints.free_loopback()
    ctx = zmq.Context()
    procs: list[subprocess.Popen] = []
    try:
        obs_pub = transport.pub(ctx, ep.obs, bind=True)
        cmd_rx = transport.Receiver(transport.pull(ctx, ep.commands, bind=True, hwm=10_000))
        ready_rx = transport.Receiver(transport.pull(ctx, ep.ready, bind=True))
        chunk_rx = transport.Receiver(transport.sub(ctx, ep.chunks, hwm=10_000))
        procs = [_spawn("serve", cfg.runtime, ep, cfg.out / "runtime.log"),
                 _spawn("control", cfg.control, ep, cfg.out / "control.log")]
        with console.status(f"starting runtime ({cfg.runtime.decode}) and control processes"):
            transport.wait_until_subscribed(obs_pub, "replayer", ready_rx, {"runtime", "control"},
                                            cfg.handshake_timeout_s, check=lambda: _check_alive(procs, cfg.out))
            transport.wait_for_hello([chunk_rx], cfg.handshake_timeout_s)
        with console.status(f"replaying {len(log)} observations at {log.rate_hz:.0f} Hz"):
            fault = (cfg.kill_runtime_at_tick, procs[0].kill) if cfg.kill_runtime_at_tick is not None else None
            rec = _stream(log, stride, obs_pub, cmd_rx, chunk_rx, deadline_ms, cfg.settle_ms, fault)
            transport.send(obs_pub, Stop("end of log"))
            exit_codes = _finish(procs, cmd_rx, chunk_rx, rec)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        ctx.destroy(linger=0)
    report, ticks = summarize(rec, log, cfg, deadline_ms, stride)
    report["process_exit_codes"] = exit_codes
    for role, code in exit_codes.items():
        if code != 0:
            console.print(f"[red]{role} process exited with code {code}; see {cfg.out / (role + '.log')}[/red]")
    write_report(report, cfg.out)
    write_ticks(ticks, cfg.out / "ticks.csv")
    plot_latency(ticks["latency_ms"], deadline_ms, ticks["outcome"] != "on_time", cfg.out / "latency.png",
                 f"{report['log']} ({report['decode']})")
    print_table([report], console)
    return report


def _spawn(role: str, role_cfg, ep: transport.Endpoints, log_path: Path) -> subprocess.Popen:
    from edgeinfer.config_cli import to_argv  # the child rebuilds the same dataclasses from these options

    argv = [sys.executable, "-m", "edgeinfer", role, *to_argv(role_cfg), *to_argv(ep)]
    return subprocess.Popen(argv, stdout=log_path.open("w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _check_alive(procs, out: Path) -> None:
    for p, role in zip(procs, ("runtime", "control")):
        if p.poll() is not None:
            tail = (out / f"{role}.log").read_text()[-2000:]
            raise RuntimeError(f"{role} process exited with code {p.returncode} during start-up:\n{tail}")


def _stream(log: ArmLog, stride: int, obs_pub, cmd_rx, chunk_rx, deadline_ms: float, settle_ms: float,
            fault=None) -> Recording:
    n = len(log)
    t0 = now_ns() + int(settle_ms * 1e6)
    t_sched = t0 + np.round(log.t_s * 1e9).astype(np.int64)
    rec = Recording(t_sched, np.zeros(n, dtype=np.int64))
    transport.send(obs_pub, Start(t0, log.period_ns, n))
    for i in range(n):
        _collect_until(int(t_sched[i]), cmd_rx, chunk_rx, rec)
        q_prev = log.q_rad[max(i - stride, 0)]
        rec.t_sent_ns[i] = now_ns()
        transport.send(obs_pub, Observation(i, int(t_sched[i]), log.q_rad[i], log.qd_rad_s[i], q_prev))
        if fault is not None and i == fault[0]:
            fault[1]()
    _collect_until(int(t_sched[-1]) + int(deadline_ms * 1e6) + 20_000_000, cmd_rx, chunk_rx, rec)
    return rec


def _collect_until(deadline_ns: int, cmd_rx, chunk_rx, rec: Recording, spin_ns: int = 300_000) -> None:
    """Timestamp arriving commands and chunks as they come (poll, not per tick) until deadline_ns,
    ending with a short spin so the next observation leaves on time."""
    poller = zmq.Poller()
    poller.register(cmd_rx.sock, zmq.POLLIN)
    poller.register(chunk_rx.sock, zmq.POLLIN)
    while (remaining := deadline_ns - now_ns()) > spin_ns:
        wait_ms = int((remaining - spin_ns) / 1e6)  # zmq_poll counts whole ms
        if poller.poll(wait_ms):
            _collect(cmd_rx, chunk_rx, rec)
        elif wait_ms == 0:
            time.sleep(50e-6)  # sub-ms tail: short naps bound the timestamp error to ~0.1 ms
    _collect(cmd_rx, chunk_rx, rec)
    sleep_until(deadline_ns, spin_ns)


def _collect(cmd_rx, chunk_rx, rec: Recording) -> None:
    t = now_ns()
    for msg in cmd_rx.drain():
        if isinstance(msg, JointCommand):
            rec.commands.setdefault(msg.seq, (t, msg))
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
