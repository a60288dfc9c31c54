"""Real `edgeinfer serve` (the null policy) and `edgeinfer control` processes at the boundary: a Start with
an absurd period is refused by name and the run goes on; the runtime's idle exit follows the control loop's
Heartbeats, not the gaps of the log; a stream 300 ms late on this host is stale, never an offset. Structure and
counts with bounds a 100 ms host stall cannot break, never speed."""
import time

import pytest
import zmq
from test_serve_restart import P, Source, _chunks, runtime  # noqa: F401  (the fixture)

from edgeinfer.control.loop import ControlConfig
from edgeinfer.core import transport
from edgeinfer.core.clock import now_ns
from edgeinfer.core.wire import ActionChunk, ErrorEvent, Start, Stats
from edgeinfer.node.runtime import RuntimeConfig
from edgeinfer.procs.node_spec import NodeSpec
from edgeinfer.procs.nodes import NodeGroup

MS = 1_000_000
ABSURD_PERIODS = (0, -4 * MS, 2**62)


def _stats(msgs) -> dict:
    return next((m.counters for m in reversed(msgs) if isinstance(m, Stats) and m.sender == "runtime"), {})


def test_a_start_with_an_absurd_period_is_refused_and_the_runtime_keeps_serving(runtime):  # noqa: F811
    rt = runtime()
    src = rt.first_session()
    transport.send(src.pub, Start(src.now(), 0, 10**6))  # in the handshake: passed over, a valid one awaited
    src.stream(range(40), t0 := src.start())
    assert 39 in _chunks(rt.read(0.3), t0)
    for period in ABSURD_PERIODS:  # mid-run (on main: "budget_ms must be in (0, 10000]", the runtime gone)
        transport.send(src.pub, Start(src.now(), period, 10**6))
    k = (now_ns() - t0) // P + 1
    src.stream(range(k, k + 50), t0)  # on the schedule in force: 0.2 s
    msgs = rt.read(0.3)
    served = [m for m in msgs if isinstance(m, ActionChunk) and m.rung == "full" and m.obs_seq >= k]
    assert len(served) >= 20 and {m.step_ns for m in served} == {5 * P}  # the Start's period x the stride, unchanged
    refused = [m for m in rt.seen if isinstance(m, ErrorEvent) and m.kind == "start_refused"]
    assert refused and "Start.period_ns must be an integer in (0, 10000000000] ns" in refused[-1].detail
    counters = rt.stop(src).counters
    assert counters["error.start_refused"] == 1 + len(ABSURD_PERIODS)
    assert counters["source_restarts"] == 0  # a refused Start begins no session


def test_a_stream_300_ms_late_on_this_host_is_stale_and_never_served(runtime):  # noqa: F811
    # The red team's run on main: taken for a clock offset after 0.47 s, then 52 chunks from observations 304 ms old.
    rt = runtime()  # obs_clock "auto" on loopback: this host's clock
    src = rt.first_session(offset_ns=-300 * MS)  # stamps t, sends at t + 300 ms
    src.stream(range(250), t0 := src.start())  # 1 s: twice the window an offset was declared after
    msgs = rt.read(0.3)
    assert _chunks(msgs, t0) == []
    late = [m for m in rt.seen if isinstance(m, ErrorEvent) and m.kind == "obs_late"]
    assert len(late) == 1 and "obs_clock" in late[0].detail
    counters = rt.stop(src).counters
    assert counters["obs_stale"] >= 125 and counters.get("rung.full", 0) == 0  # superseded ones are not decoded
    assert "error.clock_offset" not in counters and counters["error.obs_late"] == 1


class Run:
    """A runtime and a control loop, real processes, and the replayer's side of them here: the observation PUB, the
    ready PULL, a chunk SUB and the commands PULL."""

    def __init__(self, tmp_path, idle_timeout_s: float):
        self.ep = transport.Endpoints.free_loopback()  # with the control loop's status endpoint
        self.group = NodeGroup(grace_s=5.0)
        self.ctx = zmq.Context()
        self.src = Source(self.ep)
        self.chunks = transport.Receiver(transport.sub(self.ctx, self.ep.chunks, hwm=10_000))
        self.commands = transport.Receiver(transport.pull(self.ctx, self.ep.commands))
        cfg = RuntimeConfig(null_policy=True, replan_every_ticks=1, runtime_stats_ms=50.0,
                            idle_timeout_s=idle_timeout_s)
        self.runtime = self.group.start(NodeSpec("serve", (cfg, self.ep), "runtime", tmp_path / "runtime.log"))
        self.control = self.group.start(NodeSpec("control", (ControlConfig(realtime_priority=0), self.ep), "control",
                                                 tmp_path / "control.log"))
        self.control_log = tmp_path / "control.log"
        self.seen: list = []

    def handshake(self) -> None:
        transport.wait_until_subscribed(self.src.pub, "replayer", self.src.ready, {"runtime", "control"}, 60.0,
                                        check=self.group.check_started)
        transport.wait_for_hello([self.chunks], 30.0)

    def read(self, for_s: float) -> list:
        got, deadline = [], time.monotonic() + for_s
        while time.monotonic() < deadline:
            if (msg := self.chunks.recv(20)) is not None:
                got.append(msg)
            self.commands.drain()
        self.seen += got
        return got

    def close(self) -> None:
        self.src.close()
        self.group.close()
        self.ctx.destroy(linger=0)


@pytest.fixture
def run(tmp_path):
    made = []

    def make(**kw) -> Run:
        made.append(Run(tmp_path, **kw))
        return made[-1]
    yield make
    for r in made:
        r.close()


def test_the_runtime_outlives_a_log_gap_while_the_control_loop_beats_and_exits_when_it_is_gone(run):
    r = run(idle_timeout_s=1.0)
    r.handshake()
    src = r.src
    transport.send(src.pub, Start(src.now(), 0, 10**6))  # refused by both, by name: the control loop's Ticker too
    t0 = src.start()  # 30 s of ticks
    src.stream(range(100), t0)  # 0.4 s
    assert 99 in _chunks(r.read(0.2), t0)
    r.read(2.5)  # the log's gap: 2.5 s without an observation, 2.5 x idle_timeout_s (on main: the runtime exits)
    assert r.runtime.poll() is None, r.runtime.tail()
    k = (now_ns() - t0) // P + 1
    src.stream(range(k, k + 100), t0)
    served = _chunks(r.read(0.3), t0 + k * P)
    assert len(served) >= 50, r.runtime.tail()  # served again after the gap (a 100 ms stall costs at most 25)
    assert r.control.poll() is None and "Start refused: Start.period_ns must be" in r.control_log.read_text()
    r.control.kill()  # the control loop gone: the runtime follows within idle_timeout_s (and a stall), on its own
    t_kill = time.monotonic()
    while r.runtime.poll() is None and time.monotonic() - t_kill < 10:
        r.read(0.05)
    assert r.runtime.poll() == 0, r.runtime.tail()
    assert 0.9 <= time.monotonic() - t_kill  # not before idle_timeout_s (its lease loss alone ends nothing)
    assert "no Heartbeat from the control loop for" in r.runtime.tail()
    assert _stats(r.seen).get("error.start_refused") == 1
