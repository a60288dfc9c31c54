"""The fleet runtime node (edgeinfer/node/fleet_node.py): its robot table's rules on given times, and a real node
process serving DEALER robots over a real socket (joins, admission, chunks to their robot only, malformed frames, a
robot lost after its lease while another is served, a restart, refusal when the slots are full)."""
from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq

from edgeinfer.core.wire import ActionChunk, Admission, Hello, Join, Observation, Stop, decode, encode
from edgeinfer.node.fleet_config import FleetConfig
from edgeinfer.node.fleet_robots import RobotTable, admit_while_free

MS = 1_000_000


def _join(name: str, joints: int = 6, budget_ns: int = 20 * MS) -> Join:
    return Join(name, joints, 4 * MS, 5, budget_ns, budget_ns)


# --- the robot table, on given times ---------------------------------------------------------------------------

def test_table_takes_the_lowest_free_slot_and_refuses_when_full():
    table = RobotTable(n_slots=2, n_joints=6)
    a, _ = table.join(_join("a"), b"a", 0, admit_while_free)
    b, _ = table.join(_join("b"), b"b", 0, admit_while_free)
    c, _ = table.join(_join("c"), b"c", 0, admit_while_free)
    assert (a.slot, b.slot, c.slot) == (0, 1, None)
    assert c.admission.admitted == 0 and "no free slot" in c.admission.reason
    assert [e["admitted"] for e in table.log] == [True, True, False]
    table.leave(a)  # a Stop frees its slot at once, for the next Join
    assert a.slot is None and a.counts["stopped"] == 1
    c, restart = table.join(_join("c"), b"c", 1, admit_while_free)
    assert c.slot == 0 and c.admission.admitted == 1 and not restart  # refused before: not a restart


@pytest.mark.parametrize("join, sender, why", [
    (_join("a"), b"b", "not the sender's routing id"),
    (_join("a", joints=7), b"a", "the policy has 6 joints"),
    (_join("a", budget_ns=0), b"a", "Join.budget_ns must be in (0, "),
    (dataclasses.replace(_join("a"), period_ns=2**62), b"a", "Join.period_ns must be in (0, 10000000000]"),
    (dataclasses.replace(_join("a"), replan_every_ticks=10**9), b"a", "Join.replan_every_ticks must be in (0, 1000]"),
    (dataclasses.replace(_join("a"), max_budget_ns=2**63 - 1), b"a", "Join.max_budget_ns must be <= "),
])
def test_table_refuses_a_join_it_cannot_serve(join, sender, why):
    table = RobotTable(n_slots=2, n_joints=6)
    robot, _ = table.join(join, sender, 0, admit_while_free)
    assert robot.admission.admitted == 0 and why in robot.admission.reason
    assert table.free == [0, 1]
    assert ("a" in table.robots) == (sender == b"a")  # a Join under another's name never takes that entry


def test_table_keeps_a_bounded_log_and_forgets_refused_strangers_past_its_size(monkeypatch):
    """A peer sending Joins in a loop cannot grow the runtime: the log keeps its first and newest LOG_KEEP decisions
    and counts the rest; refused newcomers are kept only while the table is small; a routing id that only decodes
    like a robot's name is not that robot."""
    from edgeinfer.node import fleet_robots

    monkeypatch.setattr(fleet_robots, "LOG_KEEP", 10)
    monkeypatch.setattr(fleet_robots, "ROBOTS_KEEP", 5)
    table = RobotTable(n_slots=1, n_joints=6)
    table.log_tail = fleet_robots.deque(maxlen=10)
    odd, _ = table.join(_join("r\ufffd"), "r\ufffd".encode(), 0, admit_while_free)
    for i in range(40):
        table.join(_join(f"x{i}", joints=7), f"x{i}".encode(), i, admit_while_free)
    assert len(table.log) == 10 and len(table.log_tail) == 10 and table.log_dropped == 21
    assert table.log_tail[-1]["robot"] == "x39" and len(table.robots) == 5 and odd.active
    assert table.heard("r\ufffd".encode(), 1) is odd and table.heard(b"r\xff", 2) is None


def test_table_rejoin_is_a_restart_on_the_same_slot():
    table = RobotTable(n_slots=3, n_joints=6)
    table.join(_join("x"), b"x", 0, admit_while_free)
    a, first = table.join(_join("a"), b"a", 0, admit_while_free)
    again, restart = table.join(_join("a"), b"a", 5, admit_while_free)
    assert again is a and (first, restart) == (False, True)
    assert a.slot == 1 and a.counts["rejoined"] == 1 and table.free == [2]


def test_table_lease_drops_a_silent_robot_only():
    table = RobotTable(n_slots=2, n_joints=6)
    a, _ = table.join(_join("a"), b"a", 0, admit_while_free)
    b, _ = table.join(_join("b"), b"b", 0, admit_while_free)
    assert table.heard(b"b", 400 * MS) is b and table.heard(b"nobody", 400 * MS) is None
    assert table.next_expiry_ns(500 * MS) == 500 * MS  # a's
    assert table.expire(499 * MS, 500 * MS) == []
    assert table.expire(501 * MS, 500 * MS) == [a]
    assert a.slot is None and a.counts["lost"] == 1 and b.slot == 1 and table.free == [0]


def test_config_refuses_a_non_loopback_endpoint_and_an_unknown_drafter():
    with pytest.raises(ValueError, match="FleetConfig.endpoint must be loopback"):
        FleetConfig(endpoint="tcp://10.0.0.1:5590")
    with pytest.raises(ValueError, match="FleetConfig.drafter"):
        FleetConfig(drafter="psychic")


# --- the batched decoder's accounting, on a fake batch-invariant engine ----------------------------------------

class FakeBatched:
    """A BatchedEngine whose greedy token at every position is TOKEN (rows of one-hot logits); it refuses two passes
    of one slot in a call, as every real one does."""

    backend, precision, device, cfg, n_slots = "fake", "fp32", "cpu", None, 4
    TOKEN = 3

    def __init__(self, n_bins: int):
        self.n_bins, self.calls = n_bins, []

    def forward_batch(self, passes):
        slots = [p.slot for p in passes]
        assert len(slots) == len(set(slots)), f"two passes of one slot in one call: {slots}"
        self.calls.append(len(passes))
        out = []
        for p in passes:
            logits = np.zeros((len(p.tokens) + (p.start == 0), self.n_bins), np.float32)
            logits[:, self.TOKEN] = 1.0
            out.append(logits)
        return out


def _batched_decoder(**scheduling):
    from edgeinfer.core.fleet_batching import FleetPolicy
    from edgeinfer.engines.models.drafters import make_drafter
    from edgeinfer.engines.models.paths import DEFAULT_POLICY
    from edgeinfer.engines.models.served import load_served_policy
    from edgeinfer.node.fleet_decode import BatchedDecoder

    policy = load_served_policy(DEFAULT_POLICY)
    cfg = FleetConfig(scheduling=FleetPolicy(**scheduling))
    decoder = BatchedDecoder(cfg, policy, FakeBatched(policy.cfg.n_bins))
    table = RobotTable(n_slots=4, n_joints=policy.cfg.n_joints)
    robots = {}
    for name in ("a", "b"):
        robot, _ = table.join(_join(name), name.encode(), 0, admit_while_free)
        robot.drafter, robot.step_ns = make_drafter("kinematic", policy), 20 * MS
        robots[name] = robot
    return decoder, robots, policy.warmup_state()


def test_batched_decoder_counts_each_robots_passes_by_batch_and_k():
    from edgeinfer.node.fleet_decode import Work

    decoder, robots, state = _batched_decoder(adaptive_k=False, k=2, deadline_cut=False)
    for i, robot in enumerate(robots.values()):
        assert decoder.submit(Work(robot, _obs(i, state), 10**18, i)) is None
    done = []
    while decoder.busy():
        done += decoder.step()
    assert sorted(d.work.robot.name for d in done) == ["a", "b"]
    n_tokens = 48
    for d in done:
        robot, chunk = d.work.robot, d.chunk
        assert (chunk.rung, chunk.tokens, d.cut) == ("full", n_tokens, False)
        assert chunk.steps_rad.shape == (1 + n_tokens // 6, 6)
        assert robot.batch_hist == {2: chunk.target_passes}  # every pass shared with the other robot
        assert sum(robot.k_hist.values()) == chunk.target_passes - 1 and set(robot.k_hist) <= {"k1-2"}
    assert decoder.engine.calls[0] == 2 and decoder.costs()["passes_by_batch"] == {"2": len(decoder.engine.calls)}


def test_batched_decoder_decodes_a_robots_newer_observation_after_its_chunk_in_flight():
    """A robot's new observation while its chunk is in flight: the newest waits (a newer one supersedes it) and is
    decoded once the running one ends, never in the same pass on the same slot."""
    from edgeinfer.node.fleet_decode import Work

    decoder, robots, state = _batched_decoder(adaptive_k=False, k=0, deadline_cut=False)
    a = robots["a"]
    decoder.submit(Work(a, _obs(0, state), 10**18, 0))
    decoder.step()  # obs 0's prefill: in flight
    assert decoder.submit(Work(a, _obs(5, state), 10**18, 1)) is None
    assert decoder.submit(Work(a, _obs(10, state), 10**18, 2)).obs.seq == 5  # superseded, not started
    done = []
    while decoder.busy():
        done += decoder.step()
    assert [d.chunk.obs_seq for d in done] == [0, 10] and all(d.chunk.rung == "full" for d in done)


# --- a real node process and DEALER robots ---------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Robots:
    """DEALER robots of the test: identity = name; every message received kept per robot."""

    def __init__(self, endpoint: str):
        self.ctx, self.endpoint = zmq.Context(), endpoint
        self.socks: dict[str, zmq.Socket] = {}
        self.got: dict[str, list] = {}

    def connect(self, name: str) -> zmq.Socket:
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.IDENTITY, name.encode())
        s.setsockopt(zmq.LINGER, 0)
        s.connect(self.endpoint)
        self.socks[name], self.got[name] = s, []
        return s

    def send(self, name: str, msg) -> None:
        self.socks[name].send_multipart(encode(msg))

    def drain(self, wait_s: float = 0.0) -> None:
        """Read what arrived, waiting up to wait_s for anything."""
        poller = zmq.Poller()
        for s in self.socks.values():
            poller.register(s, zmq.POLLIN)
        deadline = time.monotonic() + wait_s
        while events := dict(poller.poll(max(0, int((deadline - time.monotonic()) * 1000)))):
            for name, s in self.socks.items():
                if s in events:
                    self.got[name].append(decode(s.recv_multipart()))
            deadline = time.monotonic()  # after the first: only what is there already

    def wait_for(self, name: str, kind: type, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if found := [m for m in self.got[name] if isinstance(m, kind)]:
                self.got[name].remove(found[0])
                return found[0]
            self.drain(0.05)
        raise AssertionError(f"{name}: no {kind.__name__} within {timeout_s} s; got {self.got[name]}")

    def chunks(self, name: str) -> list[ActionChunk]:
        return [m for m in self.got[name] if isinstance(m, ActionChunk)]

    def close(self) -> None:
        self.ctx.destroy(linger=0)


def _obs(seq: int, state, t_ns: int | None = None) -> Observation:
    q, qd, q_prev = state
    return Observation(seq, time.perf_counter_ns() if t_ns is None else t_ns, q, qd, q_prev)


@pytest.mark.parametrize("batching", [False, True])
def test_node_serves_each_robot_its_own_chunks_through_faults(tmp_path, batching):
    """Two slots, three robots: a and b admitted, c refused (full); a's and b's chunks each go to their own robot
    (their observation seqs are disjoint); garbage from b and an observation from the refused c are counted, not
    fatal; b falls silent, is dropped after its lease while a keeps getting chunks, and c is admitted in its
    slot; a restarts (Join again) and is served on; c leaves (Stop); the controller's Stop ends the run with a
    report."""
    from edgeinfer.engines.models.paths import DEFAULT_POLICY
    from edgeinfer.engines.models.served import load_served_policy

    state = load_served_policy(DEFAULT_POLICY).warmup_state()
    endpoint, report = f"tcp://127.0.0.1:{_free_port()}", tmp_path / "fleet.json"
    backend = "fused" if batching else "torch"  # batched: the fused engine; one at a time: the fastest to load
    node = subprocess.Popen([sys.executable, "-m", "edgeinfer", "fleet", "--endpoint", endpoint, "--n-slots", "2",
                             "--backend", backend, "--warmup", "false", "--robot-lease-ms", "200", "--idle-timeout-s",
                             "20", "--batching", str(batching).lower(), "--admission", "false",  # by slot only:
                             "--report", str(report)],  # no warm-up, so no pass costs to admit on
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    robots = Robots(endpoint)
    budget = 1000 * MS  # generous: a stalled host must not turn these observations stale
    try:
        for name in ("a", "b"):
            robots.connect(name)
            robots.send(name, _join(name, budget_ns=budget))
            assert robots.wait_for(name, Admission, 60).admitted == 1
        robots.connect("c")
        robots.send("c", _join("c", budget_ns=budget))
        refusal = robots.wait_for("c", Admission, 10)
        assert refusal.admitted == 0 and "no free slot" in refusal.reason

        def serve(names: list[str], rounds: int, seq0: int) -> None:
            """An observation of each robot every 30 ms (at least) for `rounds`, reading what arrives."""
            for i in range(rounds):
                for name in names:
                    robots.send(name, _obs(seq0 + 1000 * ord(name) + 5 * i, state))
                time.sleep(0.03)
                robots.drain()

        serve(["a", "b"], 5, 0)
        robots.socks["b"].send_multipart([b"\xc1 not msgpack"])  # garbage from an admitted robot
        robots.send("c", _obs(0, state))  # from the refused robot
        robots.send("a", _obs(1, state, t_ns=time.perf_counter_ns() - 3 * budget))  # stale on arrival
        serve(["a", "b"], 5, 100)
        robots.wait_for("b", ActionChunk, 10)  # b still served after its garbage
        robots.send("b", Hello("b", 9, 0))  # b's last message: its lease runs from the node's reply at the latest
        robots.wait_for("b", Hello, 10)
        a_before = len(robots.chunks("a"))
        serve(["a"], 12, 200)  # b silent for > its lease (200 ms) while a is served
        robots.send("c", _join("c", budget_ns=budget))
        robots.send("a", _join("a", budget_ns=budget))  # a restarts (its Join renews its lease too)
        assert robots.wait_for("c", Admission, 10).admitted == 1  # b's slot, freed by its lease
        assert robots.wait_for("a", Admission, 10).admitted == 1
        assert len(robots.chunks("a")) > a_before
        serve(["a", "c"], 5, 300)
        robots.wait_for("c", ActionChunk, 10)
        robots.send("c", Stop("c is done"))  # it leaves: its slot is freed
        robots.connect("controller")
        robots.send("controller", Stop("test over"))
        assert node.wait(30) == 0, node.stdout.read()
        robots.drain(0.2)
    finally:
        robots.close()
        if node.poll() is None:
            node.kill()
            node.wait()
    out = json.loads(report.read_text())
    for name in ("a", "b", "c"):  # chunks only to their robot: each robot's own observation seqs
        chunks = robots.chunks(name)
        assert {c.obs_seq // 1000 for c in chunks} <= {ord(name)}, name
    a = robots.chunks("a")
    assert [c.seq for c in a] == list(range(1, len(a) + 1))  # seq per robot, on through its restart
    assert any(isinstance(m, Stop) for m in robots.got["a"])  # the shutdown's Stop
    c, ra, rb, rc = out["counters"], out["robots"]["a"], out["robots"]["b"], out["robots"]["c"]
    assert c["malformed.garbage"] == 1 and rb["malformed"] == 1
    assert c["obs_unadmitted"] >= 1 and ra["obs_stale"] == 1
    assert c["robot_lost"] == 1 and rb["lost"] == 1 and ra["lost"] == 0
    assert c["robot_rejoined"] == 1 and ra["rejoined"] == 1
    assert c["refused"] == 1 and c["admitted"] == 4  # a, b, c, a again
    assert rc["admitted"] and rc["batch"] == 2 and ra["slot"] == 0  # c in b's slot, beside a on its own
    assert rb["slot"] is rc["slot"] is None and rc["stopped"] == 1 and c["robot_stopped"] == 1  # lost, left
    assert ra["chunks"] == len(a) and sum(ra["rungs"].values()) == len(a)
    log = [(e["robot"], e["admitted"], e["rejoin"]) for e in out["admission_log"]]
    assert log[:3] == [("a", True, False), ("b", True, False), ("c", False, False)]
    assert sorted(log[3:]) == [("a", True, True), ("c", True, False)]  # in either order (two DEALERs)
    assert out["exit_reason"] == "controller" and out["engine"]["batched"] is batching
    # every chunk took a pass at least; batch_hist also counts the passes of a chunk its restart dropped
    assert sum(ra["batch_hist"].values()) >= ra["target_passes"] >= len(a)
    assert ra["accepted"] <= ra["drafted"] and 0 < ra["ready_ms"]["p50"] <= ra["ready_ms"]["max"]
    assert (out["pass_costs"] is not None) is batching


def test_serve_fleet_answers_a_hello_probe_and_exits_when_idle(tmp_path):
    """serve_fleet in this process (a thread: no signal handlers): a Hello is answered once the node serves (a ready
    probe); with no robot and no message for idle_timeout_s it returns on its own, its report saying why."""
    import threading

    from edgeinfer.core.fleet_batching import FleetPolicy
    from edgeinfer.node.fleet_node import serve_fleet

    cfg = FleetConfig(endpoint=f"tcp://127.0.0.1:{_free_port()}", backend="torch", warmup=False, idle_timeout_s=0.3,
                      report=tmp_path / "fleet.json", scheduling=FleetPolicy(batching=False))
    result = {}
    node = threading.Thread(target=lambda: result.update(serve_fleet(cfg)))
    node.start()
    robots = Robots(cfg.endpoint)
    try:
        robots.connect("probe")
        robots.send("probe", Hello("probe", 7, 0))
        reply = robots.wait_for("probe", Hello, 60)
        assert (reply.sender, reply.seq) == ("fleet", 7)
    finally:
        robots.close()
        node.join(30)
    assert not node.is_alive()
    assert json.loads(cfg.report.read_text()) == result
    assert result["exit_reason"] == "idle" and result["robots"] == {} and result["counters"] == {"hellos": 1}
    assert result["engine"]["backend"] == "torch" and result["duration_s"] >= 0.3


def test_a_join_read_after_a_stall_takes_the_slot_of_a_robot_silent_past_its_lease(tmp_path):
    """The node loop stalls (not stepped) while robot a falls silent past its lease and c asks to join: in the next
    iteration a's lease is checked before c's Join is answered, so c gets the only slot. A robot whose message was
    queued during the stall keeps its lease (every queued message is read first). Before that, a Join whose budget
    the one-at-a-time planner cannot plan (below its margin) is refused with the reason, not admitted to crash it."""
    from edgeinfer.core.fleet_batching import FleetPolicy
    from edgeinfer.node.fleet_node import FleetNode

    cfg = FleetConfig(endpoint=f"tcp://127.0.0.1:{_free_port()}", backend="torch", warmup=False, n_slots=2,
                      robot_lease_ms=200, scheduling=FleetPolicy(batching=False))
    robots = Robots(cfg.endpoint)
    with FleetNode(cfg) as node:
        try:
            for names in (["tight"], ["a", "b"]):
                for name in names:
                    robots.connect(name)
                    robots.send(name, _join(name, budget_ns=MS // 10 if name == "tight" else 20 * MS))
                for _ in range(100):
                    node.step()
                    robots.drain(0.01)
                    if all(any(isinstance(m, Admission) for m in robots.got[n]) for n in names):
                        break
            tight = robots.wait_for("tight", Admission, 0.1)  # a budget below the margin cannot be planned
            assert tight.admitted == 0 and "margin_ms" in tight.reason, tight.reason
            slot_a = node.table.robots["a"].slot
            time.sleep(0.3)  # the stall: a and b silent past their lease (200 ms), then b speaks, c joins
            robots.send("b", Hello("b", 1, 0))
            robots.connect("c")
            robots.send("c", _join("c"))
            time.sleep(0.3)  # both queued at the node before its next iteration (a loaded host delivers late)
            for _ in range(20):
                node.step()
                robots.drain(0.05)
                if any(isinstance(m, Admission) for m in robots.got["c"]):
                    break
            told = len([m for m in robots.got["a"] if isinstance(m, Admission)])
            robots.send("a", _obs(3, (np.zeros(6), np.zeros(6), np.zeros(6))))  # lost, and it does not know
            for _ in range(20):
                node.step()
                robots.drain(0.05)
                if len([m for m in robots.got["a"] if isinstance(m, Admission)]) > told:
                    break
        finally:
            robots.close()
    lapsed = [m for m in robots.got["a"] if isinstance(m, Admission)][told:]
    assert [m.admitted for m in lapsed] == [0] and "lease lapsed" in lapsed[0].reason  # told to Join again
    assert [m.admitted for m in robots.got["c"] if isinstance(m, Admission)] == [1]
    table = node.table.robots
    assert table["a"].counts["lost"] == 1 and table["b"].active and table["c"].slot == slot_a
