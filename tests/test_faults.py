"""Network fault injection: seeded fates, counts that match what a real SUB socket receives over loopback,
malformed frames that the real Receiver counts, and the config through the CLI and a TOML launch file."""
from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from edgeinfer.core import transport
from edgeinfer.core.config import add_options, build, load_launch
from edgeinfer.core.wire import Observation, encode
from edgeinfer.sim.network_faults import FaultInjector, NetworkFaultConfig, parse_delay
from edgeinfer.sim.run_config import ReplayConfig


def _obs(i: int) -> list:
    q = np.full(6, float(i))
    return encode(Observation(i, 1_000_000 * i, q, q, q))


@pytest.fixture
def pubsub():
    ctx = zmq.Context()
    pub = transport.pub(ctx, "tcp://127.0.0.1:*", bind=True, hwm=100_000)
    sub = transport.sub(ctx, pub.getsockopt_string(zmq.LAST_ENDPOINT), hwm=100_000)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # slow joiner: wait until a probe gets through
        pub.send_multipart(encode(Observation(0, 0, np.zeros(6), np.zeros(6), np.zeros(6))))
        if sub.poll(50):
            while sub.poll(10):
                sub.recv_multipart()
            break
    yield pub, transport.Receiver(sub)
    ctx.destroy(linger=0)


def _run(cfg: NetworkFaultConfig, pub, n: int, step_ns: int = 200_000) -> FaultInjector:
    inj = FaultInjector(cfg)
    t = time.monotonic_ns()
    for i in range(n):
        inj.submit(i, _obs(i), t + i * step_ns, pub)
        inj.release(t + i * step_ns, pub)
    inj.flush(pub)
    return inj


def _receive(rx: transport.Receiver, expect: int) -> list[int]:
    seqs = []
    deadline = time.monotonic() + 10
    while len(seqs) + rx.malformed < expect and time.monotonic() < deadline:
        msg = rx.recv(100)
        if msg is not None:
            seqs.append(msg.seq)
    time.sleep(0.05)
    seqs += [m.seq for m in rx.drain()]
    return seqs


def test_counts_match_what_a_subscriber_receives(pubsub):
    pub, rx = pubsub
    cfg = NetworkFaultConfig(drop_rate=0.05, burst_rate=0.01, burst_len=4, duplicate_rate=0.05,
                             malformed_rate=0.03, reorder_rate=0.05, fault_seed=11)
    n = 3000
    inj = _run(cfg, pub, n)
    c = inj.counts
    assert all(c[k] > 0 for k in ("dropped", "burst_dropped", "duplicated", "malformed", "reordered"))
    runs = np.split(np.array(inj.rows["burst_dropped"]), np.flatnonzero(np.diff(inj.rows["burst_dropped"]) != 1) + 1)
    assert all(len(r) % 4 == 0 for r in runs if r[-1] < n - 1)  # bursts of burst_len observations in a row
    lost = c["dropped"] + c["burst_dropped"] + c["malformed"]
    seqs = _receive(rx, n - lost + c["duplicated"] + c["malformed"])
    assert len(seqs) == n - lost + c["duplicated"]
    assert rx.malformed == c["malformed"]  # every garbage message was counted by the real Receiver, none decoded
    assert sum(inj.malformed_kinds.values()) == c["malformed"] and len(inj.malformed_kinds) == 3
    assert set(seqs) == set(range(n)) - set(inj.rows["dropped"]) - set(inj.rows["burst_dropped"]) \
        - set(inj.rows["malformed"])
    values, counts = np.unique(seqs, return_counts=True)
    assert set(values[counts == 2]) == set(inj.rows["duplicated"])  # duplicates arrive twice


def test_reordered_rows_arrive_after_their_successor(pubsub):
    pub, rx = pubsub
    inj = _run(NetworkFaultConfig(reorder_rate=0.1, fault_seed=2), pub, 1000)
    seqs = _receive(rx, 1000)
    assert sorted(seqs) == list(range(1000))
    swapped = [a for a, b in zip(seqs, seqs[1:]) if b == a - 1]
    assert swapped == [r + 1 for r in inj.rows["reordered"]] and inj.counts["reordered"] > 50


def test_seeded_and_independent_of_other_kinds():
    def fates(cfg, n=2000):
        inj = FaultInjector(cfg)
        return [inj.decide(i) for i in range(n)]

    a = fates(NetworkFaultConfig(drop_rate=0.1, fault_seed=3))
    assert a == fates(NetworkFaultConfig(drop_rate=0.1, fault_seed=3))
    assert a != fates(NetworkFaultConfig(drop_rate=0.1, fault_seed=4))
    # switching duplicates on does not move the drops
    b = fates(NetworkFaultConfig(drop_rate=0.1, duplicate_rate=0.2, fault_seed=3))
    assert [f[0] for f in a] == [f[0] for f in b]
    assert 150 < sum(f[0] == "dropped" for f in a) < 250  # Binomial(2000, 0.1): mean 200, sd 13


def test_delays_follow_the_distribution_and_keep_their_order(pubsub):
    pub, rx = pubsub
    inj = FaultInjector(NetworkFaultConfig(delay_ms="fixed:3", delay_rate=0.2, fault_seed=5))
    t0 = time.monotonic_ns()
    for i in range(200):  # 1 ms apart in fake time; a delayed one is due 3 ms (3 rows) later
        inj.release(t0 + i * 1_000_000, pub)
        inj.submit(i, _obs(i), t0 + i * 1_000_000, pub)
    inj.flush(pub)
    seqs = _receive(rx, 200)
    assert sorted(seqs) == list(range(200))
    delayed = set(inj.rows["delayed"])
    assert inj.counts["delayed"] == len(delayed) > 10
    for row in delayed:  # sent 3 ms late: after rows row+1, row+2 (those not delayed themselves), before row+3
        later = {s for s in seqs[: seqs.index(row)] if s > row}
        assert later == {r for r in (row + 1, row + 2) if r not in delayed and r < 200}
    exp = FaultInjector(NetworkFaultConfig(delay_ms="exp:2", fault_seed=1))
    mean_ms = np.mean([exp._delay_ns() for _ in range(20_000)]) / 1e6
    assert mean_ms == pytest.approx(2.0, rel=0.05)


def test_config_validation():
    assert parse_delay("uniform:1:3") == ("uniform", (1.0, 3.0))
    for bad in ("exp", "exp:-1", "gauss:1", "uniform:3:1", "fixed:x"):
        with pytest.raises(ValueError, match="delay_ms"):
            NetworkFaultConfig(delay_ms=bad)
    with pytest.raises(ValueError, match="drop_rate"):
        NetworkFaultConfig(drop_rate=1.5)
    with pytest.raises(ValueError, match="burst_len"):
        NetworkFaultConfig(burst_len=0)
    assert not NetworkFaultConfig().active and NetworkFaultConfig(reorder_rate=0.1).active


def test_cli_and_launch_file_fill_the_fault_config(tmp_path):
    import argparse

    parser = argparse.ArgumentParser()
    add_options(parser, ReplayConfig)
    args = parser.parse_args(["--drop-rate", "0.01", "--delay-ms", "exp:2", "--fault-seed", "9",
                              "--time-scale", "2", "--catch-up", "true"])
    cfg = build(ReplayConfig, args)
    assert cfg.faults == NetworkFaultConfig(drop_rate=0.01, delay_ms="exp:2", fault_seed=9)
    assert cfg.time_scale == 2.0 and cfg.catch_up
    launch = tmp_path / "run.toml"
    launch.write_text('[replay]\nlog_format = "mcap"\ntopic = "/joint_states"\n'
                      '[replay.faults]\nduplicate_rate = 0.02\nreorder_rate = 0.01\nburst_rate = 0.001\n'
                      'burst_len = 10\nfault_seed = 4\n')
    cfg = build(ReplayConfig, parser.parse_args(["--fault-seed", "5"]), load_launch(launch, "replay"), tmp_path)
    assert cfg.faults == NetworkFaultConfig(duplicate_rate=0.02, reorder_rate=0.01, burst_rate=0.001, burst_len=10,
                                            fault_seed=5)  # the command line overrides the launch file
    assert cfg.log_format == "mcap" and cfg.topic == "/joint_states"
    with pytest.raises(ValueError, match="time_scale"):
        ReplayConfig(time_scale=50)


def test_shipped_fault_launch_file():
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "launch" / "faults.toml"
    cfg = build(ReplayConfig, argparse_namespace(), load_launch(path, "replay"), path.parent)
    assert cfg.faults.active and cfg.faults.fault_seed == 1 and cfg.faults.delay_ms == "exp:2"


def argparse_namespace():
    import argparse

    return argparse.Namespace()


def test_a_runtime_stall_needs_its_row_and_defaults_to_20_ms():
    assert ReplayConfig(stall_runtime_at_tick=5).stall_runtime_ms == 20.0
    assert ReplayConfig(stall_runtime_at_tick=5, stall_runtime_ms=3.0).stall_runtime_ms == 3.0
    assert ReplayConfig().stall_runtime_ms is None
    with pytest.raises(ValueError, match="stall_runtime_ms needs stall_runtime_at_tick"):
        ReplayConfig(stall_runtime_ms=20.0)  # a stall that would never happen is refused, not ignored


def test_a_run_stopped_before_its_first_command_has_a_safety_report():
    from edgeinfer.sim.received import Commands
    from edgeinfer.sim.supervisor import safety_report

    assert safety_report(Commands(0, 6), [-1.0] * 6, [1.0] * 6, 2.0, 4_000_000) == {
        "commands_checked": 0, "nonfinite": 0, "outside_position_limits": 0, "over_velocity_limit": 0}


def test_a_slowed_engine_adds_its_delay_to_every_pass_and_to_each_pass_of_a_greedy_run():
    """--fault-pass-delay-ms makes every target pass that much LONGER (not: at least that long), so a slowdown of s
    is a delay of (s - 1) x the pass's cost; a run of m passes in one call (Engine.greedy_run) gets m delays."""
    from edgeinfer.node.faults import SlowEngine

    class Busy:  # every pass busy for 3 ms
        def forward(self, obs, tokens, start):
            t = time.perf_counter_ns()
            while time.perf_counter_ns() - t < 3_000_000:
                pass
            return np.zeros((1, 4), np.float32)

        def greedy_run(self, committed, m):
            return [self.forward(None, (), 0) is not None and 1 for _ in range(m)]

    class Plain:
        def forward(self, obs, tokens, start):
            return np.zeros((1, 4), np.float32)

    slow = SlowEngine(Busy(), 2_000_000)
    t = time.perf_counter_ns()
    slow.forward(None, (1,), 1)
    assert time.perf_counter_ns() - t >= 5_000_000  # 3 ms of work + 2 ms (the old max(3, 2) was 3 ms)
    t = time.perf_counter_ns()
    assert slow.greedy_run([0], 2) == [1, 1]
    assert time.perf_counter_ns() - t >= 10_000_000  # 2 x (3 + 2) ms
    assert not hasattr(SlowEngine(Plain(), 1), "greedy_run")  # an engine without runs keeps none
