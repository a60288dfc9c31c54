"""One robot of a fleet replay: its log, its own replayer clock and its own control loop, talking to a fleet
runtime (edgeinfer/node/fleet_node.py) over a DEALER whose routing id is the robot's name.

    robot --Join--> runtime --Admission--> robot           (refused: the reason is kept and the robot stops)
    robot --Observation (every replan_every_ticks)--> runtime --ActionChunk--> robot     ... robot --Stop-->

Schedule (absolute, CLOCK_MONOTONIC): the robot sends its Join at t0 + join_at. Once admitted, its request j (the
observation chunk j is planned from) is due at t_first + j * replan period, t_first the first slot of its phase grid
(t0 + phase + m * replan period) at least join_lead after the Join and not before the Admission arrived. Its seq is
the control tick j * replan_every_ticks of the log (the log looped when it is shorter than the run), t_ns its due
time. A request whose successor is already due when it comes up (a stall) is skipped and counted, never sent late
in a burst.

Control loop: a control/buffer.ChunkBuffer fed the chunks in arrival order, sampled at every control tick t_first
+ k * period with only the chunks received by that tick's time. Ticks are evaluated as the clock passes them
(after each send, and at the end): the result is that of a loop woken at every tick. A tick with no chunk covering
it after the first one that had one is a steady-state control miss; the ticks before are start-up.

Many robots run in one process (run_clients: one loop over their sockets and their next due sends), so that a
fleet of 32 fits beside the runtime on a 2-core CPU.
"""
from __future__ import annotations

import json
import select
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zmq

from edgeinfer.control.buffer import ChunkBuffer
from edgeinfer.core import transport
from edgeinfer.core.clock import now_ns
from edgeinfer.core.wire import (
    RUNGS,
    ActionChunk,
    Admission,
    Join,
    Observation,
    Stop,
    WireError,
    check_joints,
    decode,
    encode,
)
from edgeinfer.logs.arm_log import ArmLog
from edgeinfer.sim.pacing import should_skip
from edgeinfer.sim.schedule import extra_of, tick_grid

ADMISSION_TIMEOUT_NS = 2_000_000_000  # no Admission this long after the Join: the runtime never answered


@dataclass
class RobotPlan:
    """What one robot does, all times relative to the run's start t0 (ns). log: its recorded arm; stride_ticks:
    the policy's control ticks per chunk step (q_prev is the row that many ticks earlier); replan_every_ticks:
    ticks between its requests; n_requests: how many it sends; budget_ns / max_budget_ns: its Join's."""

    name: str
    log: ArmLog
    period_ns: int
    stride_ticks: int
    replan_every_ticks: int
    n_requests: int
    budget_ns: int
    max_budget_ns: int
    phase_ns: int = 0
    join_at_ns: int = 0
    join_lead_ns: int = 100_000_000
    settle_ns: int = 100_000_000  # after the last request's deadline (and its Stop): chunks still on their way

    @property
    def replan_ns(self) -> int:
        return self.replan_every_ticks * self.period_ns

    def requests(self) -> list[Observation]:
        """Its n_requests observations (t_ns 0: stamped when due): request j at log tick j * replan_every_ticks
        (modulo the log's length, a multiple of the replan: the log is looped), the newest row at or before it,
        q_prev the newest row at or before stride_ticks earlier. Raises LogError for a log off its tick grid."""
        ticks = tick_grid(self.log)
        ticks = ticks - ticks[0]
        span = -(-(int(ticks[-1]) + 1) // self.replan_every_ticks) * self.replan_every_ticks
        seq = np.arange(self.n_requests, dtype=np.int64) * self.replan_every_ticks
        local = seq % span
        row = np.searchsorted(ticks, local, side="right") - 1
        prev = np.maximum(np.searchsorted(ticks, local - self.stride_ticks, side="right") - 1, 0)
        log = self.log
        return [Observation(int(s), 0, log.q_rad[r], log.qd_rad_s[r], log.q_rad[p], *extra_of(log, int(r)))
                for s, r, p in zip(seq, row, prev)]


class RobotControl:
    """The robot's control loop (see the module docstring): ticks t_first + k * period_ns, k < n_ticks."""

    def __init__(self, t_first_ns: int, period_ns: int, n_ticks: int):
        self.t_first_ns, self.period_ns, self.n_ticks = t_first_ns, period_ns, n_ticks
        self.buffer = ChunkBuffer()
        self.pending: deque[tuple[int, ActionChunk]] = deque()  # (t_recv_ns, chunk), arrival order
        self.k = 0  # next tick to evaluate
        self.first_valid: int | None = None  # the first tick a chunk covered
        self.misses = 0  # ticks after first_valid that no chunk covered
        self.miss_ticks: list[int] = []  # the first 20 of them
        self.rungs: Counter[str] = Counter()  # rung of every covered tick ("continue": an older chunk)
        self.refused: Counter[str] = Counter()  # chunks the buffer turned away, by Refusal.kind

    def receive(self, t_recv_ns: int, chunk: ActionChunk) -> None:
        self.pending.append((t_recv_ns, chunk))

    def advance(self, until_ns: int) -> None:
        """Evaluate every tick due by until_ns (monotonic ns)."""
        while self.k < self.n_ticks and (t := self.t_first_ns + self.k * self.period_ns) <= until_ns:
            while self.pending and self.pending[0][0] <= t:
                if (why := self.buffer.offer(self.pending.popleft()[1], t)) is not None:
                    self.refused[why.kind] += 1
            got = self.buffer.sample(t)
            if got is not None:
                self.rungs[got[1]] += 1
                self.first_valid = self.k if self.first_valid is None else self.first_valid
            elif self.first_valid is not None:
                self.misses += 1
                if len(self.miss_ticks) < 20:
                    self.miss_ticks.append(self.k)
            self.k += 1

    def summary(self) -> dict:
        start = self.first_valid if self.first_valid is not None else self.k
        return {"ticks": self.k, "startup_ticks": start, "steady_ticks": self.k - start, "misses": self.misses,
                "miss_ticks": self.miss_ticks, "rungs": dict(self.rungs), "refused_chunks": dict(self.refused)}


class RobotClient:
    """One robot on its DEALER `sock` (see the module docstring). Drive it with start(t0_ns), then on_due(now) when
    next_due_ns() has come and on_frames(frames, t_recv) for each message; `finished` once it is done."""

    def __init__(self, plan: RobotPlan, sock: zmq.Socket):
        self.plan, self.sock = plan, sock
        self.obs = plan.requests()
        n = plan.n_requests
        self.t_sched = np.zeros(n, dtype=np.int64)  # due time of each request (0: never scheduled)
        self.t_sent = np.zeros(n, dtype=np.int64)  # 0: not sent
        self.skipped = np.zeros(n, dtype=bool)
        self.chunks: list[tuple[int, ActionChunk]] = []  # (t_recv_ns, chunk) in arrival order
        # idle -> joining -> running -> settling (to the last deadline: Stop) -> draining -> done; refused, unanswered
        self.state = "idle"
        self.admission: Admission | None = None
        self.stop_reason: str | None = None  # a Stop from the runtime
        self.control: RobotControl | None = None
        self.j = 0  # next request
        self.t0_ns = self.t_join = self.t_admitted = 0
        self.counts: Counter[str] = Counter()  # send_failed, malformed.<kind>, unexpected.<schema>

    @property
    def finished(self) -> bool:
        return self.state in ("done", "refused", "unanswered")

    def start(self, t0_ns: int) -> None:
        self.t0_ns = t0_ns
        self.t_join = t0_ns + self.plan.join_at_ns

    def next_due_ns(self) -> int | None:
        """When on_due must next run (monotonic ns); None: only a message can move it on."""
        if self.state == "idle":
            return self.t_join
        if self.state == "joining":
            return self.t_join + ADMISSION_TIMEOUT_NS
        if self.state == "running":
            return int(self.t_sched[self.j])
        if self.state == "settling":
            return self._end_ns() - self.plan.settle_ns
        if self.state == "draining":
            return self._end_ns()
        return None

    def on_due(self, now: int) -> None:
        p = self.plan
        if self.state == "idle":
            self._send(Join(p.name, p.log.n_joints, p.period_ns, p.replan_every_ticks, p.budget_ns, p.max_budget_ns))
            self.state = "joining"
        elif self.state == "joining":
            self.state = "unanswered"
        elif self.state == "running":
            self._send_due(now)
        elif self.state == "settling":
            # at the last deadline: leave now (a silence as long as the lease would count as a lost robot), then
            # take what is still on its way
            self._send(Stop(f"{self.plan.name}: end of its replay"))
            self.state = "draining"
        elif self.state == "draining":
            self._finish(now)

    def _send_due(self, now: int) -> None:
        j, sched = self.j, self.t_sched
        if should_skip(j, now, sched, catch_up=False):
            self.skipped[j] = True  # stale: its successor is due; resume on schedule, no burst
            self.t_sent[j] = now
        else:
            obs = self.obs[j]
            obs.t_ns = int(sched[j])
            self.t_sent[j] = now
            self._send(obs)
        self.j += 1
        self.control.advance(now)
        if self.j == len(sched):
            self.state = "settling"

    def on_frames(self, frames: list, t_recv: int) -> None:
        try:
            msg = decode(frames)
            check_joints(msg, self.plan.log.n_joints)
        except WireError as e:
            self.counts[f"malformed.{e.kind}"] += 1
            return
        if isinstance(msg, ActionChunk):
            if self.control is None:
                self.counts["chunk_before_admission"] += 1
                return
            self.chunks.append((t_recv, msg))
            self.control.receive(t_recv, msg)
        elif isinstance(msg, Admission) and self.state == "joining":
            self._admitted(msg, t_recv)
        elif isinstance(msg, Stop):
            self.stop_reason = msg.reason
            if self.state in ("running", "settling", "draining"):
                self._finish(t_recv)
            elif not self.finished:
                self.state = "done"
        else:
            self.counts[f"unexpected.{type(msg).__name__}"] += 1

    def _admitted(self, adm: Admission, t_recv: int) -> None:
        self.admission, self.t_admitted = adm, t_recv
        if not adm.admitted:
            self.state = "refused"
            return
        p = self.plan
        grid0 = self.t0_ns + p.phase_ns
        earliest = max(t_recv, self.t_join + p.join_lead_ns)
        t_first = grid0 + -(-(earliest - grid0) // p.replan_ns) * p.replan_ns
        self.t_sched[:] = t_first + np.arange(p.n_requests, dtype=np.int64) * p.replan_ns
        self.control = RobotControl(t_first, p.period_ns, p.n_requests * p.replan_every_ticks)
        self.state = "running"

    def _end_ns(self) -> int:
        return int(self.t_sched[-1]) + self.admission.budget_ns + self.plan.settle_ns

    def _finish(self, now: int) -> None:
        self.control.advance(min(now, self._end_ns()))
        self.state = "done"

    def _send(self, msg) -> None:
        try:
            self.sock.send_multipart(encode(msg), flags=zmq.NOBLOCK)
        except zmq.Again:  # the runtime is not reading (HWM): counted, the schedule goes on
            self.counts["send_failed"] += 1

    def record(self) -> tuple[dict, dict[str, np.ndarray]]:
        """(scalars, arrays) of what it did, for sim/fleet_report.robot_figures: requests (due, sent, skipped, seq)
        and every chunk received (t_recv, t_obs, obs_seq, rung code: RUNGS index, steps_rad (C, H+1, D))."""
        a = self.admission
        scalars = {"name": self.plan.name, "log": self.plan.log.name, "state": self.state,
                   "stop_reason": self.stop_reason, "counts": dict(self.counts),
                   "t_join_ns": self.t_join, "t_admitted_ns": self.t_admitted, "period_ns": self.plan.period_ns,
                   "admission": None if a is None else {"admitted": bool(a.admitted), "budget_ns": a.budget_ns,
                                                        "batch": a.batch, "chunk_ns": a.chunk_ns,
                                                        "reason": a.reason},
                   "control": self.control.summary() if self.control is not None else None}
        c = [m for _, m in self.chunks]
        steps = max((len(m.steps_rad) for m in c), default=0)
        padded = np.full((len(c), steps, self.plan.log.n_joints), np.nan)
        for i, m in enumerate(c):
            padded[i, :len(m.steps_rad)] = m.steps_rad
        arrays = {"req_seq": np.array([o.seq for o in self.obs], dtype=np.int64), "req_t_sched_ns": self.t_sched,
                  "req_t_sent_ns": self.t_sent, "req_skipped": self.skipped,
                  "chunk_t_recv_ns": np.array([t for t, _ in self.chunks], dtype=np.int64),
                  "chunk_t_obs_ns": np.array([m.t_obs_ns for m in c], dtype=np.int64),
                  "chunk_obs_seq": np.array([m.obs_seq for m in c], dtype=np.int64),
                  "chunk_rung": np.array([RUNGS.index(m.rung) for m in c], dtype=np.int8),
                  "chunk_steps_rad": padded}
        return scalars, arrays


def run_clients(clients: list[RobotClient], t0_ns: int, should_stop=lambda: False) -> None:
    """Run `clients` (each on its own socket) in this thread until every one is finished or should_stop() (checked
    every wake-up) says so: one loop waits on all their sockets (select on the ZMQ notification fds, sub-ms
    timeouts) until the next due send, stamps every message with its arrival time, and runs each due send."""
    for c in clients:
        c.start(t0_ns)
    socks = [c.sock for c in clients]
    fds = [s.getsockopt(zmq.FD) for s in socks]
    while not should_stop():
        live = [c for c in clients if not c.finished]
        if not live:
            return
        now = now_ns()
        for c in live:
            if (due := c.next_due_ns()) is not None and due <= now:
                c.on_due(now)
        # The fds are edge-triggered and any socket operation (a send too) may take the edge: wait only right
        # after a read that found every socket empty.
        if _drain(clients):
            continue
        dues = [d for c in clients if not c.finished and (d := c.next_due_ns()) is not None]
        timeout_s = max(0.0, (min(dues) - now_ns()) / 1e9) if dues else 0.1
        select.select(fds, [], [], min(timeout_s, 0.1))


def _drain(clients: list[RobotClient]) -> bool:
    """Read every queued message of every client, each stamped when taken off its socket; True when any was."""
    got = False
    for c in clients:
        while c.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            try:
                frames = transport.recv_frames(c.sock, zmq.NOBLOCK)  # no copy: decode checks sizes first
            except zmq.Again:
                break
            except WireError as e:  # more frames than a message has: read and dropped
                c.counts[f"malformed.{e.kind}"] += 1
                continue
            c.on_frames(frames, now_ns())
            got = True
    return got


def save_record(client: RobotClient, folder: Path, keep_chunks: bool) -> Path:
    """Write client.record() to folder/<name>.npz (no pickle: the scalars as one JSON string); the chunks' steps
    only with keep_chunks. Returns the path."""
    scalars, arrays = client.record()
    if not keep_chunks:
        arrays.pop("chunk_steps_rad")
    path = folder / f"{client.plan.name}.npz"
    np.savez(path, meta=np.array(json.dumps(scalars)), **arrays)
    return path


def load_record(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(scalars, arrays) written by save_record."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if k != "meta"}
        return json.loads(str(z["meta"])), arrays


def robot_socket(ctx: zmq.Context, endpoint: str, name: str) -> zmq.Socket:
    """The robot's DEALER to the fleet runtime at `endpoint`, routing id `name`; queues deep enough for a run's
    chunks should the loop fall behind."""
    return transport.dealer(ctx, endpoint, name, hwm=10_000)
