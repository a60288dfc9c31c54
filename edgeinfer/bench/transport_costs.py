"""`edgeinfer bench transport`: edgeinfer's observation -> chunk round trip against a raw pyzmq floor.

Both sides run in one invocation, interleaved per scenario, on loopback TCP between two processes:

- edgeinfer: this process publishes an Observation (wire.encode, PUB) to a real runtime node
  (`edgeinfer serve --null-policy true`: the node loop, decode, a policy that costs nothing, encode,
  chunk PUB) and times until the ActionChunk for that observation is decoded here;
- floor: edgeinfer.bench.floors.raw_zmq_round_trip_ns, a REQ/REP echo of the same number of bytes (the bar);
- pattern floor: edgeinfer.bench.floors.raw_pubsub_round_trip_ns, edgeinfer's own frames echoed over PUB/SUB,
  the pattern edgeinfer's nodes use, with no edgeinfer code on the path;
- codec floor: the same with a minimal Python codec on both sides (floors.minimal_decode / minimal_encode:
  a msgpack header, one array frame, one finite check): the least any Python node that looks at its
  messages pays. Between the floor and the pattern floor lies the pattern; between the pattern and the codec
  floors, touching the messages in Python at all; above the codec floor, edgeinfer's own code.

Scenarios: back to back; periodic (--rate-hz, 250: a robot's stream, each observation sent at its due time after a
new Start; the runtime knows the period and is awake, spinning, when the next one is due: within 1.2x of back to
back at p50 is the bar); and with an idle gap before each message (no stream: the sleeping runtime must wake up,
and that wake-up cost is reported, not spun away). The floors of the periodic row sleep one period between round
trips: what a receiver that sleeps pays.
"""
from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zmq
from rich.console import Console

from edgeinfer.bench.floors import raw_pubsub_round_trip_ns, raw_zmq_round_trip_ns
from edgeinfer.bench.suite_report import check_output
from edgeinfer.core import transport
from edgeinfer.core.clock import sleep_until
from edgeinfer.core.config import refuse_bad
from edgeinfer.core.progress import Progress
from edgeinfer.core.wire import ActionChunk, Observation, Start, Stats, Stop, encode
from edgeinfer.node.runtime import RuntimeConfig
from edgeinfer.procs.node_spec import NodeSpec
from edgeinfer.procs.nodes import NodeGroup

D = 6  # joints, as the Schunk arm


def _observation(seq: int, t_ns: int | None = None) -> Observation:
    q = np.linspace(-1.0, 1.0, D)
    return Observation(seq, time.perf_counter_ns() if t_ns is None else t_ns, q, np.zeros(D), q)


def payload_bytes() -> int:
    """Bytes on the wire of one Observation (header + arrays): the floor's payload."""
    return sum(memoryview(f).nbytes for f in encode(_observation(0)))


class NullRuntimeNode:
    """A real `edgeinfer serve` process with the null policy, handshaken and started; use as a context manager."""

    def __init__(self, log_path: Path | None = None, **runtime_options):
        self.ep = transport.Endpoints.free_loopback()
        self.ep.status = None
        cfg = RuntimeConfig(null_policy=True, replan_every_ticks=1, idle_timeout_s=30.0, max_obs_age_ms=None,
                            **runtime_options)
        self._tmp = None if log_path else tempfile.TemporaryDirectory(prefix="edgeinfer-bench-")
        log_path = Path(log_path) if log_path else Path(self._tmp.name) / "runtime.log"
        self.group = NodeGroup(grace_s=5.0)
        self.proc = self.group.start(NodeSpec("serve", (cfg, self.ep), "null runtime", log_path))
        self.ctx = zmq.Context()
        self.pub = transport.pub(self.ctx, self.ep.obs, bind=True)
        self.chunks = transport.Receiver(transport.sub(self.ctx, self.ep.chunks, hwm=10_000))
        ready = transport.Receiver(transport.pull(self.ctx, self.ep.ready, bind=True))
        try:
            transport.wait_until_subscribed(self.pub, "bench", ready, {"runtime"}, 120.0,
                                            check=self.group.check_started)
            transport.wait_for_hello([self.chunks], 30.0)
        except BaseException:  # a failed start leaves no runtime behind
            self.group.close()
            self.ctx.destroy(linger=0)
            raise
        finally:
            ready.close()
        transport.send(self.pub, Start(time.perf_counter_ns(), 4_000_000, 2**40))
        self.seq = 0
        self.stats: Stats | None = None  # the runtime's newest Stats

    def round_trip_ns(self, n: int, idle_gap_ms: float = 0.0, warmup: int = 50, wait_s: float = 2.0,
                      period_ns: int | None = None) -> tuple[np.ndarray, int]:
        """((n,) int64 ns from publishing an Observation to decoding its ActionChunk, lost): an observation whose
        chunk has not come within wait_s is counted lost, not timed, and the next one is sent. period_ns: a
        fixed-rate stream instead, as a robot sends one: a new Start (the runtime serves the new stream from its
        seq 0 and learns the period), then observation k stamped with its due time t0 + k * period_ns and sent at
        it (a due time already past is skipped: no burst). Raises TimeoutError, with the runtime log's last
        lines, when more than max(5, 1 %) are lost."""
        out, lost, i = np.empty(n, dtype=np.int64), 0, -warmup
        if period_ns is not None:
            t0_ns = time.perf_counter_ns() + 20_000_000
            transport.send(self.pub, Start(t0_ns, period_ns, 2**40))
            self.seq = -1
        while i < n:
            if period_ns is None:
                # Between observations the runtime's Heartbeats and Stats keep arriving on the chunk SUB; a control
                # loop reads them as they come, so they are read here too, before the clock starts.
                gap_end_ns = time.perf_counter_ns() + (int(idle_gap_ms * 1e6) if i >= 0 else 0)
                while (left_ns := gap_end_ns - time.perf_counter_ns()) > 0:
                    self._take(self.chunks.recv(max(1, left_ns // 1_000_000)))
                self.seq, t_obs_ns = self.seq + 1, None
            else:
                self.seq = max(self.seq + 1, math.ceil((time.perf_counter_ns() - t0_ns) / period_ns))
                t_obs_ns = t0_ns + self.seq * period_ns
                sleep_until(t_obs_ns - 100_000)  # Heartbeats and Stats are read just before the due time
            for msg in self.chunks.drain():
                self._take(msg)
            if t_obs_ns is not None:
                sleep_until(t_obs_ns, spin_ns=100_000)
            obs = _observation(self.seq, t_obs_ns)
            t = time.perf_counter_ns()
            transport.send(self.pub, obs)
            deadline_ns = t + int(wait_s * 1e9)
            while (left_ns := deadline_ns - time.perf_counter_ns()) > 0:  # Heartbeats and Stats: skipped
                msg = self._take(self.chunks.recv(max(1, left_ns // 1_000_000)))
                if isinstance(msg, ActionChunk) and msg.obs_seq == self.seq:
                    break
            else:
                lost += 1
                if lost > max(5, (n + warmup) // 100):
                    raise TimeoutError(f"{lost} observations got no chunk within {wait_s} s; the null runtime's "
                                       f"log ends: {self.log_tail()!r}")
                continue
            if i >= 0:
                out[i] = time.perf_counter_ns() - t
            i += 1
        return out, lost

    def _take(self, msg):
        """Keep the runtime's newest Stats; return msg."""
        if isinstance(msg, Stats):
            self.stats = msg
        return msg

    def runtime_counters(self, timeout_s: float = 2.0) -> dict[str, int]:
        """The runtime's counters from its next Stats (every runtime_stats_ms: 200 ms); {} when none came."""
        seen = self.stats.seq if self.stats is not None else -1
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and (self.stats is None or self.stats.seq == seen):
            self._take(self.chunks.recv(50))
        return dict(self.stats.counters) if self.stats is not None and self.stats.seq != seen else {}

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the runtime's log (its output goes to a file, for this)."""
        return self.proc.tail(chars)

    def close(self) -> None:
        transport.send(self.pub, Stop("bench done"))
        self.group.finish([self.proc], timeout_s=10.0, term_s=0.1)  # SIGKILL, as before, when Stop was not enough
        self.group.close()
        self.ctx.destroy(linger=0)
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _row(name: str, ours: np.ndarray, floor: np.ndarray, pattern: np.ndarray, codec: np.ndarray) -> dict:
    p = lambda a, q: float(np.percentile(a, q) / 1e3)  # noqa: E731
    return {"scenario": name, "n": len(ours),
            "edgeinfer_p50_us": p(ours, 50), "edgeinfer_p99_us": p(ours, 99),
            "raw_zmq_p50_us": p(floor, 50), "raw_zmq_p99_us": p(floor, 99),
            "raw_pubsub_p50_us": p(pattern, 50), "raw_pubsub_p99_us": p(pattern, 99),
            "minimal_codec_p50_us": p(codec, 50), "minimal_codec_p99_us": p(codec, 99),
            "ratio_p50": p(ours, 50) / p(floor, 50), "ratio_p99": p(ours, 99) / p(floor, 99)}


def _arrivals(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The runtime's obs_arrival.<kind> counts between two snapshots of its counters, by kind."""
    return {k.split(".", 1)[1]: v - before.get(k, 0) for k, v in after.items() if k.startswith("obs_arrival.")}


def run(n: int = 2000, n_idle: int = 100, idle_gap_ms: float = 100.0, log_path: Path | None = None,
        n_periodic: int = 1000, rate_hz: float = 250.0, obs_spin_us: float | None = None,
        console: Console | None = None) -> list[dict]:
    """The three scenarios, edgeinfer and the floors side by side. Returns one dict per scenario; vs_back_to_back_p50
    is its edgeinfer p50 over the back-to-back one, runtime_arrivals the runtime's obs_arrival counters over it
    (edgeinfer/node/source.py: on_time = caught while spinning). obs_spin_us: the runtime's (None: its default;
    0: it sleeps until each observation comes). Progress goes to `console` (stderr when None) between the timed
    loops."""
    console = console or Console(stderr=True)
    size = payload_bytes()
    frames = [bytes(f) for f in encode(_observation(0))]
    period_ns = round(1e9 / rate_hz)
    scenarios = (("back to back", n, 0.0, None), (f"periodic {rate_hz:g} Hz", n_periodic, period_ns / 1e6, period_ns),
                 (f"idle {idle_gap_ms:g} ms", n_idle, idle_gap_ms, None))
    rows = []
    spin = {} if obs_spin_us is None else {"obs_spin_us": obs_spin_us}
    with Progress("bench transport: starting the null runtime node", 4 * len(scenarios), console) as bar, \
            NullRuntimeNode(log_path, **spin) as node:
        before = node.runtime_counters()
        for name, count, gap, period in scenarios:  # reported between the timed loops, never inside one
            bar.update(label=f"bench transport: {name}, edgeinfer ({count} round trips)")
            ours, lost = node.round_trip_ns(count, 0.0 if period else gap, period_ns=period)
            after = node.runtime_counters()
            bar.advance(label=f"bench transport: {name}, raw REQ/REP")
            floor = raw_zmq_round_trip_ns(size, count, gap)
            bar.advance(label=f"bench transport: {name}, raw PUB/SUB")
            pattern = raw_pubsub_round_trip_ns(frames, count, gap)
            bar.advance(label=f"bench transport: {name}, minimal codec")
            codec = raw_pubsub_round_trip_ns(frames, count, gap, codec=True)
            bar.advance()
            arrivals = _arrivals(before, after)
            rows.append(_row(name, ours, floor, pattern, codec) | {"edgeinfer_lost": lost,
                                                                   "runtime_arrivals": arrivals})
            before = after
        bar.update(label="bench transport")
    for r in rows:
        r["vs_back_to_back_p50"] = r["edgeinfer_p50_us"] / rows[0]["edgeinfer_p50_us"]
    return rows


@dataclass
class TransportBenchConfig:
    """`edgeinfer bench transport`: how many round trips each scenario times, and where the rows go."""

    n: int = 2000  # round trips back to back
    n_idle: int = 100  # round trips with an idle gap before each
    idle_gap_ms: float = 100.0  # the idle gap before each round trip of the idle scenario, ms
    n_periodic: int = 1000  # round trips of the periodic stream
    rate_hz: float = 250.0  # rate of the periodic stream, Hz
    # The runtime's spin window around a due observation, us (None: RuntimeConfig's; 0: off).
    obs_spin_us: float | None = None
    json: Path | None = None  # also write the rows here

    def __post_init__(self):
        refuse_bad(type(self).__name__, (
            ("n", self.n, self.n >= 10, ">= 10"), ("n_idle", self.n_idle, self.n_idle >= 10, ">= 10"),
            ("n_periodic", self.n_periodic, self.n_periodic >= 10, ">= 10"),
            ("idle_gap_ms", self.idle_gap_ms, 0 < self.idle_gap_ms <= 10_000, "in (0, 10000]"),
            ("rate_hz", self.rate_hz, 1 <= self.rate_hz <= 2000, "in [1, 2000]")))


def main(argv: list[str] | None = None) -> int:
    """`edgeinfer bench transport` as a program of its own: parse TransportBenchConfig options, then run_command."""
    from edgeinfer.bench.suite_cli import parse_suite

    return run_command(parse_suite("transport", TransportBenchConfig, argv, __doc__.split("\n\n")[0])[0])


def run_command(cfg: TransportBenchConfig) -> int:
    """`edgeinfer bench transport`: run every scenario, print the rows (and write them to --json); 0. Raises
    ValueError for a --json that cannot be written (before the run)."""
    check_output(cfg.json)
    rows = run(cfg.n, cfg.n_idle, cfg.idle_gap_ms, n_periodic=cfg.n_periodic, rate_hz=cfg.rate_hz,
               obs_spin_us=cfg.obs_spin_us)
    print(f"observation -> chunk round trip, {payload_bytes()} B payload, loopback TCP, two processes (us)")
    print(f"{'scenario':<16} {'n':>6} {'edgeinfer p50':>14} {'p99':>8} {'raw REQ/REP p50':>16} {'p99':>8} "
          f"{'x p50':>6} {'x p99':>6} {'raw PUB/SUB p50':>16} {'p99':>8} {'+ min. codec p50':>17} {'p99':>8}")
    for r in rows:
        print(f"{r['scenario']:<16} {r['n']:>6} {r['edgeinfer_p50_us']:>14.1f} {r['edgeinfer_p99_us']:>8.1f} "
              f"{r['raw_zmq_p50_us']:>16.1f} {r['raw_zmq_p99_us']:>8.1f} {r['ratio_p50']:>6.2f} {r['ratio_p99']:>6.2f} "
              f"{r['raw_pubsub_p50_us']:>16.1f} {r['raw_pubsub_p99_us']:>8.1f} "
              f"{r['minimal_codec_p50_us']:>17.1f} {r['minimal_codec_p99_us']:>8.1f}")
    b2b, periodic, idle = rows
    print(f"{periodic['scenario']}: p50 {periodic['vs_back_to_back_p50']:.2f}x back to back (bar: 1.2x); the "
          f"runtime caught {periodic['runtime_arrivals'].get('on_time', 0)} of the "
          f"{sum(periodic['runtime_arrivals'].values())} observations it got while spinning (the {periodic['n']} "
          f"timed and their warm-up; obs_arrival: {periodic['runtime_arrivals']})")
    print(f"{idle['scenario']}: wake-up cost {idle['edgeinfer_p50_us'] - b2b['edgeinfer_p50_us']:+.1f} us at p50 over "
          f"back to back (raw REQ/REP: {idle['raw_zmq_p50_us'] - b2b['raw_zmq_p50_us']:+.1f} us); no core is spun "
          "for a stream that is not there")
    if lost := sum(r["edgeinfer_lost"] for r in rows):
        print(f"{lost} observation(s) got no chunk within 2 s: counted lost, not timed (edgeinfer_lost)")
    if cfg.json:
        cfg.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
