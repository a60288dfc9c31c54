"""Fleet replay: the robot side (schedule, control loop, figures) on injected clocks and against a tiny ROUTER in
this test, and end to end against the real fleet runtime (edgeinfer fleet) with real processes and sockets."""
from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np
import pytest
import zmq

from edgeinfer.core import transport
from edgeinfer.core.clock import now_ns
from edgeinfer.core.wire import RUNGS, ActionChunk, Admission, Join, Observation, Stop, decode, encode
from edgeinfer.logs.arm_log import synthetic_log
from edgeinfer.sim.fleet_report import fleet_summary, robot_figures
from edgeinfer.sim.fleet_robot import RobotClient, RobotControl, RobotPlan, robot_socket, run_clients

MS = 1_000_000
PERIOD = 4 * MS
H, D = 8, 6


def _plan(name="r0", n_requests=10, budget_ms=20.0, log=None, **kw) -> RobotPlan:
    return RobotPlan(name, log or synthetic_log(seconds=1.0), PERIOD, 5, 5, n_requests, int(budget_ms * MS),
                     int(budget_ms * MS), **kw)


def _chunk(obs_seq: int, t_obs: int, rung: str = "full", q: float = 0.0) -> ActionChunk:
    return ActionChunk(1, obs_seq, t_obs, t_obs, 5 * PERIOD, np.full((H + 1, D), q), rung, 48, 1, 0, 0)


class FakeSocket:
    """A DEALER stand-in that keeps what was sent."""

    def __init__(self):
        self.sent = []

    def send_multipart(self, frames, flags=0):
        self.sent.append(decode(frames))


def test_requests_follow_the_replan_grid_and_loop_the_log():
    log = synthetic_log(seconds=0.5)  # 125 rows: ticks 0..124, looped at 125
    plan = _plan(n_requests=30, log=log)
    obs = plan.requests()
    assert [o.seq for o in obs[:3]] == [0, 5, 10]
    assert obs[-1].seq == 145  # the seq keeps counting through the loop
    np.testing.assert_array_equal(obs[2].q_rad, log.q_rad[10])
    np.testing.assert_array_equal(obs[2].q_prev_rad, log.q_rad[5])  # stride 5 ticks earlier
    np.testing.assert_array_equal(obs[25].q_rad, log.q_rad[0])  # tick 125 is the log's tick 0 again
    np.testing.assert_array_equal(obs[0].q_prev_rad, log.q_rad[0])  # nothing earlier: row 0


def test_control_loop_counts_startup_and_steady_misses_on_the_ticks_it_passes():
    t0 = 1_000 * MS
    ctl = RobotControl(t0, PERIOD, 100)
    ctl.receive(t0 + 9 * MS, _chunk(0, t0))  # covers t0 .. t0 + 160 ms; usable from tick 3 (t0 + 12 ms) on
    ctl.advance(t0 + 399 * MS)  # ticks 0..99
    s = ctl.summary()
    assert s["ticks"] == 100 and s["startup_ticks"] == 3
    assert s["misses"] == 100 - 41  # ticks 41.. (after t0 + 160 ms) have no chunk
    assert s["miss_ticks"][0] == 41
    assert s["rungs"] == {"full": 41 - 3}


def test_control_loop_uses_only_chunks_received_by_the_tick():
    t0 = 0
    ctl = RobotControl(t0, PERIOD, 10)
    ctl.receive(0, _chunk(0, t0, q=1.0))
    ctl.receive(18 * MS, _chunk(5, t0 + 4 * MS, q=2.0))  # a newer plan, received between ticks 4 and 5
    ctl.advance(16 * MS)  # ticks 0..4
    assert ctl.buffer.sample(16 * MS)[0][0] == 1.0
    ctl.advance(36 * MS)
    assert ctl.buffer.sample(20 * MS)[0][0] == 2.0 and ctl.summary()["misses"] == 0


def _admitted(client: RobotClient, t0: int, budget_ns: int = 20 * MS) -> None:
    client.start(t0)
    client.on_due(t0)  # the Join
    client.on_frames(encode(Admission(client.plan.name, 1, budget_ns, 1, 5 * MS, "fits")), t0 + 1 * MS)


def test_robot_joins_then_sends_on_an_absolute_schedule_and_skips_an_overrun():
    sock = FakeSocket()
    client = RobotClient(_plan(n_requests=5, join_lead_ns=50 * MS), sock)
    t0 = 10_000 * MS
    _admitted(client, t0)
    assert isinstance(sock.sent[0], Join) and sock.sent[0].budget_ns == 20 * MS
    assert client.next_due_ns() == t0 + 60 * MS  # the first 20 ms slot at least join_lead after the Join
    client.on_due(t0 + 60 * MS)
    client.on_due(t0 + 101 * MS)  # request 1 (due 80 ms) comes up after request 2 is due: skipped, not sent late
    client.on_due(t0 + 101 * MS)  # request 2 (due 100 ms): sent, stamped with its due time
    sent = [m for m in sock.sent if isinstance(m, Observation)]
    assert [(o.seq, o.t_ns - t0) for o in sent] == [(0, 60 * MS), (10, 100 * MS)]
    assert client.skipped.tolist() == [False, True, False, False, False]


def test_refused_robot_keeps_the_reason_and_sends_nothing_more():
    sock = FakeSocket()
    client = RobotClient(_plan(), sock)
    client.start(0)
    client.on_due(0)
    client.on_frames(encode(Admission("r0", 0, 0, 5, 30 * MS, "batch 5 needs 30 ms > 20 ms budget")), 1 * MS)
    assert client.finished and client.next_due_ns() is None
    fig = robot_figures(*client.record())
    assert fig["admitted"] is False and "30 ms" in fig["admission"]["reason"] and "requests" not in fig
    assert fleet_summary({"r0": fig})["refused"] == {"r0": "batch 5 needs 30 ms > 20 ms budget"}


def test_figures_count_attained_late_lost_and_rungs():
    client = RobotClient(_plan(n_requests=4), FakeSocket())
    t0 = 0
    _admitted(client, t0)
    for j in range(4):
        client.on_due(int(client.t_sched[j]))
    t = client.t_sched
    client.on_frames(encode(_chunk(0, int(t[0]), "partial")), int(t[0]) + 2 * MS)  # first step early
    client.on_frames(encode(_chunk(0, int(t[0]))), int(t[0]) + 10 * MS)  # full, on time
    client.on_frames(encode(_chunk(5, int(t[1]))), int(t[1]) + 25 * MS)  # full, late
    client.on_frames(encode(_chunk(10, int(t[2]), "coarse")), int(t[2]) + 5 * MS)  # on time, not full
    client.on_due(client.next_due_ns())  # the last deadline: Stop
    assert isinstance(client.sock.sent[-1], Stop) and not client.finished
    client.on_due(client.next_due_ns())  # the settle: the control loop to its end
    fig = robot_figures(*client.record())
    assert (fig["requests"], fig["attained"], fig["on_time_any"], fig["lost"]) == (4, 1, 2, 1)
    assert fig["rungs"] == {"full": 2, "coarse": 1, "none": 1}
    assert fig["latency_ms"]["max"] == pytest.approx(25.0)
    assert fig["attainment_ci95"][0] < 0.25 < fig["attainment_ci95"][1]


def test_malformed_frames_are_counted_and_a_runtime_stop_ends_the_run():
    client = RobotClient(_plan(n_requests=3), FakeSocket())
    _admitted(client, 0)
    client.on_due(int(client.t_sched[0]))
    client.on_frames([b"\x00garbage"], 1)
    client.on_frames(encode(Join("x", 6, PERIOD, 5, 1, 1)), 2)
    assert client.counts == {"malformed.garbage": 1, "unexpected.Join": 1} and client.state == "running"
    client.on_frames(encode(Stop("runtime shutting down")), int(client.t_sched[1]))
    assert client.finished and client.stop_reason == "runtime shutting down"
    assert robot_figures(*client.record())["requests"] == 1


def test_each_robot_gets_its_own_measurement_held_out_first_then_reused_shifted(tmp_path):
    from edgeinfer.sim.fleet_replay import FleetReplayConfig, robot_logs

    for n in (2, 6, 1):
        (tmp_path / f"measurement_{n}").mkdir()
    got = robot_logs(FleetReplayConfig(robots=4, data_dir=tmp_path))
    assert [(Path(p).name, shift) for p, shift in got] == [("measurement_1", 0.0), ("measurement_6", 0.0),
                                                           ("measurement_2", 0.0), ("measurement_1", 0.5)]
    assert robot_logs(FleetReplayConfig(robots=2, data_dir=tmp_path / "none")) == [("synthetic", 0.0),
                                                                                   ("synthetic", 0.5)]


class TinyRuntime:
    """A ROUTER in a thread: admits every robot but `refuse` and answers each observation at once with a full chunk."""

    def __init__(self, ctx: zmq.Context, endpoint: str, refuse: str = ""):
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.bind(endpoint)
        self.refuse, self.stopped, self.seen = refuse, [], {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self):
        while not self.done.is_set():
            if not self.sock.poll(20):
                continue
            peer, *frames = self.sock.recv_multipart()
            msg = decode(frames)
            name = peer.decode()
            if isinstance(msg, Join):
                ok = name != self.refuse
                reply = Admission(name, int(ok), msg.budget_ns if ok else 0, 1, 2 * MS, "ok" if ok else "no slot")
            elif isinstance(msg, Observation):
                self.seen[name] = self.seen.get(name, 0) + 1
                reply = ActionChunk(1, msg.seq, msg.t_ns, msg.t_ns, 5 * PERIOD, np.tile(msg.q_rad, (H + 1, 1)),
                                    "full", 48, 1, 0, 0)
            else:
                assert isinstance(msg, Stop)
                self.stopped.append(name)
                continue
            self.sock.send_multipart([peer, *encode(reply)])

    def close(self):
        self.done.set()
        self.thread.join()
        self.sock.close(linger=0)


def test_robots_in_one_loop_each_get_their_own_chunks(tmp_path):
    ctx = zmq.Context()
    endpoint = f"ipc://{tmp_path}/rt"
    rt = TinyRuntime(ctx, endpoint, refuse="r2")
    try:
        # a generous budget: a 100 ms host stall must not make a chunk late
        clients = [RobotClient(_plan(f"r{i}", n_requests=8, budget_ms=500.0, log=synthetic_log(1.0, seed=i),
                                     phase_ns=i * MS), robot_socket(ctx, endpoint, f"r{i}")) for i in range(3)]
        run_clients(clients, now_ns() + 50 * MS)
    finally:
        rt.close()
        ctx.destroy(linger=0)
    figs = {c.plan.name: robot_figures(*c.record()) for c in clients}
    for name in ("r0", "r1"):
        assert figs[name]["requests"] == 8 and figs[name]["attained"] == 8, figs[name]
        assert figs[name]["chunks_other_robot"] == 0 and figs[name]["control"]["misses"] == 0
        assert figs[name]["control"]["ticks"] == 40
    assert rt.seen == {"r0": 8, "r1": 8} and sorted(rt.stopped) == ["r0", "r1"]
    assert figs["r2"]["admitted"] is False and figs["r2"]["admission"]["reason"] == "no slot"
    # each robot's chunks were planned from its own log: its anchor is its own observation's q
    c0 = clients[0]
    np.testing.assert_array_equal(c0.chunks[3][1].steps_rad[0], c0.plan.log.q_rad[15])
    assert fleet_summary(figs)["served"] == 2


def test_dealer_routing_id_is_the_robot_name(tmp_path):
    ctx = zmq.Context()
    try:
        router = ctx.socket(zmq.ROUTER)
        router.bind(f"ipc://{tmp_path}/r")
        d = transport.dealer(ctx, f"ipc://{tmp_path}/r", "robot07")
        d.send(b"x")
        assert router.poll(2000) and router.recv_multipart()[0] == b"robot07"
    finally:
        ctx.destroy(linger=0)


def test_rung_codes_are_the_wire_ladder():
    assert RUNGS[0] == "full"  # robot_figures reads code 0 as "full"


# ------------------------------------------------------------------ end to end: the real fleet runtime, real processes

def _fleet(tmp_path, name: str, fleet: dict | None = None, **kw) -> dict:
    from rich.console import Console

    from edgeinfer.node.fleet_config import FleetConfig
    from edgeinfer.sim.fleet_replay import FleetReplayConfig, fleet_replay

    kw = {"plots": False} | kw
    cfg = FleetReplayConfig(out=tmp_path / name, robots_per_process=1, handshake_timeout_s=180.0,
                            fleet=FleetConfig(**({"n_slots": 4, "backend": "fused"} | (fleet or {}))), **kw)
    return fleet_replay(cfg, Console(quiet=True))


def _full_chunks(path) -> dict[int, np.ndarray]:
    """obs_seq -> steps_rad of every chunk with rung "full" a robot received (a repeat must be identical)."""
    from edgeinfer.sim.fleet_robot import load_record

    _, a = load_record(path)
    out: dict[int, np.ndarray] = {}
    for seq, rung, steps in zip(a["chunk_obs_seq"], a["chunk_rung"], a["chunk_steps_rad"]):
        if rung == 0:
            assert int(seq) not in out or np.array_equal(out[int(seq)], steps)
            out[int(seq)] = steps
    return out


def test_four_robots_on_different_real_logs_get_the_chunks_each_gets_alone(tmp_path, schunk_dir):
    # a long budget: chunks end full (not cut), on a loaded host too; every robot gets its own Schunk measurement
    kw = dict(robots=4, duration_s=2.0, budget_ms=200.0, keep_chunks=True, data_dir=schunk_dir)
    together = _fleet(tmp_path, "together", **kw)
    # each robot alone on a fresh runtime of one slot (batch invariance: the slots do not matter; warm-up is shorter)
    alone = _fleet(tmp_path, "alone", runtime_per_robot=True, fleet={"n_slots": 1}, **kw)
    assert len({f["log"] for f in together["robots"].values()}) == 4
    assert together["runtime"]["runtime"]["counters"]["admitted"] == 4
    for name, fig in together["robots"].items():
        assert fig["admitted"] and alone["robots"][name]["admitted"]
        mine = _full_chunks(tmp_path / "together" / "robots" / f"{name}.npz")
        ref = _full_chunks(tmp_path / "alone" / "robots" / f"{name}.npz")
        common = sorted(mine.keys() & ref.keys())
        # a newer observation supersedes a queued one: each run has a subset of the 100 requests full; the same
        # ones in both are what is compared
        assert len(common) >= 5, (name, len(mine), len(ref))
        for seq in common:
            np.testing.assert_array_equal(mine[seq], ref[seq], err_msg=f"{name} obs {seq}")


def test_a_robot_joining_and_one_killed_mid_run_do_not_disturb_the_others(tmp_path):
    from edgeinfer.core.fleet_batching import FleetPolicy

    # 3 slots, admitted while one is free: robot03 (joining at 1.2 s) is served only if the slot of robot02
    # (SIGKILLed at 0.5 s) was freed
    # (and no real logs, as on a fresh clone: the embedded synthetic log, shifted per robot)
    rep = _fleet(tmp_path, "drill", robots=4, duration_s=1.5, budget_ms=100.0, join_at_s=[0, 0, 0, 1.2],
                 kill_robot_at_s=[-1, -1, 0.5, -1], data_dir=tmp_path / "no-data", plots=True,
                 fleet={"n_slots": 3, "robot_lease_ms": 250.0, "scheduling": FleetPolicy(admission=False)})
    robots, runtime = rep["robots"], rep["runtime"]["runtime"]
    assert [robots[n]["log_shift_s"] for n in ("robot00", "robot01", "robot03")] == [0.0, 0.5, 1.5]
    assert robots["robot00"]["log"].startswith("synthetic") and (tmp_path / "drill" / "fleet.png").stat().st_size
    assert rep["fleet"]["killed"] == ["robot02"] and robots["robot02"]["killed"]
    assert rep["failed_processes"] == {} and rep["processes"].get("robots2") not in (0, None)  # a drill: no failure
    assert runtime["robots"]["robot02"]["lost"] == 1 and runtime["counters"]["robot_lost"] == 1
    assert robots["robot03"]["admitted"], robots["robot03"]["admission"]
    assert robots["robot03"]["requests"] >= 60 and robots["robot03"]["requests"] - robots["robot03"]["lost"] >= 20
    for name in ("robot00", "robot01", "robot03"):
        ctl = robots[name]["control"]
        # a chunk covers 160 ms: a 100 ms stall of this host costs at most its 25 ticks
        assert ctl["steady_ticks"] >= 300 and ctl["misses"] <= 25, (name, ctl)
        assert robots[name]["chunks_other_robot"] == 0


def test_admission_refuses_a_robot_that_would_break_an_admitted_robots_deadline(tmp_path):
    # Every robot asks for 1 ms and accepts up to 1 s: the first is admitted on the budget its own chunk needs
    # (rounded up to a ms); a later one whose batch makes chunks slower than that budget would break it: refused.
    rep = _fleet(tmp_path, "admission", robots=8, duration_s=1.0, budget_ms=1.0, max_budget_ms=1000.0,
                 join_at_s=[0.1 * i for i in range(8)], fleet={"n_slots": 8})
    robots = rep["robots"]
    assert robots["robot00"]["admitted"]
    refused = rep["fleet"]["refused"]
    assert refused, {n: f["admission"] for n, f in robots.items()}
    first = min(refused)
    # the reason names the admitted robot whose (tightest) budget the batch would break
    victim = re.search(r"> robot '(robot\d\d)''s budget", refused[first])
    assert victim and robots[victim.group(1)]["admitted"], refused[first]
    adm = robots[first]["admission"]
    assert adm["chunk_ms"] > 0 and adm["batch"] >= 2
    log = rep["runtime"]["runtime"]["admission_log"]
    assert any(e["robot"] == first and not e["admitted"] for e in log)


def test_a_kill_drill_is_refused_when_its_robot_shares_a_group_with_robots_that_live(tmp_path):
    """A kill drill SIGKILLs the robot's group process, so every robot in it: refused before anything starts."""
    from rich.console import Console

    from edgeinfer.sim.fleet_replay import FleetReplayConfig, fleet_replay

    cfg = FleetReplayConfig(robots=2, kill_robot_at_s=[1.0, -1.0], duration_s=0.5, out=tmp_path / "fr",
                            data_dir=tmp_path / "none")  # the embedded synthetic log: no ../shared needed
    with pytest.raises(ValueError, match="kill_robot_at_s: robots .* share one group process"):
        fleet_replay(cfg, Console(quiet=True))
    assert not list(tmp_path.glob("fr/*.log"))  # no process was started


@pytest.mark.parametrize("field, values", [("kill_robot_at_s", [float("inf")]), ("kill_robot_at_s", [float("nan")]),
                                           ("join_at_s", [float("nan")])])
def test_drill_times_must_be_finite(field, values):
    from edgeinfer.sim.fleet_replay import FleetReplayConfig

    with pytest.raises(ValueError, match=f"FleetReplayConfig.{field} must be finite"):
        FleetReplayConfig(robots=1, **{field: values})
