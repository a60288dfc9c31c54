"""Network fault injection on the replayer's observation stream: drops, loss bursts, delays, duplicates,
reordering, malformed frames and adversarial observations, seeded so that a run can be repeated exactly.

The replayer hands every encoded observation to a FaultInjector instead of the socket; the injector decides
its fate and keeps the delayed and held-back ones until they are due. Per observation it always draws the
same number of uniforms from one numpy Generator (delays and garbage bytes come from two others), so the
fates are a function of the seed and the row, and turning one fault kind on or off does not move the others
(adversarial observations draw from a Generator of their own, three uniforms per observation).

An adversarial observation is hostile but valid: wire.decode accepts it, and what it carries is what a broken
or malicious robot client could send (ADVERSARIAL: positions far outside any joint box, values that overflow
float32, another joint count, huge velocities, timestamps far in the past or future, a seq near 2**63). It takes
the place of the row's observation and then meets that row's network fate (delayed, duplicated, reordered).

Loss bursts follow a simple two-state model (a burst starts with probability burst_rate per observation and
then loses burst_len observations in a row), the degenerate Gilbert-Elliott channel (Gilbert 1960, Bell Syst.
Tech. J. 39:1253; Elliott 1963) with certain loss in the bad state and a fixed sojourn.
"""
from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass

import numpy as np
import zmq

from edgeinfer.core.wire import MAX_JOINTS, Observation, decode, encode

KINDS = ("dropped", "burst_dropped", "malformed", "delayed", "duplicated", "reordered", "adversarial")
# Hostile but valid observations (adversarial_observation). wrong_joints is the one a receiver refuses at its entry
# (a joint count other than its arm's); the others reach the nodes, which must keep the arm inside its limits.
ADVERSARIAL = ("outside_box", "huge_position", "overflow_f32", "wrong_joints", "huge_velocity", "t_past",
               "t_future", "seq_huge")
_MALFORMED = ("garbage", "truncated_header", "missing_frames")
_DISTRIBUTIONS = {"fixed": 1, "exp": 1, "uniform": 2, "normal": 2}


def parse_delay(spec: str) -> tuple[str, tuple[float, ...]]:
    """"fixed:MS", "exp:MEAN_MS", "uniform:LO_MS:HI_MS" or "normal:MEAN_MS:SD_MS" (clipped at 0) ->
    (name, params in ms). Raises ValueError naming the spec."""
    name, *args = spec.split(":")
    if name not in _DISTRIBUTIONS or len(args) != _DISTRIBUTIONS[name]:
        raise ValueError(f"delay_ms {spec!r}: expected fixed:MS, exp:MEAN_MS, uniform:LO_MS:HI_MS or "
                         "normal:MEAN_MS:SD_MS")
    try:
        params = tuple(float(a) for a in args)
    except ValueError:
        raise ValueError(f"delay_ms {spec!r}: parameters must be numbers") from None
    if not all(np.isfinite(params)) or min(params) < 0 or (name == "uniform" and params[0] > params[1]):
        raise ValueError(f"delay_ms {spec!r}: parameters must be finite, >= 0 (and lo <= hi)")
    return name, params


def adversarial_observation(obs: Observation, kind: str, u: float) -> Observation:
    """A hostile but valid copy of `obs` (wire.encode and decode accept it) of ADVERSARIAL kind `kind`; u in [0, 1)
    picks the variant: the sign of each joint, how far, which joint count, which timestamp. Joint arrays stay
    float64 rad / rad/s; extras are kept. Raises ValueError for an unknown kind."""
    d = len(obs.q_rad)
    signs = np.where((int(u * 2**d) >> np.arange(d)) & 1, 1.0, -1.0)
    seq, t_ns, q, qd, q_prev = obs.seq, obs.t_ns, obs.q_rad, obs.qd_rad_s, obs.q_prev_rad
    far = u < 0.5  # the first half of the variants: an hour away; the second: the end of int64
    if kind == "outside_box":  # 5 to 10 rad: outside every revolute joint's box (the Schunk LWA 4P's is 2.967)
        q = q_prev = signs * (5.0 + 10.0 * (u % 0.5))
    elif kind == "huge_position":
        q = q_prev = signs * 1e6
    elif kind == "overflow_f32":  # finite in float64, inf in a float32 model
        q = q_prev = signs * 1e39
    elif kind == "wrong_joints":  # 1, 3 or d + 1 joints (7 for a 6-joint arm)
        counts = [n for n in (1, 3, d + 1 if d < MAX_JOINTS else d - 1) if n != d]
        n = counts[int(u * len(counts))]
        q, qd, q_prev = (np.resize(a, n) for a in (q, qd, q_prev))
    elif kind == "huge_velocity":
        qd = signs * 1e6
    elif kind == "t_past":
        t_ns = max(t_ns - 3_600_000_000_000, -2**63) if far else -2**63
    elif kind == "t_future":
        t_ns = min(t_ns + 3_600_000_000_000, 2**63 - 1) if far else 2**63 - 1
    elif kind == "seq_huge":
        seq = 2**63 - 1 - int(u * 1000)
    else:
        raise ValueError(f"adversarial kind {kind!r}: expected one of {ADVERSARIAL}")
    return Observation(seq, t_ns, q, qd, q_prev, obs.extra, obs.extra_layout)


@dataclass
class NetworkFaultConfig:
    """Faults applied to the observations the replayer publishes (all off by default). Raises ValueError for a
    rate outside [0, 1], burst_len < 1 or a malformed delay spec."""

    drop_rate: float = 0.0  # P(an observation is lost), independently per observation
    burst_rate: float = 0.0  # P(a loss burst starts at an observation)
    burst_len: int = 5  # observations lost per burst (>= 1)
    # Delay distribution of a delayed observation, ms: "exp:2" (exponential, mean 2 ms), "fixed:1.5",
    # "uniform:1:3", "normal:2:0.5" (None: no delays).
    delay_ms: str | None = None
    delay_rate: float = 1.0  # P(an observation is delayed), when delay_ms is set
    duplicate_rate: float = 0.0  # P(an observation is sent twice)
    reorder_rate: float = 0.0  # P(an observation is held back and sent right after the next one)
    # P(an observation is replaced by a garbage multipart message: random bytes, a truncated header, or a header
    # without its array frames).
    malformed_rate: float = 0.0
    # P(an observation is replaced by a hostile but valid one, of a kind drawn at random: positions of 5-10 rad, 1e6
    # or 1e39 rad, 1, 3 or D+1 joints, velocities of 1e6 rad/s, t_ns an hour or int64 away, seq near 2**63).
    adversarial_rate: float = 0.0
    fault_seed: int = 0  # seed of the injector's numpy Generator

    def __post_init__(self):
        for name in ("drop_rate", "burst_rate", "delay_rate", "duplicate_rate", "reorder_rate", "malformed_rate",
                     "adversarial_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"NetworkFaultConfig.{name} must be in [0, 1], got {value}")
        if self.burst_len < 1:
            raise ValueError(f"NetworkFaultConfig.burst_len must be >= 1, got {self.burst_len}")
        if self.delay_ms is not None:
            parse_delay(self.delay_ms)

    @property
    def active(self) -> bool:
        return bool(self.drop_rate or self.burst_rate or (self.delay_ms and self.delay_rate) or self.duplicate_rate
                    or self.reorder_rate or self.malformed_rate or self.adversarial_rate)


class FaultInjector:
    """Decides the fate of each observation and sends (now or later) what survives.

    submit(row, frames, now_ns, sock) sends or holds one encoded observation; release(now_ns, sock) sends the
    held ones that are due; next_due_ns() says when the next one is; flush(sock) sends everything held.
    Counters per kind in `counts`, affected rows (first `max_rows` per kind) in `rows`.
    """

    def __init__(self, cfg: NetworkFaultConfig, max_rows: int = 1000):
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.fault_seed)
        self.delay_rng = np.random.default_rng([cfg.fault_seed, 1])
        self.garbage_rng = np.random.default_rng([cfg.fault_seed, 2])  # what a malformed message looks like
        self.adversarial_rng = np.random.default_rng([cfg.fault_seed, 3])  # whether, which kind, which variant
        self._a = np.ones(3)
        self.adversarial_kinds: Counter = Counter()
        self.delay = parse_delay(cfg.delay_ms) if cfg.delay_ms else None
        self.counts: Counter = Counter({k: 0 for k in KINDS})
        self.malformed_kinds: Counter = Counter()
        self.rows: dict[str, list[int]] = {k: [] for k in KINDS}
        self.max_rows = max_rows
        self.burst_left = 0
        self._u = np.zeros(6)
        self.pending: list[tuple[int, int, list]] = []  # heap of (due_ns, order, frames)
        self.held: list | None = None  # a reordered message, sent after the next submit
        self.order = 0
        self.send_failures = 0  # a full socket (zmq.Again); a PUB drops silently instead, so normally 0

    def _count(self, kind: str, row: int) -> None:
        self.counts[kind] += 1
        if len(self.rows[kind]) < self.max_rows:
            self.rows[kind].append(row)

    def _delay_ns(self) -> int:
        name, p = self.delay
        ms = {"fixed": lambda: p[0], "exp": lambda: self.delay_rng.exponential(p[0]),
              "uniform": lambda: self.delay_rng.uniform(p[0], p[1]),
              "normal": lambda: max(0.0, self.delay_rng.normal(p[0], p[1]))}[name]()
        return int(ms * 1e6)

    def _malformed(self, frames: list) -> list:
        kind = _MALFORMED[int(self.garbage_rng.integers(len(_MALFORMED)))]
        self.malformed_kinds[kind] += 1
        header = bytes(frames[0])
        if kind == "garbage":
            return [self.garbage_rng.bytes(int(self.garbage_rng.integers(1, 64)))]
        if kind == "truncated_header":
            return [header[: len(header) // 2], *frames[1:]]
        return [header]  # the arrays the header announces are missing

    def _adversarial(self, frames: list) -> list:
        kind = ADVERSARIAL[int(self._a[1] * len(ADVERSARIAL))]
        self.adversarial_kinds[kind] += 1
        return encode(adversarial_observation(decode(frames), kind, float(self._a[2])))

    def decide(self, row: int) -> tuple[str | None, bool, bool]:
        """The fate of the next observation, from the seeded draws alone: (loss kind "dropped" |
        "burst_dropped" | "malformed" | None, delayed, duplicated). Reordering and adversarial replacement are
        decided at submit (from draws made here). Six uniforms per call (and three of the adversarial
        Generator) whatever is switched on, so the pattern is a function of the seed and the row count only."""
        cfg = self.cfg
        self._a = self.adversarial_rng.random(3)
        self._u = u = self.rng.random(6)
        if self.burst_left > 0:
            self.burst_left -= 1
            return "burst_dropped", False, False
        if u[0] < cfg.burst_rate:
            self.burst_left = cfg.burst_len - 1
            return "burst_dropped", False, False
        if u[1] < cfg.drop_rate:
            return "dropped", False, False
        if u[2] < cfg.malformed_rate:
            return "malformed", False, False
        return None, self.delay is not None and u[3] < cfg.delay_rate, bool(u[4] < cfg.duplicate_rate)

    def skip(self, row: int) -> None:
        """The replayer skipped this row (stale after a stall): consume its draws so later rows keep their fate."""
        self.decide(row)

    def submit(self, row: int, frames: list, now_ns: int, sock: zmq.Socket) -> None:
        """Apply this observation's faults: drop it, replace it, delay it, send it twice, or hold it back."""
        loss, delayed, duplicated = self.decide(row)
        held, self.held = self.held, None
        if loss is not None:
            self._count(loss, row)
            if loss == "malformed":
                self._send(self._malformed(frames), sock)
        else:
            if self._a[0] < self.cfg.adversarial_rate:
                self._count("adversarial", row)
                frames = self._adversarial(frames)
            copies = 2 if duplicated else 1
            if duplicated:
                self._count("duplicated", row)
            if delayed:
                self._count("delayed", row)
                due = now_ns + self._delay_ns()
                for _ in range(copies):
                    heapq.heappush(self.pending, (due, self.order, frames))
                    self.order += 1
            elif self._u[5] < self.cfg.reorder_rate and held is None:
                self._count("reordered", row)
                self.held = [frames] * copies
            else:
                for _ in range(copies):
                    self._send(frames, sock)
        if held is not None:  # the message held back by the previous submit goes out after this one
            for f in held:
                self._send(f, sock)

    def next_due_ns(self) -> int | None:
        return self.pending[0][0] if self.pending else None

    def release(self, now_ns: int, sock: zmq.Socket) -> None:
        """Send the delayed messages due by now_ns, in due order."""
        while self.pending and self.pending[0][0] <= now_ns:
            self._send(heapq.heappop(self.pending)[2], sock)

    def flush(self, sock: zmq.Socket) -> None:
        """Send everything still held (end of the stream)."""
        for f in self.held or []:
            self._send(f, sock)
        self.held = None
        while self.pending:
            self._send(heapq.heappop(self.pending)[2], sock)

    def _send(self, frames: list, sock: zmq.Socket) -> None:
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.send_failures += 1

    def report(self) -> dict:
        """What was injected: the config, counts per kind, malformed and adversarial kinds and the affected rows."""
        return {"seed": self.cfg.fault_seed, "config": {k: getattr(self.cfg, k) for k in self.cfg.__dataclass_fields__},
                "counts": dict(self.counts), "malformed_kinds": dict(self.malformed_kinds),
                "adversarial_kinds": dict(self.adversarial_kinds),
                "rows": {k: v for k, v in self.rows.items() if v}, "send_failures": self.send_failures}
