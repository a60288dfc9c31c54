"""Adversarial observations (sim/network_faults.py, NetworkFaultConfig.adversarial_rate): hostile but valid observations
in place of some of a real log's, seeded by row; and a replay of the Schunk log with them, through the real
runtime and control loop, that never commands the arm outside its limits and counts every one."""
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from edgeinfer.core import wire
from edgeinfer.sim.network_faults import ADVERSARIAL, FaultInjector, NetworkFaultConfig, adversarial_observation
from edgeinfer.sim.replay import replay
from edgeinfer.sim.run_config import ReplayConfig

SCHUNK_LOG = Path(__file__).resolve().parents[2] / "shared" / "data" / "schunk_lwa4p" / "measurement_1"

BOX = 2.967  # the Schunk LWA 4P's position limit, rad (control/limits.py defaults)
HOUR_NS = 3_600_000_000_000


class Capture:
    """A socket that keeps what it is sent."""

    def __init__(self):
        self.sent = []

    def send_multipart(self, frames, flags=0, copy=True):
        self.sent.append([bytes(f) for f in frames])


def _obs(i: int) -> wire.Observation:
    q = np.full(6, 0.01 * i)
    return wire.Observation(i, 10**12 + 4_000_000 * i, q, np.zeros(6), q)


@pytest.mark.parametrize("u", [0.0, 0.3, 0.7, 0.999])
@pytest.mark.parametrize("kind", ADVERSARIAL)
def test_each_adversarial_kind_is_valid_on_the_wire_and_hostile(kind, u):
    obs = _obs(3)
    hostile = wire.decode(wire.encode(adversarial_observation(obs, kind, u)))  # valid: decode accepts it
    q, qd, d = hostile.q_rad, hostile.qd_rad_s, len(hostile.q_rad)
    hostile_by_kind = {
        "outside_box": d == 6 and np.all(np.abs(q) >= 5.0) and np.all(np.abs(hostile.q_prev_rad) >= 5.0),
        "huge_position": np.all(np.abs(q) == 1e6), "overflow_f32": np.all(np.abs(q) > np.finfo(np.float32).max),
        "wrong_joints": d in (1, 3, 7), "huge_velocity": np.all(np.abs(qd) == 1e6),
        "t_past": hostile.t_ns <= obs.t_ns - HOUR_NS, "t_future": hostile.t_ns >= obs.t_ns + HOUR_NS,
        "seq_huge": hostile.seq > 2**63 - 1002}
    assert hostile_by_kind[kind]
    unchanged = {"seq": hostile.seq == obs.seq, "t": hostile.t_ns == obs.t_ns}  # one thing hostile at a time
    assert unchanged["seq"] == (kind != "seq_huge") and unchanged["t"] == (kind not in ("t_past", "t_future"))


def test_adversarial_rows_follow_the_seed_and_leave_the_other_faults_in_place():
    def run(**kw):
        inj, sock = FaultInjector(NetworkFaultConfig(drop_rate=0.1, reorder_rate=0.05, fault_seed=4, **kw)), Capture()
        for i in range(2000):
            inj.submit(i, wire.encode(_obs(i)), 0, sock)
        inj.flush(sock)
        return inj, sock.sent

    plain, _ = run()
    inj, sent = run(adversarial_rate=0.2)
    again, sent_again = run(adversarial_rate=0.2)
    assert inj.rows["dropped"] == plain.rows["dropped"] and inj.rows["reordered"] == plain.rows["reordered"]
    assert inj.rows == again.rows and sent == sent_again  # a function of the seed and the row
    n = inj.counts["adversarial"]
    assert 300 < n < 500 and sum(inj.adversarial_kinds.values()) == n and set(inj.adversarial_kinds) == set(ADVERSARIAL)
    assert not set(inj.rows["adversarial"]) & set(inj.rows["dropped"])  # a lost observation is not replaced
    decoded = [wire.decode(f) for f in sent]  # every message sent is valid on the wire
    assert len(decoded) == 2000 - len(inj.rows["dropped"])
    assert sum(len(m.q_rad) != 6 for m in decoded) == inj.adversarial_kinds["wrong_joints"]
    assert sum(m.seq > 2**62 for m in decoded) == inj.adversarial_kinds["seq_huge"]


@pytest.mark.slow
def test_replay_with_adversarial_observations_stays_inside_the_limits_and_counts_them(tmp_path):
    # the real Schunk measurement_1 (3.7 s) where ../shared/data has it, else the embedded log; the real policy
    cfg = ReplayConfig(log=SCHUNK_LOG if SCHUNK_LOG.is_dir() else None, duration_s=4.0, out=tmp_path / "out",
                       plots=False, fork_nodes=True, faults=NetworkFaultConfig(adversarial_rate=0.08, fault_seed=3))
    report = replay(cfg, Console(quiet=True))
    assert report["safety"]["commands_checked"] == report["commands_received"] + report["start_up"]["commands_received"]
    assert report["safety"] == {**report["safety"], "nonfinite": 0, "outside_position_limits": 0,
                                "over_velocity_limit": 0}
    assert report["process_exit_codes"] == {"runtime": 0, "control": 0}
    kinds = report["replayer"]["faults"]["adversarial_kinds"]
    assert set(kinds) == set(ADVERSARIAL)  # this seed sends every kind
    assert sum(kinds.values()) == report["injected"]["network"]["counts"]["adversarial"]
    # counted by the nodes: a wrong joint count is refused where it enters (malformed "joints"), every other one is
    # an observation; together, every observation the replayer sent (the pre-roll's too)
    sent = report["replayer"]["rows_sent"] + report["start_up"]["observations_sent"]
    for node in ("runtime", "control"):
        counters = report["node_stats"][node]["counters"]
        assert counters.get("malformed.joints", 0) == kinds["wrong_joints"], node
        took = counters["observations"] + counters["malformed.joints"]
        # the control loop ends on its schedule: the last row, sent late by a stalled replayer, can go uncounted
        assert sent - (node == "control") <= took <= sent, node
    # an hour, or int64, away: refused by the runtime as implausible, never served (unless a newer one superseded it)
    runtime = report["node_stats"]["runtime"]["counters"]
    assert 0 < runtime["obs_implausible"] <= kinds["t_past"] + kinds["t_future"]
    # the miss rate stays that of a clean run on this machine: no more than a 100 ms host stall's worth of ticks
    assert report["deadline_misses"] <= 25
