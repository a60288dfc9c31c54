"""The fleet runtime's two ways of decoding its robots' chunks (FleetPolicy.batching), behind one small interface:

    submit(work) -> the robot's queued work it supersedes (None)     a robot's newest observation to decode
    busy()       -> bool                                            anything queued or in flight
    step()       -> [Done]                                          one unit of decoding; the chunks it ended
    drop(robot)                                                     forget a robot's queued and in-flight work
    admission(join, budgets_ns) -> Admission                        admit a Join or refuse it, with the numbers

BatchedDecoder (batching on): core/fleet_batching.py FleetScheduler over the BatchedEngine of
engines/backends/batched.py, one batched target pass per step (iteration-level batching: a new chunk joins at the next
pass). SequentialDecoder (batching off): one chunk per step, decoded to completion by the single-robot PolicyRuntime
(node/runtime.py: its engine, backend auto, its planner and deadline check), the next chunk taken in EDF or arrival
order. Both end a chunk on the single-robot fallback ladder (runtime.chunk_rung) and build it with runtime.build_chunk.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from edgeinfer.core.acceptance import Greedy
from edgeinfer.core.clock import now_ns
from edgeinfer.core.fleet_batching import FleetScheduler, Request
from edgeinfer.core.protocols import BatchedEngine
from edgeinfer.core.scheduler import SchedulerConfig, k_group
from edgeinfer.core.speculative import ChunkDecode
from edgeinfer.core.wire import ActionChunk, Admission, Join, Observation, decode, encode
from edgeinfer.engines.models.drafters import make_drafter
from edgeinfer.node.fleet_config import FleetConfig
from edgeinfer.node.fleet_robots import Robot, admit_while_free
from edgeinfer.node.runtime import PolicyRuntime, RuntimeConfig, build_chunk, chunk_rung


@dataclass
class Work:
    """A robot's chunk to decode: its observation and the absolute deadline of the chunk (monotonic ns)."""

    robot: Robot
    obs: Observation
    deadline_ns: int  # obs.t_ns + the robot's admitted budget
    arrival_ns: int


@dataclass
class Done:
    """A chunk that ended: its work, the ActionChunk (seq still to be set per robot), cut: ended by its deadline
    before every token was verified."""

    work: Work
    chunk: ActionChunk
    cut: bool


class BatchedDecoder:
    """FleetPolicy.batching on: every in-flight chunk in one batched target pass per step(). policy: the served
    policy; engine: its target as a BatchedEngine (engines/backends/batched.py open_batched)."""

    def __init__(self, cfg: FleetConfig, policy, engine: BatchedEngine):
        self.cfg, self.policy, self.engine = cfg, policy, engine
        self.scheduler = FleetScheduler(cfg.scheduling, self.engine, policy.cfg.n_tokens, policy.cfg.n_joints)
        self.prefix_rung = getattr(policy.tokenizer, "prefix_rung", "partial")
        self.engine_info = {"backend": self.engine.backend, "precision": self.engine.precision,
                            "device": self.engine.device, "batched": True, "n_slots": self.engine.n_slots}
        self._work: dict[int, Work] = {}  # id(request) -> its work, while the scheduler holds the request

    def warm_up(self) -> None:
        """Measure the pass costs at every batch size (FleetScheduler.warm_up) on the policy's warm-up state, each
        slot with its own drafter of the robots' kind."""
        state = self.policy.warmup_state()

        def drafter():
            d = make_drafter(self.cfg.drafter, self.policy)
            d.reset(*state[:3])
            return d
        self.scheduler.warm_up(self.policy.features(*state), drafter)
        self.scheduler.chunk_overhead_ns = self._chunk_overhead_ns(state)

    def _chunk_overhead_ns(self, state, n: int = 64) -> int:
        """The median cost of the node's work for one chunk outside the passes, ns: its observation decoded and
        read into features, its chunk built (tokens -> steps) and encoded (FleetScheduler.chunk_ns)."""
        obs = Observation(0, now_ns(), *state[:3])
        frames = encode(obs)
        tokens = [0] * self.policy.cfg.n_tokens
        times = []
        for _ in range(n):
            t0 = now_ns()
            o = decode(frames)
            self.policy.features(o.q_rad, o.qd_rad_s, o.q_prev_rad)
            encode(build_chunk(self.policy, o, tokens, "full", 20_000_000, 0, None))
            times.append(now_ns() - t0)
        return int(np.median(times))

    def admission(self, join: Join, budgets_ns: dict[str, int]) -> Admission:
        return self.scheduler.admission(join, budgets_ns, self.cfg.n_slots)

    def submit(self, work: Work) -> Work | None:
        """Queue the work; it joins the batch at the next pass, or once the robot's chunk in flight ends (its drafter
        is reset with the observation then: FleetScheduler). Returns the robot's queued work it supersedes, or None.
        Raises ObservationMismatch."""
        robot, obs = work.robot, work.obs
        features = self.policy.features(obs.q_rad, obs.qd_rad_s, obs.q_prev_rad)
        req = Request(robot.name, robot.slot, obs.seq, obs.t_ns, work.deadline_ns, work.arrival_ns,
                      ChunkDecode(features, self.policy.cfg.n_tokens, robot.drafter, Greedy()),
                      state=(obs.q_rad, obs.qd_rad_s, obs.q_prev_rad))
        self._work[id(req)] = work
        old = self.scheduler.submit(req)
        return self._work.pop(id(old)) if old is not None else None

    def busy(self) -> bool:
        return self.scheduler.busy()

    def drop(self, robot: str) -> None:
        for req in self.scheduler.drop(robot):
            self._count(req, self._work.pop(id(req), None))

    @staticmethod
    def _count(req: Request, work: Work | None) -> None:
        """A request's passes into its robot's histograms: by batch size (batch_hist) and by drafts verified
        (k_hist, the prefill left out)."""
        if work is not None:
            work.robot.batch_hist.update(req.batch_passes)
            for k, n in req.draft_passes.items():
                work.robot.k_hist[k_group(k)] += n

    def step(self) -> list[Done]:
        """One batched pass (FleetScheduler.step); the chunks it ended, their passes counted (_count)."""
        done = []
        for req in self.scheduler.step():
            work = self._work.pop(id(req))
            self._count(req, work)
            rung, tokens = chunk_rung(req.decode.res, self.policy.cfg.n_tokens, self.policy.cfg.n_joints,
                                      self.prefix_rung, work.robot.drafter)
            chunk = build_chunk(self.policy, work.obs, tokens, rung, work.robot.step_ns, 0, req.decode.res)
            done.append(Done(work, chunk, cut=not req.decode.done))
        return done

    def costs(self) -> dict:
        """The report's pass-cost table and the scheduler's pass counts."""
        sch = self.scheduler
        return {"quantile": sch.costs.quantile,
                "pass_ns": [{"batch": b, "rows": t, "ns": round(ns)} for (b, t), ns in sch.costs.measured().items()],
                "passes_by_k": dict(sorted(sch.k_chosen.items())),
                "passes_by_batch": {str(b): n for b, n in sorted(sch.batch_sizes.items())}, "cuts": sch.cuts}


class SequentialDecoder:
    """FleetPolicy.batching off: one chunk at a time, decoded to completion by a PolicyRuntime (its engine: backend
    auto picks the fastest exact single-sequence engine; its planner keeps the robot's deadline when deadline_cut).
    The next chunk is the queued one of earliest deadline (order "edf") or arrival ("arrival"). One drafter and
    planner serve every robot (each chunk resets the drafter with its observation); admission is by free slot."""

    def __init__(self, cfg: FleetConfig):
        fp = cfg.scheduling
        scheduler = SchedulerConfig(k_max=fp.k_max if fp.adaptive_k else fp.k, adaptive=fp.adaptive_k,
                                    quantile=fp.quantile, margin_ms=fp.margin_ms)
        self.runtime = PolicyRuntime(RuntimeConfig(policy=cfg.policy, backend=cfg.backend, drafter=cfg.drafter,
                                                   threads=cfg.threads, scheduler=scheduler))
        self.cfg, self.policy = cfg, self.runtime.policy
        e, choice = self.runtime.engine, self.runtime.engine_choice
        self.engine_info = {"backend": e.backend, "precision": e.precision, "device": e.device, "batched": False,
                            "choice": choice}
        self.queue: dict[str, Work] = {}  # robot -> its newest work not started
        self._verify: Counter = Counter()  # speculative passes of the chunk being decoded, by k group
        self.runtime.observe_costs(self._observe)

    def warm_up(self) -> None:
        """Untimed chunks (PolicyRuntime.warmup) that fill the planner's cost estimates and the engine's caches."""
        self.runtime.warmup(self.runtime.warmup_observation())

    def admission(self, join: Join, budgets_ns: dict[str, int]) -> Admission:
        """By free slot, for a budget the planner can plan (above margin_ms, at most 10 s)."""
        try:
            self.runtime.planner.cfg.check_budget_ms(join.budget_ns / 1e6)
        except ValueError as e:
            return Admission(join.robot, 0, 0, len(budgets_ns) + 1, 0, f"refused: Join.budget_ns: {e}")
        return admit_while_free(join, budgets_ns)

    def submit(self, work: Work) -> Work | None:
        old = self.queue.get(work.robot.name)
        self.queue[work.robot.name] = work
        return old

    def busy(self) -> bool:
        return bool(self.queue)

    def drop(self, robot: str) -> None:
        self.queue.pop(robot, None)

    def step(self) -> list[Done]:
        """Decode the next queued chunk to completion (ObservationMismatch for one the policy cannot read)."""
        key = (lambda w: (w.deadline_ns, w.arrival_ns)) if self.cfg.scheduling.order == "edf" else \
            (lambda w: w.arrival_ns)
        work = min(self.queue.values(), key=key)
        del self.queue[work.robot.name]
        robot, rt = work.robot, self.runtime
        cut = self.cfg.scheduling.deadline_cut
        if cut:
            rt.set_budget_ms(robot.admission.budget_ns / 1e6)
        self._verify.clear()
        chunk = rt.step(work.obs, t_start_ns=work.obs.t_ns, step_ns=robot.step_ns, budget=cut)
        robot.batch_hist[1] += chunk.target_passes
        speculative = sum(self._verify.values())
        robot.k_hist.update(self._verify)
        if chunk.target_passes > 1 + speculative:  # target-only passes (one cost sample per greedy_run call)
            robot.k_hist[k_group(0)] += chunk.target_passes - 1 - speculative
        return [Done(work, chunk, cut=chunk.rung != "full")]

    def _observe(self, name: str, duration_ns: int) -> None:
        """The planner's cost samples (LatencyModel.observer): "verify.<k group>" is one speculative pass."""
        if name.startswith("verify.") and name != "verify.k0":
            self._verify[name.split(".", 1)[1]] += 1

    def costs(self) -> None:
        return None


def make_decoder(cfg: FleetConfig) -> BatchedDecoder | SequentialDecoder:
    """The decoder cfg.scheduling.batching asks for (batching: the BatchedEngine of cfg.backend, auto = fused); its
    `policy` is the served policy."""
    if not cfg.scheduling.batching:
        return SequentialDecoder(cfg)
    from edgeinfer.engines.backends.batched import open_batched  # torch: only when the runtime runs
    from edgeinfer.engines.models.served import load_served_policy

    policy = load_served_policy(cfg.policy, cfg.trust_policy_code)
    engine = open_batched(policy, "fused" if cfg.backend == "auto" else cfg.backend, cfg.n_slots, cfg.threads)
    return BatchedDecoder(cfg, policy, engine)

