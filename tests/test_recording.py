"""The replayer's recording keeps what it received in preallocated columns (sim/received.py), not as messages:
the report's figures from a fixed message sequence, worked out by hand, and memory that stays flat however many
messages arrive."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from edgeinfer.core.wire import ActionChunk, JointCommand
from edgeinfer.logs.arm_log import ArmLog
from edgeinfer.sim.hil import _obs_to_chunk_ns, _obs_to_command_ns
from edgeinfer.sim.metrics import summarize
from edgeinfer.sim.received import Chunks
from edgeinfer.sim.replay import Recording, _collect
from edgeinfer.sim.run_config import ReplayConfig
from edgeinfer.sim.supervisor import safety_report

P = 4_000_000  # 250 Hz
T0 = 1_000_000_000
MS = 1_000_000
STRIDE = 2  # ticks per chunk step


class Stub:
    """A receiver whose messages all come in `grabbed` (with their receipt times), as during the replayer's spin."""

    malformed = 0

    def drain(self, limit=None):
        return []

    def _decode(self, frames):
        return frames


def cmd(tick: int, chunk_obs: int, rung: str = "full", q=None) -> JointCommand:
    q = np.array([0.01 * tick, -0.01 * tick]) if q is None else np.asarray(q, dtype=float)
    return JointCommand(tick, tick, chunk_obs, T0 + tick * P + 500_000, q, rung)


def chunk(obs: int, steps, t_ready: int, rung: str, counts=(0, 0, 0, 0), seq: int = 0) -> ActionChunk:
    return ActionChunk(seq, obs, T0 + obs * P, t_ready, STRIDE * P, np.asarray(steps, dtype=float), rung, *counts)


def run():
    """Ten rows on ticks 0..9 of a log at rest at q = 0 (2 joints), deadline one period; received:
    - chunks: observation 0 twice (an early first step at 3 ms, the whole chunk at 5 ms), observation 5 once
      (partial, 3 steps), and one planned from no tick of the run (at 1 ms: the first chunk received);
    - commands: tick 0 a hold; 1..4 from chunk 0, 1 ms after due; 5 from chunk 0, 5 ms after (late); 6..8 from
      chunk 5, 1 ms after; 9 lost; plus a duplicate for tick 3, and three rejected: tick 10 (out of the run),
      tick 8 before it was due, a command with 3 joints."""
    ticks = np.arange(10)
    rec = Recording.start(T0, P, ticks, 2, 4, STRIDE)
    rec.t_sent_ns[:] = rec.t_sched_ns + 10_000
    msgs = [(T0 + 1 * MS, chunk(99, [[0, 0]] * 4, T0, "full")),
            (T0 + 3 * MS, chunk(0, [[0, 0], [9, 9]], T0 + 2 * MS, "partial", (3, 1, 2, 1))),
            (T0 + 5 * MS, chunk(0, [[0, 0], [.1, .1], [.2, .2], [.3, .3]], T0 + 4 * MS, "full", (8, 2, 6, 5), 1)),
            (T0 + 5 * P + 2 * MS, chunk(5, [[0, 0], [.4, .4], [.5, .5]], T0 + 5 * P + MS, "partial", (4, 3, 2, 1), 2)),
            (T0 + 1 * MS, cmd(0, -1, "hold", [0, 0])),
            (T0 + 2 * P, cmd(10, 5)),  # tick 10: not in the run
            (T0 + 2 * P, cmd(8, 5)),  # tick 8, not yet due
            (T0 + 2 * P, cmd(2, 0, q=[0, 0, 0]))]  # 3 joints
    for n in range(1, 9):
        msgs.append((T0 + n * P + (5 if n == 5 else 1) * MS, cmd(n, 0 if n <= 5 else 5)))
    msgs.append((T0 + 3 * P + 2 * MS, cmd(3, 0, q=[1, 1])))  # a second command for tick 3: not used
    msgs.sort(key=lambda m: m[0])
    rx = Stub()
    for i in range(0, len(msgs), 3):
        _collect(rx, rx, rec, [(t, rx, m) for t, m in msgs[i:i + 3]])
    log = ArmLog("rest", ticks * P / 1e9, np.zeros((10, 2)), np.zeros((10, 2)), source="synthetic")
    return rec, log


def test_every_figure_from_a_fixed_message_sequence():
    rec, log = run()
    report, per_tick = summarize(rec, log, ReplayConfig(), P / 1e6, STRIDE)
    assert report["outcomes"] == {"on_time": 7, "late": 1, "lost": 1, "hold": 1}
    assert report["deadline_misses"] == 3 and report["miss_rate"] == pytest.approx(0.3)
    assert report["commands_received"] == 9
    assert per_tick["outcome"].tolist() == ["hold", *["on_time"] * 4, "late", *["on_time"] * 3, "lost"]
    assert per_tick["rung"].tolist() == ["hold", *["full"] * 8, ""]
    np.testing.assert_allclose(per_tick["latency_ms"][:9], [1, 1, 1, 1, 1, 5, 1, 1, 1])
    assert np.isnan(per_tick["latency_ms"][9])
    assert report["fallbacks"] == {"full": 8, "coarse": 0, "partial": 0, "draft": 0, "continue": 0, "hold": 1}
    harness = report["harness"]
    assert (harness["duplicate_commands"], harness["rejected_commands"], harness["rejected_chunks"]) == (1, 3, 0)
    assert harness["late_but_sent_in_time"] == 1  # sent 0.5 ms after due, received 5 ms after

    chunks = report["chunks"]  # observation 0's last chunk (full) and observation 5's (partial)
    assert chunks["received"] == 2 and chunks["rungs"] == {"full": 1, "partial": 1}
    assert chunks["early_first_steps"] == 1
    assert chunks["time_to_chunk_ms"]["max"] == pytest.approx(5.0) and chunks["time_to_chunk_ms"]["p50"] == 3.5
    assert chunks["time_to_first_action_ms"]["max"] == pytest.approx(3.0)  # observation 0's early first step
    assert report["spec"] == {"acceptance_rate": 6 / 8, "tokens_per_target_pass": 12 / 5,
                              "target_passes_per_chunk": 2.5, "drafted": 8, "accepted": 6,
                              "speculative_chunks": 2}  # both chunks drafted
    st = per_tick["stages_ms"]
    assert st["publish"][0] == pytest.approx(1.0) and st["publish"][5] == pytest.approx(1.0)
    assert st["receive+plan+decode"][0] == pytest.approx(3.99) and np.isnan(st["publish"][1])
    np.testing.assert_allclose(st["command"][:9], [0.5, 0.5, 0.5, 0.5, 0.5, 4.5, 0.5, 0.5, 0.5])

    su = report["start_up"]
    assert su["time_to_first_chunk_ms"] == pytest.approx(1.0)  # the chunk of no tick of the run counts here
    assert su["first_command_tick"] == 1 and su["time_to_first_command_ms"] == pytest.approx(5.0)

    q = report["quality"]  # the log is at rest at 0: every error is the commanded / planned position itself
    assert q["ticks_compared"] == 8
    assert q["action_rmse_rad"] == pytest.approx(np.sqrt(2e-4 * sum(n * n for n in range(1, 9)) / 16))
    # with the hold of tick 0 (it commands [0, 0], the recorded position): one more tick, error 0
    assert q["ticks_compared_with_holds"] == 9
    assert q["action_rmse_rad_with_holds"] == pytest.approx(np.sqrt(2e-4 * sum(n * n for n in range(1, 9)) / 18))
    # step h of chunk 0 lands on tick 2h, of chunk 5 on tick 5 + 2h (h = 2: tick 9); the early first step's 9 rad
    # is not counted: its whole chunk replaced it
    assert q["chunk_steps_compared"] == [2, 2, 1]
    assert q["chunk_rmse_rad_by_step"] == pytest.approx([np.sqrt(0.085), np.sqrt(0.145), 0.3])

    b = report["boundaries"]  # tick 6 switches from chunk 0 (0.3 there) to chunk 5 (halfway 0 -> 0.4: 0.2)
    assert b["raw_jump_rad"]["count"] == 1 and b["raw_jump_rad"]["max"] == pytest.approx(0.1)
    assert b["step_at_boundary_rad"]["count"] == 1 and b["step_at_boundary_rad"]["max"] == pytest.approx(0.01)
    assert b["step_elsewhere_rad"]["count"] == 6  # 1-2 .. 4-5, 6-7, 7-8 (tick 0 holds, tick 9 is lost)

    # tick 8 commands 0.08 rad, beyond q_max 0.075; every step of 0.01 rad per 4 ms is over 2 rad/s
    assert safety_report(rec.commands, [-1, -1], [0.075, 1], 2.0, P) == {
        "commands_checked": 9, "nonfinite": 0, "outside_position_limits": 1, "over_velocity_limit": 8}
    # observation sent (10 us after due) -> the first command planned from it (ticks 1 and 6, 1 ms after due)
    obs_cmd = _obs_to_command_ns(rec, 10)
    np.testing.assert_allclose(obs_cmd[[0, 5]], [P + MS - 10_000] * 2)
    assert np.isnan(obs_cmd[[1, 2, 3, 4, 6, 7, 8, 9]]).all()
    np.testing.assert_allclose(_obs_to_chunk_ns(rec, 10)[[0, 5]], [5 * MS - 10_000, 2 * MS - 10_000])


def test_a_chunk_outgrowing_the_columns_is_kept_whole():
    chunks = Chunks(n_ticks=20, max_steps=1, n_joints=2, capacity=1)  # too small for any of these
    sent = [chunk(obs, np.arange(2 * k, dtype=float).reshape(k, 2) + obs, T0 + obs, "draft", (obs, 1, 2, 1), obs)
            for obs, k in ((4, 3), (0, 5), (8, 2))]
    for c in sent:
        chunks.put(T0 + c.obs_seq * P, c)
    assert chunks.count == 3 and chunks.steps_rad.shape[1] == 5 and chunks.slot_of_tick[[4, 0, 8]].tolist() == [0, 1, 2]
    for s, c in enumerate(sent):
        got = chunks.chunk(s)
        np.testing.assert_array_equal(got.steps_rad, c.steps_rad)
        assert (got.seq, got.obs_seq, got.t_ready_ns, got.rung, got.tokens) == (c.seq, c.obs_seq, c.t_ready_ns,
                                                                               "draft", c.tokens)


def test_commands_and_chunks_that_do_not_fit_are_counted_not_kept():
    rec = Recording.start(T0, P, np.arange(10), 2, 4, STRIDE)
    rec.add_command(T0 + P, JointCommand(1, 1, 0, 2**63, np.zeros(2), "full"))  # t_ns beyond int64
    rec.add_chunk(T0, chunk(0, np.zeros((4, 3)), T0, "full"))  # 3 joints
    rec.add_chunk(T0, chunk(0, np.zeros((4, 2)), 2**64, "full"))  # t_ready beyond int64
    assert (rec.rejected_commands, len(rec.commands), rec.rejected_chunks, rec.chunks.count) == (1, 0, 2, 0)
    rec.add_command(T0 + P, JointCommand(1, 1, 0, T0, np.zeros(2), "full"))
    assert list(rec.commands) == [1]


def test_memory_stays_flat_however_many_messages_arrive():
    n = 5_000
    rec = Recording.start(T0, P, np.arange(n), 6, 9, 5)
    rx = Stub()
    steps = np.zeros((9, 6))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for k in range(n):
            msgs = [(T0 + k * P + MS, rx, JointCommand(k, k, k - k % 5, T0 + k * P, np.full(6, 0.1), "full"))]
            if k % 5 == 0:
                msgs.append((T0 + k * P + MS, rx, ActionChunk(k, k, T0 + k * P, T0 + k * P, 5 * P, steps + k, "full",
                                                              48, 12, 44, 36)))
            _collect(rx, rx, rec, msgs)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(rec.commands) == n and rec.chunks.count == n // 5
    # the messages themselves (6,000 here, about 1 KB each when kept) would be megabytes
    assert grown < 64 * 1024, f"the recording grew {grown} bytes over {n} ticks"
