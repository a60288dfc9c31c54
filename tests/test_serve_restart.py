"""A real `edgeinfer serve` process (the null policy) against observation sources that restart (on a clock that
jumped), stamp on an offset clock, send a corrupted timestamp, stream periodically and pause: structure and counts,
never speed (edgeinfer/node/source.py)."""
import dataclasses
import re
import time

import numpy as np
import psutil
import pytest
import zmq

from edgeinfer.core import transport
from edgeinfer.core.clock import now_ns, sleep_until
from edgeinfer.core.wire import ActionChunk, ErrorEvent, Hello, Observation, Start, Stats, Stop
from edgeinfer.node.runtime import RuntimeConfig
from edgeinfer.procs.node_spec import NodeSpec
from edgeinfer.procs.nodes import NodeGroup

MS = 1_000_000
P = 4 * MS  # 250 Hz


class Source:
    """One session of an observation source (a robot client): its own context and sockets, bound where the last
    one was, as a restarted process binds them. offset_ns: its clock minus this host's."""

    def __init__(self, ep: transport.Endpoints, offset_ns: int = 0):
        self.offset_ns = offset_ns
        self.ctx = zmq.Context()
        self.pub = transport.pub(self.ctx, ep.obs)
        self.ready = transport.Receiver(transport.pull(self.ctx, ep.ready))

    def now(self) -> int:
        return now_ns() + self.offset_ns

    def handshake(self, timeout_s: float = 60.0) -> None:
        """Hellos (on this source's clock) until the runtime reports ready: as transport.wait_until_subscribed."""
        deadline = time.monotonic() + timeout_s
        while not isinstance(self.ready.recv(10), Hello):
            assert time.monotonic() < deadline, "the runtime never answered this source's Hellos"
            transport.send(self.pub, Hello("robot", 0, self.now()))

    def start(self) -> int:
        t0 = self.now()
        transport.send(self.pub, Start(t0, P, 10**6))
        return t0

    def stream(self, seqs, t0_src: int) -> None:
        """Observation k at t0 + k * P (this source's clock), sent then."""
        for k in seqs:
            t = t0_src + k * P
            sleep_until(t - self.offset_ns, spin_ns=50_000)
            q = np.full(6, 0.01 * k)
            transport.send(self.pub, Observation(k, t, q, np.zeros(6), q))

    def close(self) -> None:
        self.ctx.destroy(linger=0)


class Runtime:
    """A real runtime node process and a chunk SUB on it (a control loop's view)."""

    def __init__(self, tmp_path, **options):
        self.ep = dataclasses.replace(transport.Endpoints.free_loopback(), status=None)
        cfg = RuntimeConfig(null_policy=True, replan_every_ticks=1, runtime_stats_ms=50.0, idle_timeout_s=20.0,
                            **options)
        self.group = NodeGroup(grace_s=5.0)
        self.proc = self.group.start(NodeSpec("serve", (cfg, self.ep), "runtime", tmp_path / "runtime.log"))
        self.ctx = zmq.Context()
        self.chunks = transport.Receiver(transport.sub(self.ctx, self.ep.chunks, hwm=10_000))
        self.seen: list = []
        self.sources: list[Source] = []

    def source(self, offset_ns: int = 0) -> Source:
        """A new session of the source (closed with this runtime, if not before)."""
        self.sources.append(Source(self.ep, offset_ns))
        return self.sources[-1]

    def first_session(self, offset_ns: int = 0) -> Source:
        """The first source: handshaken, and this SUB hearing the runtime, before its Start."""
        src = self.source(offset_ns)
        src.handshake()
        transport.wait_for_hello([self.chunks], 30.0)
        return src

    def read(self, for_s: float) -> list:
        """Every message on the chunk SUB for for_s seconds (kept in self.seen too)."""
        got, deadline = [], time.monotonic() + for_s
        while time.monotonic() < deadline:
            if (msg := self.chunks.recv(20)) is not None:
                got.append(msg)
        self.seen += got
        return got

    def stop(self, src: Source) -> dict[str, int]:
        """Stop the run; the runtime's final counters."""
        transport.send(src.pub, Stop("test done"))
        final, deadline = None, time.monotonic() + 10
        while self.proc.poll() is None and time.monotonic() < deadline:
            for msg in self.read(0.05):
                final = msg if isinstance(msg, Stats) else final
        self.read(0.2)
        final = next((m for m in reversed(self.seen) if isinstance(m, Stats)), final)
        assert self.proc.poll() == 0, self.proc.tail()
        return final

    def close(self) -> None:
        for src in self.sources:
            src.close()
        self.group.close()
        self.ctx.destroy(linger=0)


@pytest.fixture
def runtime(tmp_path):
    made = []

    def make(**options) -> Runtime:
        made.append(Runtime(tmp_path, **options))
        return made[-1]
    yield make
    for r in made:
        r.close()


def _chunks(msgs, t_from_ns: int) -> list[int]:
    """obs_seq of the full chunks for observations taken at or after t_from_ns (on the source's clock)."""
    return [m.obs_seq for m in msgs if isinstance(m, ActionChunk) and m.rung == "full" and m.t_obs_ns >= t_from_ns]


def test_a_restarted_source_is_served_from_its_first_observation(runtime):
    rt = runtime()
    first = rt.first_session()
    first.stream(range(40), t0 := first.start())
    assert 39 in _chunks(rt.read(0.3), t0)
    first.close()
    again = rt.source()  # the robot restarted: its handshake (answered mid-run), a new Start, seq from 0
    again.handshake(timeout_s=5.0)
    again.stream(range(40), t0 := again.start())
    served = _chunks(rt.read(0.3), t0)
    assert served and min(served) < 30  # served from the start of its stream, not once seq passes 39
    counters = rt.stop(again).counters
    assert (counters["source_restarts"], counters["obs_out_of_order"]) == (1, 0)


@pytest.mark.parametrize("jump_s", [0.0, -2.0])
def test_a_source_that_restarts_without_a_start_is_served_too(runtime, jump_s):
    # jump_s: its clock after the restart minus before (-2 s: a rebooted host's clock, behind); on loopback, declared
    # another host's clock (on this host's, a stream 2 s behind is stale: tests/test_obs_clock.py)
    rt = runtime(obs_clock="other")
    first = rt.first_session()
    first.stream(range(40), t0 := first.start())
    assert 39 in _chunks(rt.read(0.3), t0)
    first.close()
    again = rt.source(offset_ns=int(jump_s * 1e9))  # no handshake, no Start: seq 0 again
    time.sleep(0.1)  # the runtime's SUB reconnects (RECONNECT_IVL 10 ms); what is sent before that is lost
    again.stream(range(40), t1 := again.now())
    msgs = rt.read(0.3)
    served = [m.obs_seq for m in msgs if isinstance(m, ActionChunk) and t1 <= m.t_obs_ns < t1 + 40 * P]
    assert served and min(served) < 30  # not once seq passes 39, nor once its time passes the old session's
    jumps = [m for m in msgs if isinstance(m, ErrorEvent) and m.kind == "clock_jump"]
    counters = rt.stop(again).counters
    if jump_s:  # a session on the clock after the jump, from its third observation (the first two: implausible)
        assert len(jumps) == 1 and counters["error.clock_jump"] == 1 and 2 <= counters["obs_implausible"] < 20
        said_ms = float(re.search(r"jumped ([+-][0-9.]+) ms", jumps[0].detail).group(1))
        assert said_ms == pytest.approx(jump_s * 1e3, abs=100) and counters["source_restarts"] == 0
    else:
        assert not jumps and counters["source_restarts"] == 1


@pytest.mark.parametrize("offset_s", [-3.0, 3.0])
def test_an_offset_clock_is_detected_reported_once_and_served(runtime, offset_s):
    # max_obs_age_ms 50 (the default): behind by 3 s, every observation looked stale forever; declared another host's
    # clock (on loopback, "auto" is this host's: ages true, tests/test_obs_clock.py)
    rt = runtime(obs_clock="other")
    src = rt.first_session(offset_ns=int(offset_s * 1e9))
    src.stream(range(200), t0 := src.start())  # 0.8 s: more than the estimator's window
    msgs = rt.read(0.3)
    assert len(_chunks(msgs, t0)) >= 10
    events = [m for m in msgs if isinstance(m, ErrorEvent) and m.kind == "clock_offset"]
    assert len(events) == 1 and "perf_counter_ns" in events[0].detail  # what to do about it
    said_ms = float(re.search(r"on a clock ([+-][0-9.]+) ms", events[0].detail).group(1))
    assert said_ms == pytest.approx(offset_s * 1e3, abs=100)
    counters = rt.stop(src).counters
    assert counters["error.clock_offset"] == 1
    assert counters["rung.full"] >= 10


def test_a_corrupted_timestamp_is_counted_and_poisons_nothing(runtime):
    rt = runtime()  # max_obs_age_ms 50 (the default): one corrupted t_ns set the floor, every later one looked stale
    src = rt.first_session()
    src.stream(range(50), t0 := src.start())
    for n, dt in enumerate((1 << 40, -(1 << 31)), start=1):  # a bit of t_ns flipped: 1100 s ahead, 2.1 s behind
        k = (now_ns() - t0) // P  # a copy of the newest observation, the bit flipped
        transport.send(src.pub, Observation(k, t0 + k * P + dt, np.zeros(6), np.zeros(6), np.zeros(6)))
        deadline = time.monotonic() + 10
        while not any(isinstance(m, Stats) and m.counters.get("obs_implausible", 0) >= n for m in rt.read(0.05)):
            assert time.monotonic() < deadline, "the corrupted observation was never counted"
        k = (now_ns() - t0) // P + 1
        src.stream(range(k, k + 50), t0)  # 0.2 s: served, not stale (a 100 ms stall costs at most 25)
        assert len(_chunks(rt.read(0.1), t0 + k * P)) >= 20
    counters = rt.stop(src).counters
    assert counters["obs_implausible"] == 2 and "error.clock_offset" not in counters
    assert (counters["source_restarts"], counters["obs_out_of_order"]) == (0, 0)


def test_a_periodic_stream_finds_the_loop_awake_and_a_pause_costs_no_spinning(runtime):
    rt = runtime(max_obs_age_ms=None)  # nothing dropped as stale: a host stall cannot hide an arrival
    src = rt.first_session()
    src.stream(range(100), t0 := src.start())
    proc = psutil.Process(rt.proc.pid)
    rt.read(0.2)
    cpu_before = sum(proc.cpu_times()[:2])
    rt.read(1.0)  # the stream paused: the runtime sleeps (its beacon beats every 2 ms)
    assert sum(proc.cpu_times()[:2]) - cpu_before < 0.3
    k = (now_ns() - t0) // P + 5
    src.stream(range(k, k + 10), t0)  # after the pause, on the same schedule
    rt.read(0.1)
    final = rt.stop(src)
    arrivals = {k.split(".")[1]: v for k, v in final.counters.items() if k.startswith("obs_arrival.")}
    assert sum(arrivals.values()) == final.counters["rung.full"] == len(_chunks(rt.seen, t0))
    assert arrivals["idle"] >= 2  # the first of the stream, the first after the pause
    assert arrivals.get("on_time", 0) >= 1  # caught while spinning
    assert sum(final.histograms["obs_age_after_idle"]) == arrivals["idle"]
