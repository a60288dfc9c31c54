"""Network fault injection on the replayer's observation stream: drops, loss bursts, delays, duplicates,
reordering and malformed frames, seeded so that a run can be repeated exactly.

The replayer hands every encoded observation to a FaultInjector instead of the socket; the injector decides
its fate and keeps the delayed and held-back ones until they are due. Per observation it always draws the
same number of uniforms from one numpy Generator (delays and garbage bytes come from two others), so the
fates are a function of the seed and the row, and turning one fault kind on or off does not move the others.

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

KINDS = ("dropped", "burst_dropped", "malformed", "delayed", "duplicated", "reordered")
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
    fault_seed: int = 0  # seed of the injector's numpy Generator

    def __post_init__(self):
        for name in ("drop_rate", "burst_rate", "delay_rate", "duplicate_rate", "reorder_rate", "malformed_rate"):
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
                    or self.reorder_rate or self.malformed_rate)


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

    def decide(self, row: int) -> tuple[str | None, bool, bool]:
        """The fate of the next observation, from the seeded draws alone: (loss kind "dropped" |
        "burst_dropped" | "malformed" | None, delayed, duplicated). Reordering is decided at submit (it needs
        a free hold slot). Six uniforms per call whatever is switched on, so the pattern is a function of
        the seed and the row count only."""
        cfg = self.cfg
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
        """What was injected: the config, counts per kind, malformed kinds and the affected rows."""
        return {"seed": self.cfg.fault_seed, "config": {k: getattr(self.cfg, k) for k in self.cfg.__dataclass_fields__},
                "counts": dict(self.counts), "malformed_kinds": dict(self.malformed_kinds),
                "rows": {k: v for k, v in self.rows.items() if v}, "send_failures": self.send_failures}
