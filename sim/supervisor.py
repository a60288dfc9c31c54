"""The replayer's side of liveliness and fault drills: its Heartbeat on the observation PUB (which also tells
a runtime that joins mid-run the schedule), stalling the runtime (SIGSTOP, SIGCONT) at a row, killing it
at a row, restarting it after a pause, and the reports of the gaps those leave.
"""
from __future__ import annotations

import os
import signal
import threading
from typing import Callable

import numpy as np
import zmq

from edgeinfer.core import clock, transport
from edgeinfer.core.clock import now_ns, sleep_until
from edgeinfer.core.wire import MAX_HEADER_BYTES, Heartbeat, Observation, Stats, encode
from edgeinfer.sim.received import HOLD, NONE, Commands

HEARTBEAT_PERIOD_MS = 20.0
LEASE_MS = 100.0
# malformed messages a drill sends (ReplayConfig.garbage_per_row), by the wire.ERROR_KINDS each must be counted as
GARBAGE_KINDS = ("garbage", "truncated", "version", "oversize", "frames", "nonfinite")


def malformed(kind: str, seq: int) -> list[bytes]:
    """Raw frames of one malformed message of `kind` (an Observation gone wrong; seq past the run's ticks, so
    that one decoded by mistake could never pass for a real observation)."""
    q = np.zeros(6)
    frames = [bytes(f) for f in encode(Observation(seq, 0, q, q, q))]
    if kind == "garbage":
        return [b"\xc1 not msgpack"]
    if kind == "truncated":
        return [frames[0][: len(frames[0]) // 2], *frames[1:]]
    if kind == "version":
        return [frames[0].replace(b"\xa7version\x01", b"\xa7version\x63"), *frames[1:]]
    if kind == "oversize":  # every 16th an oversize header, the others an array frame one value too long
        return [b"\x00" * (MAX_HEADER_BYTES + 1)] if seq % 16 == 0 else [*frames[:-1], frames[-1] + bytes(8)]
    if kind == "frames":
        return [*frames, frames[-1]]
    if kind == "nonfinite":
        return [*frames[:-1], np.full(6, np.nan).tobytes()]
    raise ValueError(f"unknown malformed kind {kind!r}; known: {GARBAGE_KINDS}")


class Supervisor:
    """Called once per streamed row (`on_row(i, rec)`, after observation i is sent).

    Publishes the replayer's Heartbeat (with the run's t0/period/n_ticks) every HEARTBEAT_PERIOD_MS;
    SIGSTOPs procs[0] (the runtime) when row `stall_at_row` has been sent and SIGCONTs it `stall_ms` later
    (from a thread that sleeps to that absolute time, so the stall does not round to whole rows);
    SIGKILLs procs[0] when row `kill_at_row` has been sent; `restart_after_ms` later, starts a new runtime
    with `spawn()` (the replay's procs.nodes.NodeGroup.start, so that its teardown covers the new one too;
    from a thread, so the replayer's schedule does not wait on fork/exec) and puts it in procs[0]. procs: the
    started nodes (procs.nodes.Node), runtime first. Times are on the replayer's clock (ns). `release()`
    resumes a stalled runtime at once: call it on every way out (end of log, Ctrl-C, an error), so that no
    process is left stopped.
    """

    def __init__(self, obs_pub, procs: list, kill_at_row: int | None, restart_after_ms: float | None,
                 spawn: Callable[[], object], garbage_per_row: int = 0, status_rx=None,
                 stall_at_row: int | None = None, stall_ms: float | None = None, spawn_cpus: list[int] | None = None):
        self.obs_pub, self.procs, self.kill_at_row = obs_pub, procs, kill_at_row
        self.stall_at_row = stall_at_row
        self.stall_ns = int(stall_ms * 1e6) if stall_ms is not None else 0
        self.stalled = None  # the stopped process
        self.stalled_row = self.stalled_tick = -1
        self.t_stop_ns: int | None = None  # SIGSTOP sent
        self.t_cont_ns: int | None = None  # SIGCONT sent
        self._stall_lock = threading.Lock()
        self._resumer: threading.Thread | None = None
        self.status_rx = status_rx  # the control loop's status SUB: read every 25 rows, so its queue never fills
        self.garbage_per_row = garbage_per_row
        self.garbage_sent: dict[str, int] = {kind: 0 for kind in GARBAGE_KINDS}
        self.restart_after_ns = int(restart_after_ms * 1e6) if restart_after_ms is not None else None
        self.spawn, self.spawn_cpus = spawn, spawn_cpus
        self.killed = None  # the killed process
        self.killed_row = self.killed_tick = -1  # the row (and its tick) after whose send it was killed
        self.t_kill_ns: int | None = None
        self.t_restart_ns: int | None = None
        self._restarter: threading.Thread | None = None
        self._next_beat_ns = 0
        self._seq = 0

    def on_row(self, i: int, rec) -> None:
        t = now_ns()
        if self.status_rx is not None and i % 25 == 0:
            self.take_status(rec)
        if t >= self._next_beat_ns:
            self._next_beat_ns = t + int(HEARTBEAT_PERIOD_MS * 1e6)
            self._seq += 1
            transport.send(self.obs_pub, Heartbeat("replayer", os.getpid(), self._seq, t, int(LEASE_MS * 1e6), -1,
                                                   rec.t0_ns, rec.period_ns, rec.n_ticks))
        for _ in range(self.garbage_per_row):
            kind = GARBAGE_KINDS[sum(self.garbage_sent.values()) % len(GARBAGE_KINDS)]
            try:
                self.obs_pub.send_multipart(malformed(kind, rec.n_ticks + i), flags=zmq.NOBLOCK)
            except zmq.Again:  # the obs PUB is nodrop: its queue is full, and garbage never waits
                continue
            self.garbage_sent[kind] += 1
        if self.stall_at_row is not None and i >= self.stall_at_row and self.stalled is None:  # a skipped row too
            self._stall(i, int(rec.tick[i]))
        if self.kill_at_row is not None and i >= self.kill_at_row and self.killed is None:  # a skipped row too
            self.killed, self.killed_row, self.killed_tick = self.procs[0], i, int(rec.tick[i])
            self.killed.kill()
            self.t_kill_ns = now_ns()
        elif (self.t_kill_ns is not None and self.restart_after_ns is not None and self._restarter is None
              and t >= self.t_kill_ns + self.restart_after_ns):
            self.t_restart_ns = t
            self._restarter = threading.Thread(target=self._restart, daemon=True)
            self._restarter.start()

    def _stall(self, row: int, tick: int) -> None:
        proc = self.procs[0]
        if proc.poll() is not None:  # already dead (killed earlier): nothing to stop
            self.stalled, self.stalled_row, self.stalled_tick = proc, row, tick
            return
        with self._stall_lock:
            os.kill(proc.pid, signal.SIGSTOP)
            self.t_stop_ns = now_ns()
            self.stalled, self.stalled_row, self.stalled_tick = proc, row, tick
        self._resumer = threading.Thread(target=self._resume_at, args=(self.t_stop_ns + self.stall_ns,), daemon=True)
        self._resumer.start()

    def _resume_at(self, t_ns: int) -> None:
        sleep_until(t_ns, spin_ns=50_000)
        self.release()

    def release(self) -> None:
        """SIGCONT the stalled runtime if it is still stopped (idempotent; safe from any thread)."""
        with self._stall_lock:
            if self.t_stop_ns is None or self.t_cont_ns is not None:
                return
            if self.stalled.poll() is None:  # not reaped (a reaped pid could be reused)
                try:
                    os.kill(self.stalled.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            self.t_cont_ns = now_ns()

    def take_status(self, rec) -> None:
        """The newest Stats of each node on the status SUB into rec.node_stats (Heartbeats are dropped)."""
        for msg in self.status_rx.drain(limit=10_000):
            if isinstance(msg, Stats):
                rec.node_stats[msg.sender] = msg

    def _restart(self) -> None:
        # This thread inherited the replayer's SCHED_FIFO priority and CPU, and a child inherits both from it:
        # a new runtime would import torch at real-time priority on the replayer's CPU and stall the run.
        clock.leave_realtime()
        clock.pin_to_cpus(self.spawn_cpus)
        self.killed.wait()  # reaped before its successor binds the same port
        self.procs[0] = self.spawn()

    def join(self) -> None:
        """Wait for a pending restart; resume a runtime still stalled (a log that ended inside the stall)."""
        self.release()
        if self._resumer is not None:
            self._resumer.join(timeout=5)
        if self._restarter is not None:
            self._restarter.join(timeout=30)


def gap_report(sup: Supervisor, outcome: np.ndarray, t_sched_ns: np.ndarray, period_ns: int,
               commands: Commands | None = None) -> dict | None:
    """The gap a killed runtime left, from per-row outcomes (on_time/late/lost/hold) on the replayer's clock:
    rows until the first hold after the kill, rows, holds and misses until recovery (or the end of the run:
    rows_in_gap, ticks_held, misses_in_gap), the longest run of holds (ms),
    and the time from the kill to the first on-time command after the restart. From `commands` (every command
    received, sim/received.Commands): how long after the kill the control loop sent its first hold
    (`first_hold_after_kill_ms`, on the control loop's send time: same host clock) and how many commands it
    sent more than two control periods after the kill from a chunk the dead runtime planned
    (`unheld_after_two_periods`: 0 when it held in time). None when nothing was killed."""
    if sup.t_kill_ns is None:
        return None
    first_hold, unheld = None, 0
    if commands is not None:
        after = (commands.rung != NONE) & (commands.t_ns > sup.t_kill_ns)
        hold = commands.rung == HOLD
        first_hold = int(commands.t_ns[after & hold].min()) if (after & hold).any() else None
        # a command from a chunk of the dead runtime (planned from an observation up to the kill), sent late
        unheld = int(np.sum(after & ~hold & (commands.t_ns > sup.t_kill_ns + 2 * period_ns)
                            & (commands.chunk_obs_seq <= sup.killed_tick)))
    k = sup.killed_row
    rows = np.arange(len(outcome))
    after = rows > k
    holds = np.flatnonzero(after & (outcome == "hold"))
    restarted = sup.t_restart_ns is not None
    recovered = np.flatnonzero(after & (outcome == "on_time") & (rows > (holds[0] if len(holds) else k)))
    end = int(recovered[0]) if restarted and len(recovered) else len(outcome)
    gap = slice(k + 1, end)
    longest, run = 0, 0
    for o in outcome[gap]:
        run = run + 1 if o == "hold" else 0
        longest = max(longest, run)
    return {"killed_at_row": int(k),
            "restart_after_ms": (sup.t_restart_ns - sup.t_kill_ns) / 1e6 if restarted else None,
            "killed_exit_code": sup.killed.returncode,
            "rows_to_first_hold": int(holds[0] - k) if len(holds) else None,
            "first_hold_after_kill_ms": (first_hold - sup.t_kill_ns) / 1e6 if first_hold is not None else None,
            "unheld_after_two_periods": unheld,
            "rows_in_gap": max(0, end - k - 1),
            "ticks_held": int(np.sum(outcome[gap] == "hold")), "misses_in_gap": int(np.sum(outcome[gap] != "on_time")),
            "longest_hold_ms": longest * period_ns / 1e6,
            "recovered": bool(restarted and len(recovered)),
            "time_to_recover_ms": ((t_sched_ns[end] - sup.t_kill_ns) / 1e6 if restarted and len(recovered) else None)}


def stall_report(sup: Supervisor, outcome: np.ndarray, rung: np.ndarray, t_sched_ns: np.ndarray,
                 period_ns: int, after_ms: float = 200.0) -> dict | None:
    """What a runtime stall (SIGSTOP .. SIGCONT) did, from per-row outcomes and rungs (on_time/late/lost/hold;
    the command's rung, "" when lost), on the replayer's clock. Three windows of rows, by scheduled time:
    `before` (as long as the stall, just before it), `during` (SIGSTOP to SIGCONT) and `after` (after_ms
    from SIGCONT, when the runtime catches up). Each: rows, misses, outcomes and rungs. None when nothing
    was stalled (no stall asked, or the runtime was already dead at that row)."""
    if sup.t_stop_ns is None:
        return None
    t_cont = sup.t_cont_ns if sup.t_cont_ns is not None else sup.t_stop_ns + sup.stall_ns
    stopped_ns = t_cont - sup.t_stop_ns
    rows = np.arange(len(outcome))
    windows = {"before": (t_sched_ns >= sup.t_stop_ns - stopped_ns) & (t_sched_ns < sup.t_stop_ns),
               "during": (t_sched_ns >= sup.t_stop_ns) & (t_sched_ns < t_cont) & (rows > sup.stalled_row),
               "after": (t_sched_ns >= t_cont) & (t_sched_ns < t_cont + int(after_ms * 1e6))}

    def window(sel: np.ndarray) -> dict:
        o, r = outcome[sel], rung[sel]
        return {"rows": int(sel.sum()), "misses": int(np.sum(o != "on_time")),
                "outcomes": {k: int(np.sum(o == k)) for k in ("on_time", "late", "lost", "hold")},
                "rungs": {(k or "none"): int(np.sum(r == k)) for k in dict.fromkeys(r.tolist())}}
    return {"stalled_at_row": int(sup.stalled_row), "stalled_at_tick": int(sup.stalled_tick),
            "stall_ms": sup.stall_ns / 1e6, "stopped_ms": stopped_ns / 1e6,
            "resumed": sup.t_cont_ns is not None, "after_ms": after_ms,
            "window": {name: window(sel) for name, sel in windows.items()}}


def injected_section(cfg, report: dict, sup: Supervisor) -> dict:
    """The report's "injected": every fault this run injected, in one place, each None when off. network: the
    kinds and counts on the observation stream (details in replayer.faults); runtime_stall: asked and done
    (effect in runtime_stall); runtime_kill: asked and done (effect in runtime_fault); garbage_per_row."""
    faults = (report.get("replayer") or {}).get("faults")
    stall = kill = None
    if cfg.stall_runtime_at_tick is not None:
        stall = {"at_row": cfg.stall_runtime_at_tick, "stall_ms": cfg.stall_runtime_ms,
                 "done_at_row": sup.stalled_row if sup.t_stop_ns is not None else None,
                 "stopped_ms": (sup.t_cont_ns - sup.t_stop_ns) / 1e6 if sup.t_cont_ns is not None else None}
    if cfg.kill_runtime_at_tick is not None:
        kill = {"at_row": cfg.kill_runtime_at_tick, "restart_after_ms": cfg.restart_runtime_after_ms,
                "done_at_row": sup.killed_row if sup.t_kill_ns is not None else None,
                "restarted": sup.t_restart_ns is not None}
    network = None if faults is None else {"seed": faults["seed"], "counts": faults["counts"]}
    return {"network": network, "runtime_stall": stall, "runtime_kill": kill,
            "garbage_per_row": cfg.garbage_per_row or None}


def safety_report(commands: Commands, q_min_rad, q_max_rad, qd_max_rad_s, period_ns: int) -> dict:
    """The replayer's own check of every command it received (sim/received.Commands): non-finite values,
    positions outside [q_min, q_max] (D,), and steps between consecutive ticks faster than qd_max (one for every
    joint or (D,); 1e-9 rad of rounding allowed)."""
    ticks = commands.ticks()
    if not len(ticks):  # a run stopped before its first command: nothing to check, and nothing unsafe was sent
        return {"commands_checked": 0, "nonfinite": 0, "outside_position_limits": 0, "over_velocity_limit": 0}
    q = commands.q_rad[ticks]
    finite = np.isfinite(q).all(axis=1)
    outside = (q < np.asarray(q_min_rad) - 1e-9) | (q > np.asarray(q_max_rad) + 1e-9)
    consecutive = np.diff(ticks) == 1
    step = np.abs(np.diff(q, axis=0)) if len(ticks) > 1 else np.zeros((0, q.shape[1]))
    too_fast = consecutive & (step > np.asarray(qd_max_rad_s) * period_ns / 1e9 + 1e-9).any(axis=1)
    return {"commands_checked": len(ticks), "nonfinite": int(np.sum(~finite)),
            "outside_position_limits": int(np.sum(outside.any(axis=1))), "over_velocity_limit": int(np.sum(too_fast))}


def limits_fit_report(q_rad: np.ndarray, joint_names: list[str] | None, q_min_rad, q_max_rad, sources: dict,
                      control_counters: dict | None) -> dict:
    """What the limits in use did to this log, for the report's "safety": the joints whose recorded positions
    q_rad (T, D) leave [q_min_rad, q_max_rad] (D,) (named, with both ranges), the commands the control loop's
    limit gate clamped (its counters clamped_position / clamped_velocity; None when it sent no Stats), where the
    position limits came from (control/limits.py sources), and a warning for each. A policy's fitted limits
    (source "manifest ...") may not cover an episode it was not fitted on: then the commands are clamped while
    no command lies outside the limits, and only these lines say so."""
    lo, hi = np.asarray(q_min_rad, float), np.asarray(q_max_rad, float)
    q = np.asarray(q_rad, float)
    rec_lo, rec_hi = np.nanmin(q, axis=0), np.nanmax(q, axis=0)
    names = joint_names or [f"joint {j}" for j in range(q.shape[1])]
    outside = [{"joint": names[j], "recorded_rad": [float(rec_lo[j]), float(rec_hi[j])],
                "limits_rad": [float(lo[j]), float(hi[j])]}
               for j in np.flatnonzero((rec_lo < lo - 1e-9) | (rec_hi > hi + 1e-9))]
    counters = control_counters or {}
    clamped = {k: counters.get(k) for k in ("clamped_position", "clamped_velocity")}
    source = " / ".join(sorted({sources.get("q_min_rad", "?"), sources.get("q_max_rad", "?")}))
    warnings = []
    if outside:
        warnings.append(f"the log's recorded positions leave the position limits ({source}) on {len(outside)} of "
                        f"{q.shape[1]} joints: {', '.join(o['joint'] for o in outside)}")
    if any(clamped.values()):
        warnings.append(f"the limit gate clamped {clamped['clamped_position'] or 0} commands to the position "
                        f"limits ({source}) and {clamped['clamped_velocity'] or 0} to the velocity limit "
                        f"({sources.get('qd_max_rad_s', '?')}): the action error includes them")
    return {**clamped, "joints_outside_limits": outside, "position_limits_source": source, "warnings": warnings}


def safety_section(rec, log, resolved, node_stats: dict) -> dict:
    """report.json's "safety" of a replay or hil run: every command checked (safety_report) and what the limits in
    use did to this log (limits_fit_report). rec: the run's Recording; resolved: control/limits.ResolvedLimits;
    node_stats: the report's "node_stats"."""
    lim = resolved.limits
    return (safety_report(rec.commands, lim.q_min_rad, lim.q_max_rad, lim.qd_max_rad_s, rec.period_ns)
            | limits_fit_report(log.q_rad, log.joint_names, lim.q_min_rad, lim.q_max_rad, resolved.sources,
                                node_stats.get("control", {}).get("counters")))
