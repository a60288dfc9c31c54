"""Replay a recorded arm log through the runtime node and the control loop, as separate processes over
ZeroMQ, and measure every observation-to-command latency and deadline miss on the replayer's clock.

    replayer --Observation--> runtime --ActionChunk--> control --JointCommand--> replayer
        (PUB, at recorded times)   (PUB; the replayer listens too)    (PUSH)

Deadline miss: control tick n (one per recorded observation n) is a miss when, by the absolute deadline
t_sched[n] + deadline_ms on the replayer's clock, the replayer has not received a JointCommand for tick n
produced from a valid chunk. So a command that arrives late, one that never arrives (lost), and a
watchdog hold (no valid chunk covered the tick) are all misses. Every observation ends in exactly one
outcome: on_time, late, lost or hold.

Pre-roll: before the log's first row, the replayer streams pre_roll_ms of the arm at rest at the log's first
position (ticks 0..P-1; row i is then at tick P + its own), as a robot's state stream runs before control
engages. The control loop ticks through it; those ticks are start-up (metrics.start_up_section), and the
headline figures count the log's rows only.
"""
from __future__ import annotations

import gc
import math
import os
import select
import time
from dataclasses import dataclass, field, replace

import numpy as np
import zmq
from rich.console import Console

from edgeinfer.core import transport
from edgeinfer.core.clock import SpinTail, now_ns
from edgeinfer.core.progress import Progress, say
from edgeinfer.core.telemetry import stats_summary
from edgeinfer.core.wire import ActionChunk, JointCommand, Observation, Start, Stats, encode
from edgeinfer.engines.backends.engine import unavailable_reason
from edgeinfer.logs.arm_log import ArmLog
from edgeinfer.procs.node_spec import NodeSpec
from edgeinfer.sim.host import sched_state
from edgeinfer.sim.metrics import summarize
from edgeinfer.sim.network_faults import FaultInjector
from edgeinfer.sim.pacing import delivery_report, scaled_period_ns, send_timing_report, should_skip
from edgeinfer.sim.plots import write_plots
from edgeinfer.sim.received import Chunks, Commands
from edgeinfer.sim.report import engine_choice_section, replay_progress
from edgeinfer.sim.run_config import ReplayConfig
from edgeinfer.sim.run_mcap import wall_offset_ns
from edgeinfer.sim.schedule import extra_of, observation, previous_rows
from edgeinfer.sim.session import Prepared, RobotSockets, RunSession, prepare, robot_sections, write_outputs
from edgeinfer.sim.supervisor import Supervisor, gap_report, injected_section, stall_report

# chunk slots beyond one per replan (Recording.start): a restarted runtime plans on a new phase
CHUNK_SLOTS_SPARE = 64
# as fast as possible: how long a row waits for room in the observation queue before it is counted refused
AFAP_WAIT_NS = 1_000_000_000


@dataclass
class Recording:
    """What the replayer saw, all on its own clock (ns). Index i is a log row (one observation). What it received
    is kept in preallocated columns (sim/received.py), not as messages: its memory stays flat through the run."""

    t0_ns: int
    period_ns: int
    n_ticks: int
    tick: np.ndarray  # (N,) control tick of observation i
    t_sched_ns: np.ndarray  # (N,) scheduled send time of observation i: t0 + tick * period
    t_sent_ns: np.ndarray  # (N,) actual send time (0 = not sent: the run was interrupted)
    commands: Commands  # the first command for each tick 0..n_ticks-1
    chunks: Chunks  # the last chunk for each observation it was planned from
    skipped: np.ndarray | None = None  # (N,) bool: not sent, stale after a stall (t_sent = when skipped)
    pacing: dict = field(default_factory=dict)  # sim/pacing.send_timing_report
    faults: dict | None = None  # FaultInjector.report() when faults were injected
    # commands for a tick out of range or not yet due, or with another joint count: no real control loop sends those
    rejected_commands: int = 0
    duplicate_commands: int = 0  # a second command for a tick (the first one counts): a second sender?
    rejected_chunks: int = 0  # chunks with another joint count, or a field outside int64
    # observations (pre-roll and rows) handed to ZMQ, and those its full queue refused (obs PUB nodrop: counted)
    obs_sent: int = 0
    obs_refused: int = 0
    malformed: int = 0
    interrupted: bool = False
    node_stats: dict = field(default_factory=dict)  # sender -> its newest wire.Stats
    pre_roll_ticks: int = 0  # ticks 0..pre_roll_ticks-1 streamed the arm at rest before row 0 (see the docstring)
    pre_roll_skipped: int = 0  # pre-roll observations not sent: stale after a stall, as rows are skipped
    wall_offset_ns: int | None = None  # wall clock - this clock, taken once at the start (run.mcap's log times)

    @classmethod
    def start(cls, t0_ns: int, period_ns: int, ticks: np.ndarray, n_joints: int, chunk_steps: int,
              replan_every_ticks: int, pre_roll_ticks: int = 0) -> Recording:
        """The recording of a run whose rows fall on control ticks `ticks` (N,) int64 (after the pre_roll_ticks),
        scheduled at t0_ns + tick * period_ns, none sent yet; columns for a command of n_joints joints on every
        tick up to the last row's, and for a chunk of up to chunk_steps steps every replan_every_ticks. Every column is
        written now (np.full, not np.zeros: sim/received.py), so the RSS does not grow row by row through the run."""
        n_ticks = int(ticks[-1]) + 1
        return cls(t0_ns, period_ns, n_ticks, ticks, t0_ns + ticks * period_ns, np.full(len(ticks), 0, dtype=np.int64),
                   Commands(n_ticks, n_joints),
                   Chunks(n_ticks, chunk_steps, n_joints, -(-n_ticks // replan_every_ticks) + CHUNK_SLOTS_SPARE),
                   skipped=np.full(len(ticks), False), pre_roll_ticks=pre_roll_ticks, wall_offset_ns=wall_offset_ns())

    def add_command(self, t_recv_ns: int, cmd: JointCommand) -> None:
        """Keep the first command for each tick (received at t_recv_ns); count a second one (duplicate_commands)
        and one that no real control loop sends (rejected_commands: for a tick out of the run or not yet due, with
        another joint count, or with a field outside int64)."""
        try:
            if not (self.commands.fits(cmd) and t_recv_ns >= self.t0_ns + cmd.seq * self.period_ns):
                self.rejected_commands += 1
            elif not self.commands.put(t_recv_ns, cmd):
                self.duplicate_commands += 1
        except OverflowError:
            self.rejected_commands += 1

    def add_chunk(self, t_recv_ns: int, chunk: ActionChunk) -> None:
        """Keep chunk (received at t_recv_ns) as the last one of its observation; count one that does not fit
        (rejected_chunks: another joint count, a field outside int64)."""
        try:
            if self.chunks.fits(chunk):
                self.chunks.put(t_recv_ns, chunk)
            else:
                self.rejected_chunks += 1
        except OverflowError:
            self.rejected_chunks += 1


def replay(cfg: ReplayConfig, console: Console | None = None) -> dict:
    """Run one replay end to end; writes report.json, ticks.csv, the plots.PLOT_FILES PNGs and run.mcap
    (sim/run_mcap.py) under cfg.out.

    Returns the report dict. Raises LogError for a log the policy cannot run on, RuntimeError when a
    child process dies during start-up, TimeoutError when the handshake does not complete. SIGINT or
    SIGTERM during the run stop it early with a report of what was sent (`interrupted: true`).
    """
    console = console or Console()
    prep = prepare(cfg, console)
    _say_before_start(cfg, prep, console)
    ep = transport.Endpoints.free_loopback()
    with RunSession() as run:
        run.measure_host(prep.period_ns, cfg.host_baseline_s, cfg.control.control_cpus, cfg.replayer_priority)
        # Children first, so that they do not inherit the replayer's real-time priority: the runtime is the
        # system under test and runs as it would on the robot. ZMQ connects retry until the binds below exist.
        procs = run.start(*replay_nodes(cfg, ep))  # runtime, control
        # As fast as possible has no schedule to keep: at real-time priority its busy send loop would only starve
        # the ZMQ I/O thread (which inherits the priority, on the control loop's CPU) that has to ship the rows.
        run.realtime(cfg.control.control_cpus, 0 if cfg.as_fast_as_possible else cfg.replayer_priority)
        socks = RobotSockets.open(run.ctx, ep, prep.log.n_joints, nodrop=True)  # a full queue is known, never silent
        with Progress(f"starting runtime ({cfg.runtime.decode}) and control processes", console=console) as bar:
            # what the runtime is doing meanwhile (building its engine, waiting for another process's compile)
            socks.handshake(cfg.handshake_timeout_s, check=lambda: (run.group.check_started(procs),
                                                                     bar.update(detail=procs[0].status_line())))
        say(console, f"replaying {len(prep.log)} observations at {prep.log.rate_hz:.0f} Hz "
                     f"(about {(int(prep.ticks[-1]) + 1) * prep.period_ns / 1e9 + cfg.pre_roll_ms / 1e3:.1f} s)")
        # both nodes have opened (the control loop asks for its priority there): what each one got
        run.sched |= {"control": sched_state(procs[1].pid, cfg.control.realtime_priority),
                      "runtime": sched_state(procs[0].pid)}
        with replay_progress(console, len(prep.log), f"replaying at {prep.log.rate_hz:.0f} Hz") as progress:
            sup = Supervisor(socks.obs_pub, procs, cfg.kill_runtime_at_tick, cfg.restart_runtime_after_ms,
                             lambda: run.group.start(replace(procs[0].spec, log=cfg.out / "runtime.restarted.log")),
                             cfg.garbage_per_row, socks.status_rx, cfg.stall_runtime_at_tick, cfg.stall_runtime_ms,
                             spawn_cpus=cfg.runtime.runtime_cpus)
            run.defer(sup.release)  # never leave a stalled (SIGSTOPped) runtime behind
            rec = replay_rows(prep, socks, cfg, sup.on_row, progress)
            run.signals.ignore()  # a second Ctrl-C must not lose the report of the first
            socks.stop(rec.interrupted)
            sup.join()
            exit_codes = run.group.finish(procs, poke=socks.repeat_stop)
            drain(socks.cmd_rx, socks.chunk_rx, rec, socks.status_rx)
    report, per_tick = _report(cfg, prep, rec, run, sup, exit_codes, console)
    write_outputs(report, per_tick, rec, prep.log, cfg, console, write_plots if cfg.plots else None)
    return report


def _say_before_start(cfg: ReplayConfig, prep: Prepared, console: Console) -> None:
    """Refuse a backend this host cannot run; say what the run changes or skips, and what the runtime does before
    its first chunk (the wait for it is then explained); make cfg.out; assign the CPUs (cfg.pin_cpus)."""
    if cfg.runtime.byo_spec is None and (reason := unavailable_reason(cfg.runtime.backend, cfg.runtime.device)):
        raise RuntimeError(f"backend {cfg.runtime.backend!r} on {cfg.runtime.device}: {reason}")
    cfg.out.mkdir(parents=True, exist_ok=True)
    say(console, start_up_line(cfg.runtime))
    if cfg.pin_cpus:
        _assign_cpus(cfg)


def _report(cfg: ReplayConfig, prep: Prepared, rec: Recording, run: RunSession, sup: Supervisor,
            exit_codes: dict, console: Console) -> tuple[dict, dict]:
    """The report and per-tick arrays of a finished replay (sim.metrics.summarize, then the fault drills' effects,
    the engine auto chose, the delivery of every observation, session.robot_sections)."""
    report, per_tick = summarize(rec, prep.log, cfg, prep.deadline_ms, prep.stride)
    report["process_exit_codes"] = exit_codes
    report["replayer"]["log_source"]["gaps_shortened"] = prep.shortened
    outcome, n_rows = per_tick["outcome"], len(per_tick["outcome"])
    report["runtime_fault"] = gap_report(sup, outcome, rec.t_sched_ns, rec.period_ns, rec.commands)
    report["runtime_stall"] = stall_report(sup, outcome, per_tick["rung"], rec.t_sched_ns[:n_rows], rec.period_ns)
    report["injected"] = injected_section(cfg, report, sup)
    report["engine_choice"] = engine_choice_section(report, rec.node_stats.get("runtime"))  # backend auto
    if cfg.garbage_per_row:
        report["garbage_sent"] = sup.garbage_sent
    report["observations"] = delivery_report(rec)
    node_stats = {name: stats_summary(st) for name, st in sorted(rec.node_stats.items())}
    robot_sections(report, rec, prep, run, node_stats, console, cfg.out)
    return report, per_tick


def start_up_line(runtime) -> str:
    """What the runtime does before the first chunk, said before the replay waits for it (RuntimeConfig). The
    fused engine's first compile on a 2-core EPYC VM: 14.4 s idle, 53 s at load 5 (other jobs)."""
    if runtime.null_policy:
        return "runtime: starting (null policy)"
    if runtime.byo_spec is not None:
        return "runtime: loading the policy and warming it up"
    if runtime.backend == "auto":
        return ("runtime: opening the engine auto chose at an earlier start, or, on a first run here, compiling the "
                "CPU engines (15-60 s) and timing each exact engine to pick the fastest (seconds)")
    if runtime.backend in ("fused", "packed"):
        return (f"runtime: loading the {runtime.backend} engine (its first run on this machine compiles it: 15-60 s), "
                "then warming it up")
    return f"runtime: loading the {runtime.backend} engine and warming it up"


def _assign_cpus(cfg: ReplayConfig) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or cfg.runtime.runtime_cpus is not None or cfg.control.control_cpus is not None:
        return
    # the control loop gets the first CPU; the runtime the others, or every CPU when its engine shares a pass between
    # two threads (the packed engine: the control loop, at real-time priority, preempts its worker when it ticks)
    cfg.control.control_cpus = cpus[:1]
    cfg.runtime.runtime_cpus = cpus if (cfg.runtime.threads or 1) >= 2 and len(cpus) == 2 else cpus[1:]


def replay_nodes(cfg: ReplayConfig, ep: transport.Endpoints) -> list[NodeSpec]:
    """The nodes a replay starts, runtime then control, on endpoints `ep`, logging to cfg.out (procs.nodes
    starts them in sessions of their own: Ctrl-C reaches only the replayer, which stops them with a Stop
    message). `edgeinfer launch FILE --dry-run` prints them as a launch file."""
    return [NodeSpec("serve", (cfg.runtime, ep), "runtime", cfg.out / "runtime.log", cfg.fork_nodes),
            NodeSpec("control", (cfg.control, ep), "control", cfg.out / "control.log", cfg.fork_nodes)]


def stream(log: ArmLog, ticks: np.ndarray, stride: int, obs_pub, cmd_rx, chunk_rx, deadline_ms: float,
            settle_ms: float, on_row=None, pacing: ReplayConfig | None = None, progress=None,
            pre_roll_ms: float = 0.0, chunk_steps: int = 1) -> Recording:
    """Publish every sample at its tick on an absolute schedule (sim/pacing.py: time scale, skip-ahead after a
    stall unless catch_up, or as fast as possible), through the network fault injector when pacing.faults is
    active; stop early (keeping what was sent) on KeyboardInterrupt.

    First, pre_roll_ms (rounded up to whole ticks of the replay period) of the arm at rest at row 0's position,
    on the schedule whatever the pacing, outside the faults, on_row and the send-timing figures; the log's rows
    follow on the ticks after it (rec.tick = ticks + rec.pre_roll_ticks).

    The recording's columns are allocated before the first send, for chunks of chunk_steps steps (the policy's
    horizon + 1; a longer chunk widens them, a copy) planned every pacing.runtime.replan_every_ticks (None: stride)."""
    pacing = pacing or ReplayConfig()
    afap = pacing.as_fast_as_possible
    injector = FaultInjector(pacing.faults) if pacing.faults.active else None
    # A full collection of this process's heap (torch is imported) takes 100 ms or more: freeze what exists
    # (cheap; not collected now, which would burn that time at real-time priority) and keep the collector
    # off while streaming (reference counting still frees the rest).
    gc_was_enabled = gc.isenabled()
    gc.freeze()
    gc.disable()
    t0 = now_ns() + int(settle_ms * 1e6)
    period = scaled_period_ns(log.period_ns, pacing.time_scale)
    # A spin of at most a quarter period: the rest is slept, when the ZMQ I/O thread (same priority, same CPU)
    # ships what was sent; a spin of a whole period (200 us at --time-scale 20) starved it.
    tail = SpinTail(period, min_ns=min(200_000, period // 4))
    n_pre = math.ceil(pre_roll_ms * 1e6 / period)
    ticks = np.asarray(ticks) + n_pre
    replan = pacing.runtime.replan_every_ticks or stride
    rec = Recording.start(t0, period, ticks, log.n_joints, chunk_steps, replan, n_pre)
    prev = previous_rows(ticks, stride)
    transport.send(obs_pub, Start(t0, period, rec.n_ticks))
    try:
        _pre_roll(log, obs_pub, cmd_rx, chunk_rx, rec, tail)
        for i in range(len(log)):
            # encode before the wait, so that the send itself is all that happens at the due time
            frames = None if afap else encode(observation(log, ticks, prev, i, int(rec.t_sched_ns[i])))
            grabbed = [] if afap else _collect_until(int(rec.t_sched_ns[i]), cmd_rx, chunk_rx, rec,
                                                     injector=injector, pub=obs_pub, tail=tail)
            t = now_ns()
            rec.t_sent_ns[i] = t
            if afap:  # no schedule: stamped when sent (a stamp ahead of the clock is implausible to the nodes)
                rec.t_sched_ns[i] = t
                frames = encode(observation(log, ticks, prev, i, t))
            if not afap and should_skip(i, t, rec.t_sched_ns, pacing.catch_up):
                rec.skipped[i] = True  # stale after a stall: resume on schedule, no burst
                if injector is not None:
                    injector.skip(i)
            elif injector is None:
                # as fast as possible: as fast as the queue empties, never a silent drop; on a schedule, never late
                _send_frames(obs_pub, frames, rec, AFAP_WAIT_NS if afap else 0)
            else:
                injector.submit(i, frames, t, obs_pub)
            _collect(cmd_rx, chunk_rx, rec, grabbed)
            if on_row is not None:  # heartbeats and fault drills (sim/supervisor.py)
                on_row(i, rec)
            if progress is not None and i % 128 == 0:  # a progress bar, redrawn twice a second at 250 Hz
                progress(i)
        end = int(rec.t_sched_ns[-1]) + int(deadline_ms * 1e6) + 20_000_000
        _collect(cmd_rx, chunk_rx, rec, _collect_until(end, cmd_rx, chunk_rx, rec, injector=injector, pub=obs_pub))
    except KeyboardInterrupt:
        rec.interrupted = True
    finally:
        gc.unfreeze()
        if gc_was_enabled:
            gc.enable()
    if injector is not None:
        injector.flush(obs_pub)
        rec.faults = injector.report()
    rec.pacing = send_timing_report(rec.t_sched_ns, rec.t_sent_ns, rec.skipped, period, pacing.time_scale, afap,
                                    pacing.catch_up)
    return rec


def replay_rows(prep: Prepared, socks: RobotSockets, cfg: ReplayConfig, on_row, progress) -> Recording:
    """stream() the rows of a prepared run (session.prepare) on the replayer's sockets (session.RobotSockets), paced
    by cfg (a ReplayConfig: hil's replay_config()), into a Recording with columns for the policy's chunks."""
    return stream(prep.log, prep.ticks, prep.stride, socks.obs_pub, socks.cmd_rx, socks.chunk_rx, prep.deadline_ms,
                  cfg.settle_ms, on_row, pacing=cfg, progress=progress, pre_roll_ms=cfg.pre_roll_ms,
                  chunk_steps=prep.policy["horizon"] + 1)


def _pre_roll(log: ArmLog, obs_pub, cmd_rx, chunk_rx, rec: Recording, tail: SpinTail) -> None:
    """Ticks 0..rec.pre_roll_ticks-1: the arm at rest at row 0's position (q held, qd zero, the extra channels
    at row 0's values), each on its schedule; one whose successor is already due (after a stall) is skipped and
    counted, never burst."""
    q0, rest, extra0 = log.q_rad[0], np.zeros_like(log.qd_rad_s[0]), extra_of(log, 0)
    for k in range(rec.pre_roll_ticks):
        due = rec.t0_ns + k * rec.period_ns
        frames = encode(Observation(k, due, q0, rest, q0, *extra0))
        grabbed = _collect_until(due, cmd_rx, chunk_rx, rec, tail=tail)
        if now_ns() < due + rec.period_ns:
            _send_frames(obs_pub, frames, rec)
        else:
            rec.pre_roll_skipped += 1
        _collect(cmd_rx, chunk_rx, rec, grabbed)


def _send_frames(sock, frames: list, rec: Recording, wait_ns: int = 0) -> bool:
    """Send one observation on the obs PUB (nodrop: a full queue raises Again instead of dropping silently),
    retrying for up to wait_ns with 50 us sleeps, in which the ZMQ I/O thread ships the queue. Counted in
    rec.obs_sent, or rec.obs_refused when the queue stayed full (False)."""
    deadline = now_ns() + wait_ns
    while True:
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            rec.obs_sent += 1
            os.sched_yield()  # the ZMQ I/O thread (same real-time priority, same CPU) ships it now, not at our sleep
            return True
        except zmq.Again:
            if now_ns() >= deadline:
                rec.obs_refused += 1
                return False
            time.sleep(50e-6)


def _collect_until(deadline_ns: int, cmd_rx, chunk_rx, rec: Recording, spin_ns: int = 200_000,
                   injector: FaultInjector | None = None, pub=None, tail: SpinTail | None = None) -> list:
    """Timestamp arriving commands and chunks as they come until deadline_ns, then spin briefly so the
    next observation leaves on time. Delayed observations of `injector` that fall due meanwhile are sent on
    `pub` at their time (each wait ends at the earlier of the deadline and the next delayed send). With
    `tail`, the spin lasts tail.spin_ns and every timed-out sleep reports its wake-up lateness to it.
    Returns the messages that arrived during the spin, as (t_recv_ns, receiver, frames): pass them to _collect
    after the send.

    Waits with select() on the sockets' notification fds, which takes sub-ms timeouts (zmq_poll counts
    whole ms), so the process wakes only when a message arrives or the deadline nears. Those fds are
    edge-triggered: ZMQ_EVENTS is checked, and the sockets drained, before every wait.
    """
    while injector is not None and (due := injector.next_due_ns()) is not None and due < deadline_ns:
        grabbed = _collect_until(due, cmd_rx, chunk_rx, rec, spin_ns, tail=tail)
        injector.release(now_ns(), pub)
        _collect(cmd_rx, chunk_rx, rec, grabbed)
    spin_ns = tail.spin_ns if tail is not None else spin_ns
    socks = (cmd_rx.sock, chunk_rx.sock)
    fds = [s.getsockopt(zmq.FD) for s in socks]
    while True:
        remaining = deadline_ns - now_ns()
        if remaining <= spin_ns:
            break
        if any(s.getsockopt(zmq.EVENTS) & zmq.POLLIN for s in socks):
            _collect(cmd_rx, chunk_rx, rec)
            continue
        woke = select.select(fds, [], [], (remaining - spin_ns) / 1e9)
        if tail is not None and not woke[0]:  # a timed-out sleep: how late did the OS wake us?
            tail.woke(now_ns() - (deadline_ns - spin_ns))
    # The spin: a message that arrives now is taken off its socket with its receipt time but decoded after the
    # send, so that neither a chunk's decode delays the observation nor the send delays the message's time.
    # The last 30 us spin on the clock alone (a socket check costs a few us and would blur the send time).
    grabbed = []
    while (t := now_ns()) < deadline_ns:
        if deadline_ns - t < 30_000:
            continue
        for rx in (cmd_rx, chunk_rx):
            if rx.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                try:
                    grabbed.append((t, rx, rx.sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)))
                except zmq.Again:
                    pass
    return grabbed


def _collect(cmd_rx, chunk_rx, rec: Recording, grabbed: list = ()) -> None:
    """Record every queued command and chunk at its receipt time: now for what is still on the sockets, the
    time taken for `grabbed` (t_recv_ns, receiver, raw frames) messages taken off during a spin."""
    t = now_ns()
    # Receiver._decode counts a malformed message as drain() would
    early = [(tg, m) for tg, rx, frames in grabbed if (m := rx._decode(frames)) is not None]
    for t_msg, msg in early + [(t, m) for m in cmd_rx.drain()]:
        if isinstance(msg, JointCommand):
            rec.add_command(t_msg, msg)
    for t_msg, msg in early + [(t, m) for m in chunk_rx.drain()]:
        if isinstance(msg, ActionChunk):
            rec.add_chunk(t_msg, msg)
        elif isinstance(msg, Stats):
            rec.node_stats[msg.sender] = msg
    rec.malformed = cmd_rx.malformed + chunk_rx.malformed


def drain(cmd_rx, chunk_rx, rec: Recording, status_rx=None, limit: int = 256) -> None:
    """After the nodes exited (procs.nodes.NodeGroup.finish: Stop repeated, stragglers terminated): what is still
    queued. A node that died mid-run does not lose the run: its missing commands are already counted as misses,
    and the report records the exit code. The newest Stats of each node (their last one is sent at exit) land
    in rec.node_stats."""
    _collect(cmd_rx, chunk_rx, rec)
    for msg in status_rx.drain(limit=limit) if status_rx is not None else []:
        if isinstance(msg, Stats):
            rec.node_stats[msg.sender] = msg
