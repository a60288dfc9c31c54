"""Fleet scheduling: one target serving many robots, one batched pass at a time (iteration-level batching).

Each robot's chunk is a Request: its own ChunkDecode (its drafter, acceptance and committed tokens), KV-cache slot
and absolute deadline (its observation's time + its budget). Before every batched pass the scheduler

    1. lets every waiting request join the running batch (a new chunk joins at the next pass, not after the others)
       and orders the batch by earliest deadline first (EDF; or by arrival), at most max_batch sequences;
    2. chooses k, the drafts per sequence, for goodput: the expected tokens committed by the whole batch per second of
       pass, sum_i E_i(k) / cost(B, k + 1), with E_i(k) = (1 - a_i^(k+1)) / (1 - a_i) for robot i's measured
       acceptance rate a_i (Leviathan et al. 2023, arXiv 2211.17192, eq. 1) and cost the median measured cost of a
       whole pass (drafting, verifying, committing). A pass's cost grows with the rows it verifies, B * (k + 1), so
       speculation turns down as the batch grows and back up as it shrinks (re-chosen every K_REFRESH passes);
    3. stops each sequence whose deadline cannot hold the pass at its high-quantile cost, or, once it has a whole row
       (D tokens), whose next row cannot be finished in time (that pass at the high quantile, the rest of the row at
       the median: the single-robot planner's row rule, core/scheduler.py): it ends with its verified prefix and the
       node sends its fallback rung, exactly as for one robot;
    4. runs ONE BatchedEngine.forward_batch over the batch and commits each sequence's logits with its own rule;
       at k = 0 with greedy rules, an engine that offers greedy_runs runs every sequence to the end of its current
       row in one call instead (a row of D passes per scheduler iteration, as the single-robot decoder's row runs).

A sequence's tokens come from its own ChunkDecode and a batch-invariant engine (core/protocols.BatchedEngine), so
they are the tokens it would get alone: batching, order and k change when a token is ready, never which.

Admission (`admission`): a robot is admitted only if a chunk still fits every admitted robot's budget (its
admission_headroom share of it) when all of them are in flight at once (synchronised phases: the worst case): the
predicted chunk time at batch B is the best k's passes per chunk at the median pass cost at batch B, one of them at
the high quantile (chunk_ns). Otherwise it is refused with the numbers, or admitted on the longer budget it offered
(Join.max_budget_ns) when that one fits.
Clockwork (Gujarati et al., OSDI 2020) schedules and admits from predicted run times in the same way.
"""
from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Literal

import numpy as np

from edgeinfer.core.acceptance import Greedy
from edgeinfer.core.protocols import BatchedEngine, Drafter
from edgeinfer.core.scheduler import LatencyModel
from edgeinfer.core.speculative import ChunkDecode
from edgeinfer.core.wire import Admission, Join

ORDERS = ("edf", "arrival")
PRIOR_ACCEPTANCE = 0.5  # a robot's acceptance rate before its first drafts are verified (they measure it)
MEDIAN = 0.5
K_REFRESH = 8  # passes between two goodput choices of k for one batch size (the choice costs ~30 us)


@dataclass
class FleetPolicy:
    """How a fleet runtime schedules its robots (edgeinfer/node/fleet_node.py; the bench's configurations differ
    here)."""

    batching: bool = True  # one batched pass over every in-flight chunk; False: one chunk at a time, to completion
    order: Literal["edf", "arrival"] = "edf"  # the batch's order: earliest deadline first, or arrival
    adaptive_k: bool = True  # drafts per pass chosen for goodput each pass (k_max the most); False: always k
    k: int = 0  # drafts per pass when adaptive_k is off (0: target-only)
    k_max: int = 8  # the most drafts per pass adaptive k may choose
    deadline_cut: bool = True  # a chunk whose deadline cannot hold the next pass ends on its fallback rung
    # refuse a robot that would break an admitted robot's deadline (False: admit while a slot is free)
    admission: bool = True
    # the share of a budget a predicted chunk may take: the prediction is from passes measured in isolation, and the
    # node's reads and sends, the robots' own processes on a shared host and its jitter take the rest
    admission_headroom: float = 0.8
    max_batch: int = 64  # the most sequences in one pass
    quantile: float = 0.99  # quantile of the measured pass costs that deadlines and admission are planned on
    margin_ms: float = 0.5  # kept free at the end of each budget for encoding and sending the chunk, ms
    # Target-only rows run several to an engine call, as many as keep the call within this many ms at the median pass
    # cost and every deadline: a scheduler iteration costs ~0.3 ms of Python (a lone robot's chunk in one call, not
    # nine), and a chunk that arrives meanwhile joins after the call (so this bounds its wait); 0: a row per call
    call_ms: float = 2.0

    def __post_init__(self):
        if self.order not in ORDERS:
            raise ValueError(f"FleetPolicy.order must be one of {ORDERS}, got {self.order!r}")
        if not 0 <= self.k <= self.k_max <= 64:
            raise ValueError(f"FleetPolicy.k ({self.k}) and FleetPolicy.k_max ({self.k_max}): need "
                             "0 <= k <= k_max <= 64")
        if not 0 < self.admission_headroom <= 1:
            raise ValueError(f"FleetPolicy.admission_headroom must be in (0, 1], got {self.admission_headroom}")
        if self.max_batch < 1:
            raise ValueError(f"FleetPolicy.max_batch must be >= 1, got {self.max_batch}")
        if not 0.5 <= self.quantile <= 1:
            raise ValueError(f"FleetPolicy.quantile must be in [0.5, 1], got {self.quantile}")
        if self.margin_ms < 0:
            raise ValueError(f"FleetPolicy.margin_ms must be >= 0, got {self.margin_ms}")
        if not 0 <= self.call_ms <= 1000:
            raise ValueError(f"FleetPolicy.call_ms must be in [0, 1000], got {self.call_ms}")


class PassCosts:
    """Measured costs of batched target passes, ns, by (batch size B, rows per sequence T = k + 1): the planning
    quantile of a rolling window per (B, T) (core/scheduler.LatencyModel, never expiring: admission plans on batch
    sizes the fleet has not run lately). A (B, T) never measured is estimated from the measured one with the fewest
    rows B * T at or above its own (a pass never costs less with more rows), else from the largest, scaled by rows."""

    def __init__(self, quantile: float = 0.99, window: int = 256):
        self.quantile = quantile
        self._model = LatencyModel(quantile, window, max_age_ns=2**62)
        self._shapes: set[tuple[int, int]] = set()
        self._stand_in: dict[tuple[int, int], tuple[tuple[int, int], float]] = {}  # unmeasured -> (measured, scale)

    def record(self, batch: int, rows: int, ns: int) -> None:
        self._model.record(f"batch{batch}", rows, ns)
        if (batch, rows) not in self._shapes:
            self._shapes.add((batch, rows))
            self._stand_in.clear()

    def measured(self) -> dict[tuple[int, int], float]:
        """{(B, T): quantile ns} of every measured (B, T)."""
        return {key: self._model.estimate_ns(f"batch{key[0]}", key[1]) for key in sorted(self._shapes)}

    def estimate_ns(self, batch: int, rows: int, quantile: float | None = None) -> float:
        """The `quantile` (default: the planning one) of the cost of a pass of `batch` sequences of `rows` rows each,
        ns (0.0 before any sample)."""
        key = (batch, rows)
        if key not in self._shapes:
            if not self._shapes:
                return 0.0
            if key not in self._stand_in:
                need = batch * rows
                above = [k for k in self._shapes if k[0] * k[1] >= need]
                if above:
                    self._stand_in[key] = (min(above, key=lambda k: (k[0] * k[1], k)), 1.0)
                else:
                    top = max(self._shapes, key=lambda k: (k[0] * k[1], k))
                    self._stand_in[key] = (top, need / (top[0] * top[1]))
            key, scale = self._stand_in[key]
            return self._model.estimate_ns(f"batch{key[0]}", key[1], quantile) * scale
        return self._model.estimate_ns(f"batch{batch}", rows, quantile)


@dataclass
class Request:
    """One robot's chunk in the fleet: from its observation to the pass that ends it."""

    robot: str
    slot: int  # its KV-cache slot in the BatchedEngine
    obs_seq: int
    t_obs_ns: int  # when the observation was taken (monotonic, this host)
    deadline_ns: int  # absolute: t_obs_ns + the robot's budget
    arrival_ns: int  # when the runtime received it
    decode: ChunkDecode  # its drafter is reset with `state` when it joins the batch
    # (q_rad, qd_rad_s, q_prev_rad) (D,) float64 each, the observation its drafter starts from (Drafter.reset): reset
    # when the request joins the batch, not before, as the robot's previous chunk may still be drafting with it
    state: tuple | None = None
    started: bool = False  # joined the batch (no longer superseded by a newer observation)
    cut: bool = False  # ended by the deadline before every token was verified
    ended_ns: int = 0
    # its passes by the batch they ran in, and by the drafts they verified (the prefill left out)
    batch_passes: Counter = field(default_factory=Counter)
    draft_passes: Counter = field(default_factory=Counter)


class FleetScheduler:
    """Runs the in-flight chunks of every robot through one BatchedEngine, one batched pass per step() (the module
    docstring). clock: monotonic ns (injected in tests). n_tokens: tokens per chunk; row_tokens: the policy's D.
    costs: measured pass costs (shared with admission; warm_up fills them)."""

    def __init__(self, policy: FleetPolicy, engine: BatchedEngine, n_tokens: int, row_tokens: int,
                 costs: PassCosts | None = None, clock: Callable[[], int] = time.perf_counter_ns):
        self.policy, self.engine, self.n_tokens, self.row_tokens = policy, engine, n_tokens, row_tokens
        self.costs = costs or PassCosts(policy.quantile)
        self.clock = clock
        self.waiting: dict[str, Request] = {}  # robot -> its newest request not yet in the batch
        self.running: list[Request] = []
        self.acceptance: dict[str, list[int]] = {}  # robot -> [drafted, accepted], decayed (_observe)
        self.k_chosen: Counter = Counter()  # passes by k
        self.batch_sizes: Counter = Counter()  # passes by batch size
        self.cuts = 0
        self.passes = 0  # batched passes run
        # the node's own work per chunk outside the passes (its observation in, its chunk built and sent), ns: the
        # node measures it (set_chunk_overhead); admission adds it once per robot in flight
        self.chunk_overhead_ns = 0
        self._k_by_batch: dict[int, tuple[int, int]] = {}  # batch size -> (k chosen, self.passes then)

    # --- requests ---------------------------------------------------------------------------------------------

    def submit(self, req: Request) -> Request | None:
        """Queue a robot's new chunk; it joins the batch at the next pass, or once the robot's running chunk ends.
        Returns the robot's request it replaces (queued and not started: a newer observation supersedes it), or
        None."""
        old = self.waiting.get(req.robot)
        self.waiting[req.robot] = req
        return old

    def drop(self, robot: str) -> list[Request]:
        """Forget a robot's requests (it left, or its lease expired); returns them."""
        gone = [r for r in self.running if r.robot == robot]
        self.running = [r for r in self.running if r.robot != robot]
        if (w := self.waiting.pop(robot, None)) is not None:
            gone.append(w)
        self.acceptance.pop(robot, None)
        return gone

    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    # --- one pass ---------------------------------------------------------------------------------------------

    def step(self) -> list[Request]:
        """One batched target pass over the batch (module docstring). Returns the requests that ended in it:
        complete, or cut by their deadline (req.cut) with the tokens they had."""
        self._join()
        if not self.running:
            return []
        batch = self.running[: self.policy.max_batch]
        k = self._choose_k(batch)
        ended = self._cut(batch, k) if self.policy.deadline_cut else []
        batch = [r for r in batch if not r.cut]
        run = getattr(self.engine, "greedy_runs", None)
        if batch and k == 0 and run is not None and all(r.decode.n and isinstance(r.decode.rule, Greedy)
                                                        for r in batch):
            self._rows(batch, run)
        elif batch:
            self._pass(batch, k)
        ended += [r for r in batch if r.decode.done]
        now = self.clock()
        for r in ended:
            r.ended_ns = now
        gone = {id(r) for r in ended}
        self.running = [r for r in self.running if id(r) not in gone]
        return ended

    def _pass(self, batch: list[Request], k: int, record: bool = True) -> None:
        """One batched target pass of k drafts per sequence: draft, verify (one forward_batch), commit. Its whole
        cost, drafting and committing included, is the sample PassCosts plans on (record)."""
        t0 = self.clock()
        passes = [r.decode.next_pass(r.slot, k) for r in batch]
        logits = self.engine.forward_batch(passes)
        for r, p, lg in zip(batch, passes, logits):
            drafted = len(p.tokens) - 1 if p.start else 0
            accepted = r.decode.commit(lg)
            r.batch_passes[len(batch)] += 1
            if p.start:
                r.draft_passes[drafted] += 1
            if drafted:
                self._observe(r.robot, drafted, accepted)
        if record:
            self.costs.record(len(batch), max(len(p.tokens) + (p.start == 0) for p in passes), self.clock() - t0)
        self.k_chosen[k] += 1
        self.batch_sizes[len(batch)] += 1
        self.passes += 1

    def _rows(self, batch: list[Request], run: Callable, record: bool = True, grow: bool = True) -> None:
        """Target-only greedy passes, each sequence to the end of its current row, in ONE engine call
        (BatchedEngine.greedy_runs): the same tokens as pass by pass, without a scheduler iteration per pass. The
        deadline check ran for the row (_cut); with grow, more whole rows while they fit (_more_rows); a new chunk
        joins at the next call. One cost sample: the call's duration per pass."""
        t0 = self.clock()
        ms = [min(self.row_tokens - r.decode.n % self.row_tokens, r.decode.n_tokens - r.decode.n) for r in batch]
        ms = self._more_rows(batch, ms) if grow else ms
        tokens = run([(r.slot, r.decode.n, r.decode.res.tokens[-1], m) for r, m in zip(batch, ms)])
        for r, m, new in zip(batch, ms, tokens):
            r.decode.extend(new, m)
            r.batch_passes[len(batch)] += m
            r.draft_passes[0] += m
        top = max(ms)
        if record:
            self.costs.record(len(batch), 1, (self.clock() - t0) // top)
        self.k_chosen[0] += top
        self.batch_sizes[len(batch)] += top
        self.passes += top

    def _more_rows(self, batch: list[Request], ms: list[int]) -> list[int]:
        """Passes per sequence for a row call, grown a whole row at a time as long as the call's longest run stays
        within policy.call_ms at the median pass cost and every grown sequence's deadline (less the margin) holds it,
        one pass at the planning quantile. Every call still ends at a row boundary, so a deadline cut stays at one."""
        p = self.policy
        per_pass = self.costs.estimate_ns(len(batch), 1, MEDIAN)
        if p.call_ms <= 0 or per_pass <= 0:
            return ms
        slack = max(self.costs.estimate_ns(len(batch), 1) - per_pass, 0.0)
        now = self.clock()
        left = [r.deadline_ns - p.margin_ms * 1e6 - now for r in batch]
        while True:
            grown = [min(m + self.row_tokens, r.decode.n_tokens - r.decode.n) for r, m in zip(batch, ms)]
            if grown == ms or max(grown) * per_pass > p.call_ms * 1e6 or any(
                    g > m and g * per_pass + slack > lft for g, m, lft in zip(grown, ms, left)):
                return ms
            ms = grown

    def _join(self) -> None:
        """Waiting requests join the running batch, which is kept in the policy's order; a robot's newer chunk waits
        until its running one ends (one pass per slot, and one user of the robot's drafter, at a time)."""
        running = {r.robot for r in self.running}
        for robot in [name for name in self.waiting if name not in running]:
            r = self.waiting.pop(robot)
            if r.state is not None and r.decode.drafter is not None:
                r.decode.drafter.reset(*r.state)
            r.started = True
            self.running.append(r)
        key = (lambda r: (r.deadline_ns, r.arrival_ns)) if self.policy.order == "edf" else (lambda r: r.arrival_ns)
        self.running.sort(key=key)

    def _choose_k(self, batch: list[Request]) -> int:
        """This pass's drafts per sequence: fixed, or the goodput-best k (module docstring)."""
        p = self.policy
        if not p.adaptive_k or not any(r.decode.drafter is not None and r.decode.n > 0 for r in batch):
            return p.k
        b = len(batch)
        k, at = self._k_by_batch.get(b, (0, -K_REFRESH))
        if self.passes - at >= K_REFRESH:  # the choice moves with the rates and costs, slowly: refreshed, not per pass
            rates = np.array([self.acceptance_rate(r.robot) for r in batch if r.decode.n > 0])
            k = max(range(p.k_max + 1), key=lambda k: (self._goodput(rates, b, k), -k))
            self._k_by_batch[b] = (k, self.passes)
        return k

    def _goodput(self, rates: np.ndarray, batch: int, k: int) -> float:
        """Expected tokens the batch commits per ns of a pass of k drafts (rates: the sequences' acceptance rates)."""
        cost = self.costs.estimate_ns(batch, k + 1, MEDIAN)  # throughput: typical costs, not the tail
        return float(expected_tokens(rates, k).sum()) / cost if cost > 0 else float(k == 0)

    def _cut(self, batch: list[Request], k: int) -> list[Request]:
        """Mark and return the sequences whose deadline cannot hold this pass (or, past their first whole row, the
        rest of their next row) at the planning quantile, plus the margin."""
        now, margin = self.clock(), int(self.policy.margin_ms * 1e6)
        pass_ns = self.costs.estimate_ns(len(batch), k + 1)
        typical_ns = self.costs.estimate_ns(len(batch), k + 1, MEDIAN)
        ended = []
        for r in batch:
            left = r.deadline_ns - margin - now
            n = r.decode.n
            row_left = self.row_tokens - n % self.row_tokens if n >= self.row_tokens else 0
            # this pass at the planning quantile, the rest of the row at typical costs (one slow pass, not every one)
            need = pass_ns + (math.ceil(row_left / (k + 1)) - 1) * typical_ns if row_left else pass_ns
            if left < need and n > 0 or left <= 0:
                r.cut = True
                ended.append(r)
        self.cuts += len(ended)
        return ended

    def _observe(self, robot: str, drafted: int, accepted: int) -> None:
        """Count a pass's drafts for the robot's acceptance rate (halved past 4096 drafts: a recent-weighted rate)."""
        c = self.acceptance.setdefault(robot, [0, 0])
        c[0] += drafted
        c[1] += accepted
        if c[0] > 4096:
            c[0], c[1] = c[0] // 2, c[1] // 2

    def acceptance_rate(self, robot: str) -> float:
        """Robot's acceptance rate (drafts kept / drafted), PRIOR_ACCEPTANCE before it drafted."""
        c = self.acceptance.get(robot)
        return c[1] / c[0] if c and c[0] else PRIOR_ACCEPTANCE

    # --- admission --------------------------------------------------------------------------------------------

    def chunk_ns(self, batch: int) -> tuple[float, int]:
        """(predicted high-quantile ns of a chunk when `batch` robots are in flight at once, the k it assumes): the
        prefill and the passes the best k needs for the rest at the median pass cost at `batch`, one of them at the
        planning quantile (a host stall hits a pass, not every pass of a chunk), and the node's work outside the
        passes (chunk_overhead_ns) for each of the `batch` chunks."""
        rates = [self.acceptance_rate(r) for r in self.acceptance] or [PRIOR_ACCEPTANCE]
        a = float(np.mean(rates))
        ks = range(self.policy.k_max + 1) if self.policy.adaptive_k else (self.policy.k,)
        best = None
        for k in ks:
            passes = 1 + math.ceil((self.n_tokens - 1) / float(expected_tokens(a, k)))  # the prefill, then the rest
            typical, slow = (self.costs.estimate_ns(batch, k + 1, q) for q in (MEDIAN, None))
            # one pass of the chunk at the planning quantile; the node's work for every chunk in flight
            ns = passes * typical + (slow - typical) + batch * self.chunk_overhead_ns
            if best is None or ns < best[0]:
                best = (ns, k)
        return best

    def admission(self, join: Join, admitted_ns: dict[str, int], n_slots: int) -> Admission:
        """Admit `join` or refuse it, given the budgets (ns) of the robots admitted now (a re-Join of one of them:
        a restart, decided again) and the engine's n_slots (module docstring)."""
        others = {r: b for r, b in admitted_ns.items() if r != join.robot}
        batch = len(others) + 1
        if batch > n_slots:
            return Admission(join.robot, 0, 0, batch, 0, f"no free slot: this runtime serves at most {n_slots} robots")
        chunk, k = self.chunk_ns(batch)
        p = self.policy
        need = int((chunk + p.margin_ms * 1e6) / p.admission_headroom)  # the budget that chunk needs
        if not p.admission:
            return Admission(join.robot, 1, join.budget_ns, batch, int(chunk), "admitted (admission control off)")
        why = (f"with {batch} robots a chunk takes {chunk / 1e6:.2f} ms at p{p.quantile * 100:g} (k={k}; passes at "
               f"batch {batch}) + {p.margin_ms:g} ms margin, {need / 1e6:.2f} ms of budget at "
               f"{p.admission_headroom:.0%} headroom")
        if others and need > (tight := min(others.values())):
            robot = min(others, key=others.get)
            return Admission(join.robot, 0, 0, batch, int(chunk), f"refused: {why} > robot {robot!r}'s budget "
                                                                  f"{tight / 1e6:g} ms")
        if need <= join.budget_ns:
            return Admission(join.robot, 1, join.budget_ns, batch, int(chunk), f"admitted: {why} <= its budget "
                                                                               f"{join.budget_ns / 1e6:g} ms")
        if need <= join.max_budget_ns:
            budget = max(join.budget_ns, math.ceil(need / 1e6) * 1_000_000)
            return Admission(join.robot, 1, budget, batch, int(chunk),
                             f"admitted on a longer budget, {budget / 1e6:g} ms: {why} > its budget "
                             f"{join.budget_ns / 1e6:g} ms")
        return Admission(join.robot, 0, 0, batch, int(chunk), f"refused: {why} > its budget "
                                                              f"{join.budget_ns / 1e6:g} ms (longest accepted "
                                                              f"{max(join.max_budget_ns, join.budget_ns) / 1e6:g} ms)")

    def warm_up(self, obs: np.ndarray, drafter: Callable[[], Drafter] | None = None, rounds: int = 16) -> None:
        """Measure the pass costs that admission and the deadlines plan on, through the same calls as step()
        (target-only passes as rows when the engine runs them):
        `rounds` passes at every batch size 1..min(n_slots, max_batch) and each of rows 1, 2, 3, 5, 9, 17 (k + 1)
        that the policy's k allows (others are estimated: PassCosts), every slot decoding `obs` (obs_dim,) float32
        with its own drafter from drafter() (reset with the observation by the factory; None: target-only, rows 1).
        Writes the slots' caches, as any chunk does. The counters start afresh after it."""
        p = self.policy
        run = getattr(self.engine, "greedy_runs", None)
        k_top = (p.k_max if p.adaptive_k else p.k) if drafter is not None else 0
        rows = sorted({1, k_top + 1} | {t for t in (2, 3, 5, 9, 17) if t <= k_top + 1})
        for b in range(1, min(self.engine.n_slots, p.max_batch) + 1):
            drafters = [drafter() for _ in range(b)] if drafter is not None else [None] * b
            for t in rows:
                batch = []
                for i in range(-1, rounds):  # i = -1: a first call of this shape, not kept
                    if not batch or any(r.decode.n_tokens - r.decode.n < self.row_tokens for r in batch):
                        batch = [Request("warm-up", s, 0, 0, 0, 0, ChunkDecode(obs, self.n_tokens, drafters[s]))
                                 for s in range(b)]
                        self._pass(batch, 0, record=False)  # the prefill
                    if t == 1 and run is not None:  # target-only passes run as rows, as step() runs them
                        self._rows(batch, run, record=i >= 0, grow=False)  # the cost of a row call
                    else:
                        self._pass(batch, t - 1, record=i >= 0)
        self.acceptance.clear()
        self.k_chosen.clear()
        self.batch_sizes.clear()
        self.passes = 0


def expected_tokens(a, k: int):
    """Expected tokens a pass of k drafts commits at acceptance rate a (a float, or an array of them):
    (1 - a^(k+1)) / (1 - a), k + 1 at a = 1 (Leviathan et al. 2023, eq. 1)."""
    a = np.minimum(np.asarray(a, float), 1.0 - 1e-12)
    return (1.0 - a ** (k + 1)) / (1.0 - a)
