"""The fleet runtime node (`edgeinfer fleet`): one runtime, many robots, on one ROUTER socket.

    robot (DEALER, routing id = its name)               fleet runtime (ROUTER, bound on loopback)
      Join                                   ->         <- Admission (admitted or refused, with the numbers)
      Observation (the ticks a chunk is planned from) -> <- ActionChunk (to that robot only; seq per robot)
      Stop                                   ->         (it left: its slot is freed)
                                                        <- Stop, when the runtime shuts down
    "controller" (DEALER)  Stop              ->         the runtime shuts down, writes its report

One loop iteration (step): read every queued message without blocking (blocking in poll only when there is
nothing to decode) -> Stops handled, each robot's newest observation kept -> leases checked (after every queued
message renewed its sender's, so a stall of this loop loses no robot) -> Joins answered (after the leases: a slot
a silent robot held is free for them) -> the newest observations submitted -> one unit of decoding (a batched
pass, or one whole chunk: node/fleet_decode.py) -> the chunks it ended sent. A robot that is killed, stalls,
restarts or sends garbage touches only its own entry: malformed frames are counted by kind, a silent robot is
dropped after its lease, a Join again re-admits it.
The robot table and its rules: node/fleet_robots.py. The report: FleetNode.report().
"""
from __future__ import annotations

import dataclasses
import json
import signal
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import zmq

from edgeinfer.core.clock import now_ns, pin_to_cpus
from edgeinfer.core.lifecycle import ParentWatch
from edgeinfer.core.logwriter import emit, print_last
from edgeinfer.core.transport import DEFAULT_HWM, MAX_MESSAGE_BYTES, READ_LIMIT, recv_frames
from edgeinfer.core.wire import (
    Admission,
    Hello,
    Join,
    Message,
    Observation,
    ObservationMismatch,
    Stop,
    WireError,
    decode,
    encode,
)
from edgeinfer.engines.models.drafters import make_drafter
from edgeinfer.node.fleet_config import CONTROLLER, FleetConfig
from edgeinfer.node.fleet_decode import Done, Work, make_decoder
from edgeinfer.node.fleet_robots import Robot, RobotTable

TELL_LAPSED_NS = 1_000_000_000  # a lost robot still sending observations is told to rejoin at most this often
IDLE_POLL_MS = 100  # the longest wait in poll with nothing to decode (the exit checks run this often)


def serve_fleet(cfg: FleetConfig) -> dict:
    """Run the fleet runtime until a Stop from the controller, SIGTERM or SIGINT, its parent's exit, or
    idle_timeout_s with no robot admitted. Returns the report (also written to cfg.report when set); prints a
    one-line summary. Raises zmq.ZMQError when the endpoint cannot be bound, and what the engine's loading raises."""
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    with FleetNode(cfg) as node:
        while node.step(stop.is_set):
            pass
        return node.finish()


class FleetNode:
    """Lifecycle: open() (engine, warm-up, socket) -> step() until False -> finish() -> close(); a context
    manager. `counters`: node-wide counts; `table`: the robots (node/fleet_robots.py)."""

    def __init__(self, cfg: FleetConfig):
        self.cfg = cfg
        self.ctx = self.sock = None
        self.counters: Counter = Counter()
        self.exit_reason = ""
        self._lease_ns = int(cfg.robot_lease_ms * 1e6)
        self._pending: dict[str, Work] = {}  # each robot's newest observation read this iteration
        self._joins: list[tuple[Join, bytes, int]] = []  # Joins read this iteration (handled after the leases)

    def open(self) -> "FleetNode":
        if warning := pin_to_cpus(self.cfg.runtime_cpus):  # before the engine starts its threads
            emit(f"fleet: {warning}")
        self.parent = ParentWatch()
        self.decoder = make_decoder(self.cfg)
        policy = self.decoder.policy
        self.table = RobotTable(self.cfg.n_slots, policy.cfg.n_joints)
        self._stride_ticks = policy.cfg.stride_ticks
        if self.cfg.warmup:
            self.decoder.warm_up()
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        # MANDATORY: a message to a peer that is gone fails (counted send_failed) instead of vanishing; HANDOVER: a
        # restarted robot takes its routing id over from its dead connection
        for opt, value in ((zmq.LINGER, 0), (zmq.SNDHWM, DEFAULT_HWM), (zmq.RCVHWM, 10 * DEFAULT_HWM),
                           (zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES), (zmq.ROUTER_MANDATORY, 1), (zmq.ROUTER_HANDOVER, 1)):
            self.sock.setsockopt(opt, value)
        try:
            self.sock.bind(self.cfg.endpoint)
        except zmq.ZMQError as e:  # in use, or not an endpoint: a start-up error naming the option, no traceback
            raise OSError(f"FleetConfig.endpoint {self.cfg.endpoint!r}: cannot bind: {e}") from None
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)
        self.t_start_ns = self._last_msg_ns = now_ns()
        e = self.decoder.engine_info
        emit(f"fleet: serving on {self.cfg.endpoint} ({'batched' if e['batched'] else 'one chunk at a time'}, "
             f"{e['backend']} {e['precision']}, {self.cfg.n_slots} slots)")
        return self

    def step(self, stopped=lambda: False) -> bool:
        """One loop iteration (module docstring). False when the run is over: a controller's Stop, stopped()
        (a signal), the parent's exit, or idle_timeout_s with no robot admitted and no message."""
        self._read(0 if self.decoder.busy() else self._idle_wait_ms())
        t = now_ns()
        for robot in self.table.expire(t, self._lease_ns):
            self.counters["robot_lost"] += 1
            self.decoder.drop(robot.name)
            self._pending.pop(robot.name, None)
        for join, sender, t_join in self._joins:  # after the leases: a slot a silent robot held is free for them
            self._join(join, sender, t_join)
        self._joins.clear()
        self._submit()
        if self.decoder.busy():
            try:
                done = self.decoder.step()
            except ObservationMismatch as e:  # a valid observation the policy cannot read: that chunk is skipped
                self.counters["obs_mismatch"] += 1
                emit(f"fleet: {e}")
                done = []
            for d in done:
                self._send_chunk(d)
        if self.exit_reason:
            return False
        if stopped():
            self.exit_reason = "signal"
        elif self.parent.parent_gone():
            self.exit_reason = "parent"
        elif not self.table.active() and t - self._last_msg_ns > self.cfg.idle_timeout_s * 1e9:
            self.exit_reason = "idle"
        return not self.exit_reason

    def _idle_wait_ms(self) -> int:
        """How long poll may block with nothing to decode: until the next lease runs out, IDLE_POLL_MS at most."""
        expiry = self.table.next_expiry_ns(self._lease_ns)
        if expiry is None:
            return IDLE_POLL_MS
        return int(min(IDLE_POLL_MS, max(0, (expiry - now_ns()) // 1_000_000 + 1)))

    # --- receiving -------------------------------------------------------------------------------------------

    def _read(self, timeout_ms: int) -> None:
        """Every queued message (READ_LIMIT at most: a flood cannot pin the loop here), waiting up to timeout_ms
        for the first."""
        if not self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN and not self.poller.poll(timeout_ms):
            return
        for _ in range(READ_LIMIT):
            try:
                frames = recv_frames(self.sock, zmq.NOBLOCK, envelope=1)  # no copy: decode checks sizes first
            except zmq.Again:
                return
            except WireError as e:  # more frames than a message has: read and dropped
                self.counters[f"malformed.{e.kind}"] += 1
                continue
            self._handle(bytes(frames[0]), frames[1:], now_ns())

    def _handle(self, sender: bytes, frames: list[bytes], t_ns: int) -> None:
        """One message from routing id `sender`: decoded (a malformed one counted by kind, never fatal), then
        handled by its type."""
        self._last_msg_ns = t_ns
        try:
            msg = decode(frames)
        except WireError as e:
            self.counters[f"malformed.{e.kind}"] += 1
            if (robot := self.table.robots.get(sender.decode(errors="replace"))) is not None:
                robot.counts["malformed"] += 1
            return
        if isinstance(msg, Hello):  # a probe (any peer's): the runtime is up and warmed up
            self.counters["hellos"] += 1
            self._send(sender, Hello("fleet", msg.seq, now_ns()))
        if sender == CONTROLLER.encode():  # not a robot: its Stop ends the run, the rest is ignored
            if isinstance(msg, Stop):
                self.exit_reason = "controller"
            return
        if isinstance(msg, Join):
            self._joins.append((msg, sender, t_ns))
            return
        robot = self.table.heard(sender, t_ns)
        if isinstance(msg, Hello):
            return
        if robot is None:
            self.counters["obs_unadmitted" if isinstance(msg, Observation) else "unknown_peer"] += 1
        elif isinstance(msg, Observation):
            self._observation(robot, msg, t_ns)
        elif isinstance(msg, Stop):
            self._leave(robot)
        else:
            self.counters[f"unexpected.{type(msg).__name__}"] += 1

    def _join(self, join: Join, sender: bytes, t_ns: int) -> None:
        robot, restart = self.table.join(join, sender, t_ns, self.decoder.admission)
        self.counters["joins"] += 1
        a = robot.admission
        if restart:  # its chunks in progress belong to the robot before its restart
            self.decoder.drop(robot.name)
            self._pending.pop(robot.name, None)
            self.counters["robot_rejoined"] += 1
        self.counters["admitted" if a.admitted else "refused"] += 1
        if a.admitted:
            robot.step_ns = join.period_ns * self._stride_ticks
            if robot.drafter is None and self.cfg.scheduling.batching:  # its own drafter state
                robot.drafter = make_drafter(self.cfg.drafter, self.decoder.policy)
        self._send(sender, a)
        emit(f"fleet: {join.robot}: {a.reason}")

    def _observation(self, robot: Robot, obs: Observation, t_ns: int) -> None:
        """Keep the robot's newest observation (latest-only); one older than its budget on arrival is dropped."""
        robot.counts["observations"] += 1
        if not robot.active:
            robot.counts["obs_unadmitted"] += 1
            self.counters["obs_unadmitted"] += 1
            if robot.counts["lost"] and t_ns - robot.told_ns > TELL_LAPSED_NS:  # it may not know: say so, now and then
                robot.told_ns = t_ns
                self._send(robot.name.encode(), Admission(robot.name, 0, 0, 0, 0, (
                    f"lease lapsed: nothing heard for {self.cfg.robot_lease_ms:g} ms (robot_lease_ms), its slot was "
                    "freed; send a Join to be served again")))
            return
        if obs.q_rad.shape != (self.table.n_joints,):
            robot.counts["obs_mismatch"] += 1
            self.counters["obs_mismatch"] += 1
            return
        budget = robot.admission.budget_ns
        if t_ns - obs.t_ns > budget:
            robot.counts["obs_stale"] += 1
            self.counters["obs_stale"] += 1
            return
        if self._pending.get(robot.name) is not None:
            self._superseded(robot)
        self._pending[robot.name] = Work(robot, obs, obs.t_ns + budget, t_ns)

    def _leave(self, robot: Robot) -> None:
        if robot.active:
            self.table.leave(robot)
            self.decoder.drop(robot.name)
            self._pending.pop(robot.name, None)
            self.counters["robot_stopped"] += 1

    def _submit(self) -> None:
        """The newest observation of each robot to the decoder; one that replaces a queued chunk supersedes it."""
        for work in self._pending.values():
            try:
                if self.decoder.submit(work) is not None:
                    self._superseded(work.robot)
            except ObservationMismatch:
                work.robot.counts["obs_mismatch"] += 1
                self.counters["obs_mismatch"] += 1
        self._pending.clear()

    def _superseded(self, robot: Robot) -> None:
        robot.counts["obs_superseded"] += 1
        self.counters["obs_superseded"] += 1

    # --- sending ---------------------------------------------------------------------------------------------

    def _send_chunk(self, done: Done) -> None:
        """A chunk that ended, to its robot only (never a non-finite action). A robot that left, was lost or
        restarted had its chunks in progress dropped (decoder.drop) before any could end here."""
        work, chunk = done.work, done.chunk
        robot = work.robot
        if not np.all(np.isfinite(chunk.steps_rad)):  # the continue rung: the anchor only
            chunk.steps_rad, chunk.rung = chunk.steps_rad[:1], "continue"
            self.counters["nonfinite_action"] += 1
        robot.n_chunks += 1
        chunk.seq = robot.n_chunks
        c = robot.counts
        c["chunks"] += 1
        c[f"rung.{chunk.rung}"] += 1
        c["deadline_cuts"] += done.cut
        c["late"] += chunk.t_ready_ns > work.deadline_ns
        c.update(target_passes=chunk.target_passes, drafted=chunk.drafted, accepted=chunk.accepted)
        robot.ready_ns.append(chunk.t_ready_ns - chunk.t_obs_ns)
        if self._send(robot.name.encode(), chunk):
            self.counters["chunks_sent"] += 1

    def _send(self, identity: bytes, msg: Message) -> bool:
        """Send without blocking; False (counted send_failed) when the peer is gone or its queue is full."""
        try:
            self.sock.send_multipart([identity, *encode(msg)], flags=zmq.NOBLOCK)
        except zmq.ZMQError:  # EHOSTUNREACH (ROUTER_MANDATORY: no such peer now) or EAGAIN (its queue is full)
            self.counters["send_failed"] += 1
            return False
        except (WireError, OverflowError, ValueError) as e:  # a message the wire refuses: counted, never fatal
            self.counters["send_unencodable"] += 1
            emit(f"fleet: not sent to {identity[:64]!r}: {e}")
            return False
        return True

    # --- the end ---------------------------------------------------------------------------------------------

    def finish(self) -> dict:
        """A Stop to every admitted robot, the report (to cfg.report when set) and the summary line."""
        for robot in self.table.active():
            self._send(robot.name.encode(), Stop(f"fleet runtime shutting down ({self.exit_reason})"))
        report = self.report()
        if self.cfg.report is not None:
            Path(self.cfg.report).parent.mkdir(parents=True, exist_ok=True)
            Path(self.cfg.report).write_text(json.dumps(report, indent=1) + "\n")
        print_last(f"fleet: {summary(report)}")
        return report

    def report(self) -> dict:
        """The run's report (JSON-ready): engine, scheduling, per robot (fleet_robots.Robot.summary), the
        admission log, the pass-cost table (batching only) and the node's counters."""
        return {"engine": self.decoder.engine_info, "scheduling": dataclasses.asdict(self.cfg.scheduling),
                "n_slots": self.cfg.n_slots, "endpoint": self.cfg.endpoint, "exit_reason": self.exit_reason,
                "duration_s": round((now_ns() - self.t_start_ns) / 1e9, 3),
                "counters": dict(sorted(self.counters.items())),
                "robots": {name: r.summary() for name, r in sorted(self.table.robots.items())},
                "admission_log": self.table.log + list(self.table.log_tail),
                "admission_log_dropped": self.table.log_dropped, "pass_costs": self.decoder.costs()}

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=200)  # the Stops of finish() get a moment to leave
        if self.ctx is not None:
            self.ctx.term()

    def __enter__(self) -> "FleetNode":
        try:
            return self.open()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()


def summary(report: dict) -> str:
    """The report in one line: robots admitted/refused/lost, chunks and their rungs, cuts, malformed frames."""
    robots = report["robots"].values()
    rungs: Counter = Counter()
    for r in robots:
        rungs.update(r["rungs"])
    c = report["counters"]
    malformed = sum(n for k, n in c.items() if k.startswith("malformed."))
    return (f"{sum(r['admitted'] for r in robots)} robots admitted, {c.get('refused', 0)} refusals, "
            f"{c.get('robot_lost', 0)} lost, {c.get('robot_rejoined', 0)} rejoined; {c.get('chunks_sent', 0)} chunks "
            f"({', '.join(f'{k} {n}' for k, n in rungs.most_common()) or 'none'}), "
            f"{sum(r['deadline_cuts'] for r in robots)} cut, {sum(r['late'] for r in robots)} late; "
            f"{malformed} malformed frames; engine {report['engine']['backend']}; exit: {report['exit_reason']}")
