"""The fleet runtime's robot table: who joined, who is admitted on which KV-cache slot, whose lease ran out, and
every robot's counters for the report. No sockets and no clock of its own (times are passed in, monotonic ns), so
its rules are tested alone.

Rules (docs/fleet.md, FLEET.md): a Join is checked (its name is the sender's routing id, its joints the policy's,
its times positive), then given a free slot and put to the admission decision; a Join again from a robot that
joined before is a restart (rejoined) and keeps its slot while it holds one. A robot unheard for the lease is
lost; a Stop from it means it left. Either frees its slot at once: the node drops the robot's chunks from the
scheduler first (FleetScheduler.drop), so two robots never share a slot's KV cache.
"""
from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from edgeinfer.core.wire import Admission, Join

# a robot's counters in the report: joins (admissions, restarts), leases lost, Stops; its observations (stale on
# arrival, superseded by a newer one before decoding, sent while not admitted, not the policy's joints) and malformed
# frames; its chunks (cut by the deadline, ready after it) and their target passes, drafts and drafts accepted
COUNTS = ("joins", "admissions", "rejoined", "lost", "stopped", "observations", "obs_stale", "obs_superseded",
          "obs_unadmitted", "obs_mismatch", "malformed", "chunks", "deadline_cuts", "late", "target_passes", "drafted",
          "accepted")
READY_KEPT = 100_000  # the newest chunks whose time to ready (t_ready - t_obs) the report's quantiles are taken on
Decide = Callable[[Join, dict[str, int]], Admission]  # (join, the other admitted robots' budgets, ns) -> Admission


# the most a Join may ask for: a 10 s control period, a replan every 1000 ticks, a 60 s chunk budget (a robot's
# numbers are far below; these keep a chunk's times inside int64 and the wire's limits)
LOG_KEEP = 1000  # admission decisions kept at each end of the log
ROBOTS_KEEP = 4096  # robots the table keeps (admitted ones always)
JOIN_BOUNDS = {"period_ns": 10_000_000_000, "replan_every_ticks": 1000, "budget_ns": 60_000_000_000}

@dataclass
class Robot:
    """One robot of the fleet: its Join's numbers, its admission, its slot and drafter, and its counters."""

    name: str
    join: Join
    admission: Admission
    slot: int | None = None  # its KV-cache slot while admitted (None: refused, lost or left)
    step_ns: int = 0  # its chunks' step: its control period x the policy's stride_ticks
    drafter: Any = None  # its own drafter instance (drafter state per robot), made when first admitted
    last_heard_ns: int = 0
    n_chunks: int = 0  # chunks sent to it (the seq of its ActionChunks)
    counts: Counter = field(default_factory=Counter)  # observations, obs_stale, chunks, rung.<rung>, lost, ...
    k_hist: Counter = field(default_factory=Counter)  # target passes of its chunks by drafts verified (k group)
    batch_hist: Counter = field(default_factory=Counter)  # target passes of its chunks by batch size
    told_ns: int = -(2**62)  # when it was last told its lease lapsed (FleetNode._observation)
    ready_ns: deque = field(default_factory=lambda: deque(maxlen=READY_KEPT))  # its chunks' t_ready - t_obs, ns

    @property
    def active(self) -> bool:
        """Admitted and neither lost nor left: its observations are served."""
        return self.slot is not None

    def summary(self) -> dict:
        """Its report entry (FleetNode.report)."""
        a, c = self.admission, self.counts
        rungs = {k.split(".", 1)[1]: n for k, n in sorted(c.items()) if k.startswith("rung.")}
        return {"admitted": bool(a.admitted), "reason": a.reason, "budget_ns": a.budget_ns, "batch": a.batch,
                "chunk_ns": a.chunk_ns, "slot": self.slot, "period_ns": self.join.period_ns,
                "replan_every_ticks": self.join.replan_every_ticks,
                **{k: c[k] for k in COUNTS},
                "rungs": rungs, "k_hist": dict(sorted(self.k_hist.items())), "ready_ms": _quantiles_ms(self.ready_ns),
                "batch_hist": {str(b): n for b, n in sorted(self.batch_hist.items())}}


class RobotTable:
    """The robots by name, the free slots, and the admission log. n_slots: the most robots served at once;
    n_joints: the policy's D (a Join with another is refused)."""

    def __init__(self, n_slots: int, n_joints: int):
        self.n_slots, self.n_joints = n_slots, n_joints
        self.robots: dict[str, Robot] = {}
        self.free = list(range(n_slots))  # ascending: the lowest free slot is taken first
        # the admission decisions, in order: the first LOG_KEEP and the newest LOG_KEEP (a peer sending Joins in a
        # loop cannot grow the runtime's memory); log_dropped counts the ones between
        self.log: list[dict] = []
        self.log_tail: deque = deque(maxlen=LOG_KEEP)
        self.log_dropped = 0

    def active(self) -> list[Robot]:
        return [r for r in self.robots.values() if r.active]

    def join(self, join: Join, sender: bytes, t_ns: int, decide: Decide) -> tuple[Robot, bool]:
        """Handle a Join from routing id `sender` at t_ns: check it, take a slot, ask `decide` (the admission
        policy) unless it was refused already, and log the decision. Returns (the robot, whether it is a restart:
        it was admitted before). robot.admission is the answer to send: refused when join.robot is not the
        sender's routing id, its joints are not the policy's, a time is not positive, or no slot is free."""
        name = join.robot
        robot = self.robots.get(name) if name.encode() == sender else None  # never another sender's entry
        rejoin = robot is not None and robot.counts["admissions"] > 0  # a restart of a robot served before
        if robot is None:
            robot = Robot(name, join, _refused(join, "", 0))
        robot.join, robot.last_heard_ns = join, t_ns
        budgets = {r.name: r.admission.budget_ns for r in self.active() if r.name != name}
        reason = self._invalid(join, sender)
        if reason is None and robot.slot is None and not self.free:
            reason = f"no free slot: {self.n_slots} robots are served, the most this runtime serves (n_slots)"
        if reason is not None:
            self._release(robot)
            robot.admission = _refused(join, reason, len(budgets) + 1)
        else:
            robot.admission = decide(join, budgets)
            if robot.admission.admitted and robot.slot is None:
                robot.slot = self.free.pop(0)
            elif not robot.admission.admitted:
                self._release(robot)
        keep = robot.admission.admitted or name in self.robots or len(self.robots) < ROBOTS_KEEP
        if name.encode() == sender and keep:
            # a Join under another name than its sender's is answered, never kept; refused newcomers are kept while
            # the table is small (their reasons are in the report), never past ROBOTS_KEEP
            self.robots[name] = robot
            robot.counts["joins"] += 1
            robot.counts["rejoined"] += rejoin
            robot.counts["admissions"] += robot.admission.admitted
        a = robot.admission
        entry = {"t_ns": t_ns, "robot": name, "admitted": bool(a.admitted), "budget_ns": a.budget_ns,
                 "batch": a.batch, "chunk_ns": a.chunk_ns, "reason": a.reason, "rejoin": rejoin}
        if len(self.log) < LOG_KEEP:
            self.log.append(entry)
        else:
            self.log_dropped += len(self.log_tail) == LOG_KEEP
            self.log_tail.append(entry)
        return robot, rejoin

    def _invalid(self, join: Join, sender: bytes) -> str | None:
        """Why `join` cannot be served whatever the load (None: it can)."""
        if join.robot.encode() != sender:
            return (f"Join.robot {join.robot!r} is not the sender's routing id {sender[:64]!r}: set the DEALER's "
                    "ZMQ_IDENTITY to the robot's name")
        if join.n_joints != self.n_joints:
            return f"Join.n_joints {join.n_joints}: the policy has {self.n_joints} joints"
        for name, top in JOIN_BOUNDS.items():
            if not 0 < getattr(join, name) <= top:
                return f"Join.{name} must be in (0, {top}], got {getattr(join, name)}"
        if join.max_budget_ns > JOIN_BOUNDS["budget_ns"]:
            return f"Join.max_budget_ns must be <= {JOIN_BOUNDS['budget_ns']}, got {join.max_budget_ns}"
        return None

    def heard(self, sender: bytes, t_ns: int) -> Robot | None:
        """A message from routing id `sender` at t_ns renews its lease; its robot (None: an unknown peer)."""
        robot = self.robots.get(sender.decode(errors="replace"))
        if robot is not None and robot.name.encode() != sender:  # another routing id that decodes alike: not it
            return None
        if robot is not None:
            robot.last_heard_ns = max(robot.last_heard_ns, t_ns)
        return robot

    def expire(self, t_ns: int, lease_ns: int) -> list[Robot]:
        """The active robots unheard for lease_ns at t_ns: lost (counted), their slots freed."""
        lost = [r for r in self.active() if t_ns - r.last_heard_ns > lease_ns]
        for r in lost:
            r.counts["lost"] += 1
            self._release(r)
        return lost

    def leave(self, robot: Robot) -> None:
        """The active robot sent Stop: it left (counted), its slot freed."""
        robot.counts["stopped"] += 1
        self._release(robot)

    def next_expiry_ns(self, lease_ns: int) -> int | None:
        """When the next active robot's lease runs out (None: no robot is active)."""
        return min((r.last_heard_ns + lease_ns for r in self.active()), default=None)

    def _release(self, robot: Robot) -> None:
        if robot.slot is not None:
            self.free.append(robot.slot)
            self.free.sort()
            robot.slot = None


def _quantiles_ms(values_ns) -> dict | None:
    """p50, p99 and max of ns values, in ms (None: no values)."""
    if not values_ns:
        return None
    p50, p99, top = np.percentile(np.fromiter(values_ns, float), [50, 99, 100]) / 1e6
    return {"p50": round(p50, 3), "p99": round(p99, 3), "max": round(top, 3)}


def _refused(join: Join, reason: str, batch: int) -> Admission:
    return Admission(join.robot, 0, 0, batch, 0, reason)


def admit_while_free(join: Join, budgets_ns: dict[str, int]) -> Admission:
    """The admission policy without a cost model (FleetPolicy.admission False, or no batching): admitted on its own
    budget (the table has checked that a slot is free)."""
    return Admission(join.robot, 1, join.budget_ns, len(budgets_ns) + 1, 0, "admitted: a slot was free (no cost check)")
