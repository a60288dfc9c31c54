"""Start-up apart from steady state: the replayer's pre-roll (the arm at rest before the log's first row), the
report's start_up section and time to first command, and the headline's scope. Recordings are built in memory
(no processes) except one stream over real sockets."""
from __future__ import annotations

import io

import numpy as np
import pytest
from rich.console import Console
from test_replay_timing import _received, sockets  # noqa: F401  (the fixture: a PUB/SUB pair past the slow joiner)

from edgeinfer.core.wire import ActionChunk, JointCommand, Observation, Start
from edgeinfer.logs.arm_log import synthetic_log
from edgeinfer.sim.compare import compare
from edgeinfer.sim.metrics import summarize
from edgeinfer.sim.received import Chunks, Commands
from edgeinfer.sim.replay import Recording, stream
from edgeinfer.sim.report import print_table
from edgeinfer.sim.run_config import ReplayConfig
from edgeinfer.sim.schedule import tick_grid

PERIOD = 4_000_000
T0 = 1_000_000_000
N_ROWS = 100
FIRST_COMMAND_TICK = 7  # ticks before it are holds: the first chunk is not there yet


def _run(pre_roll_ticks: int) -> tuple[dict, dict]:
    """summarize() of a run whose control loop holds until tick FIRST_COMMAND_TICK, then commands every tick
    on time (0.6-0.66 ms after it is due) from a full chunk; the log's rows sit on the ticks after the pre-roll."""
    log = synthetic_log(seconds=N_ROWS / 250, seed=0)
    ticks = np.arange(N_ROWS) + pre_roll_ticks
    n_ticks = pre_roll_ticks + N_ROWS
    rec = Recording(T0, PERIOD, n_ticks, ticks, T0 + ticks * PERIOD, T0 + ticks * PERIOD + 10_000,
                    Commands(n_ticks, log.n_joints), Chunks(n_ticks, 9, log.n_joints, 1), pre_roll_ticks=pre_roll_ticks)
    steps = np.repeat(log.q_rad[:1], 9, axis=0)  # the first chunk, planned from tick 0's observation
    rec.add_chunk(T0 + 15_000_000, ActionChunk(0, 0, T0, T0 + 14_000_000, 5 * PERIOD, steps, "full", 48, 12, 44, 36))
    for k in range(pre_roll_ticks + N_ROWS):
        rung = "hold" if k < FIRST_COMMAND_TICK else "full"
        q = log.q_rad[max(0, k - pre_roll_ticks)] + 1e-4 * (k % 3)
        t_recv = T0 + k * PERIOD + 600_000 + (k % 7) * 10_000
        rec.add_command(t_recv, JointCommand(k, k, -1 if rung == "hold" else k, 0, q, rung))
    return summarize(rec, log, ReplayConfig(), PERIOD / 1e6, 5)


def test_a_pre_roll_keeps_start_up_out_of_the_steady_state_headline():
    report, per_tick = _run(pre_roll_ticks=10)
    assert report["miss_rate_scope"] == "steady state"
    assert report["observations_sent"] == N_ROWS and len(per_tick["tick"]) == N_ROWS  # the log's rows only
    assert report["deadline_misses"] == 0 and report["outcomes"]["hold"] == 0 and report["fallbacks"]["hold"] == 0
    su = report["start_up"]
    assert su["pre_roll_ticks"] == 10 and su["pre_roll_ms"] == 40.0
    assert su["outcomes"] == {"on_time": 3, "late": 0, "lost": 0, "hold": 7} and su["deadline_misses"] == 7
    assert su["commands_received"] == 10 and su["observations_sent"] == 10
    assert su["chunks"] == {"received": 1, "rungs": {"full": 1}}
    assert report["chunks"]["received"] == 0 and su["time_to_first_chunk_ms"] == pytest.approx(15.0)
    assert su["first_command_tick"] == FIRST_COMMAND_TICK and su["measured_ticks_before_first_command"] == 0
    assert su["time_to_first_command_ms"] == pytest.approx(FIRST_COMMAND_TICK * 4 + 0.6)
    assert report["harness"]["ticks_without_observation"] == 0  # the pre-roll's ticks had their observation
    assert per_tick["tick"].tolist() == list(range(N_ROWS))  # ticks.csv: the log's own tick grid


def test_without_a_pre_roll_start_up_is_counted_in_the_headline():
    report, _ = _run(pre_roll_ticks=0)
    assert report["miss_rate_scope"] == "whole run"
    assert report["deadline_misses"] == FIRST_COMMAND_TICK == report["outcomes"]["hold"]
    assert report["miss_rate"] == pytest.approx(FIRST_COMMAND_TICK / N_ROWS)
    su = report["start_up"]
    assert su["pre_roll_ticks"] == 0 and su["deadline_misses"] == 0
    assert su["measured_ticks_before_first_command"] == FIRST_COMMAND_TICK


def test_a_pre_roll_shorter_than_start_up_says_so():
    report, _ = _run(pre_roll_ticks=3)
    assert report["miss_rate_scope"] == "start-up included"
    assert report["deadline_misses"] == 4 == report["start_up"]["measured_ticks_before_first_command"]
    assert report["start_up"]["deadline_misses"] == 3


def test_table_and_compare_name_the_headline_scope():
    steady, _ = _run(pre_roll_ticks=10)
    whole, _ = _run(pre_roll_ticks=0)
    out = io.StringIO()
    print_table([whole, steady], Console(file=out, width=250))
    text = out.getvalue()
    assert "0.00 % [0.00, 3.62] steady state" in text and "7.00 % [2.86, 13.89] whole run" in text
    assert "time to first command ms" in text and "28.600" in text and "7 / 10 ticks (40 ms)" in text
    row = next(r for r in compare(whole, steady) if r["figure"] == "miss rate")
    assert row["verdict"] == "better" and row["test"].endswith("A whole run, B steady state")
    assert next(r for r in compare(whole, steady) if r["figure"] == "time to first command")["a"] == \
        pytest.approx(28.6)


def test_stream_sends_the_pre_roll_before_the_log(sockets):  # noqa: F811
    pub, sub, cmd_rx, chunk_rx = sockets
    log = synthetic_log(seconds=0.1, seed=1)  # 25 rows at 250 Hz
    rec = stream(log, tick_grid(log), 5, pub, cmd_rx, chunk_rx, 1.0, 50.0, pre_roll_ms=18.0)
    msgs = _received(sub, 1 + rec.pre_roll_ticks - rec.pre_roll_skipped + int((~rec.skipped).sum()))
    start, obs = msgs[0], [m for m in msgs if isinstance(m, Observation)]
    assert isinstance(start, Start) and start.n_ticks == 5 + len(log)  # 18 ms at 4 ms: 5 ticks, rounded up
    assert rec.pre_roll_ticks == 5 and rec.tick.tolist() == (tick_grid(log) + 5).tolist()
    pre, rows = obs[:5 - rec.pre_roll_skipped], obs[5 - rec.pre_roll_skipped:]
    assert all(o.seq < 5 for o in pre) and [o.seq for o in rows] == rec.tick[~rec.skipped].tolist()
    for o in pre:  # the arm at rest at the log's first position, due on the schedule before row 0
        np.testing.assert_array_equal(o.q_rad, log.q_rad[0])
        np.testing.assert_array_equal(o.q_prev_rad, log.q_rad[0])
        assert not o.qd_rad_s.any() and o.t_ns == rec.t0_ns + o.seq * rec.period_ns
    assert rec.t_sched_ns[0] == rec.t0_ns + 5 * rec.period_ns
