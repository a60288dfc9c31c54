"""Fault drills end to end: the replayer, the runtime node and the control loop as real processes on real
loopback sockets, with one fault each: a slowed engine, a killed (and restarted) runtime, a flood of
malformed messages, a policy that returns NaN/inf. What must hold whatever the fault: every tick the
control loop runs sends a command, nothing non-finite or outside the safety limits reaches the robot, and
every drop is counted."""
import numpy as np
import pytest
from rich.console import Console

from edgeinfer.control.loop import ControlConfig
from edgeinfer.logs.arm_log import synthetic_log, write_schunk
from edgeinfer.node.faults import FaultConfig
from edgeinfer.node.runtime import RuntimeConfig
from edgeinfer.sim.replay import replay
from edgeinfer.sim.run_config import ReplayConfig
from edgeinfer.sim.supervisor import GARBAGE_KINDS

pytestmark = pytest.mark.slow
STALL_TICKS = 25  # ticks at 250 Hz in a 100 ms host stall: what one stall of this machine can cost a count


def _log(tmp_path, seconds: float):
    write_schunk(synthetic_log(seconds=seconds), tmp_path / "log")
    return tmp_path / "log"


def _accounting(report):
    n = report["observations_sent"]
    assert sum(report["outcomes"].values()) == n  # every observation ends in exactly one outcome
    assert report["deadline_misses"] == n - report["outcomes"]["on_time"]  # hold, late and lost are misses
    assert sum(report["fallbacks"].values()) == report["commands_received"]
    assert report["outcomes"]["hold"] == report["fallbacks"]["hold"]


def _safe(report):
    # the safety check covers every command the arm got, the pre-roll's too
    assert report["safety"]["commands_checked"] == report["commands_received"] + report["start_up"]["commands_received"]
    assert report["safety"] == {**report["safety"], "nonfinite": 0, "outside_position_limits": 0,
                                "over_velocity_limit": 0}


def _every_tick_commanded(report):
    # a tick the control loop ran always sent a command; the only lost ticks are ones it skipped as overruns,
    # or the first ticks, before any observation reached it (nothing safe to command yet)
    # (and rows the replayer itself skipped after a stall of this machine: no observation, no command due)
    control = report["node_stats"]["control"]["counters"]
    assert report["outcomes"]["lost"] <= control["overruns"] + control["no_state"] + report["replayer"]["rows_skipped"]
    # a few ticks, plus what a 100 ms host stall of the replayer (or of the control loop's I/O thread) at the
    # start leaves without an observation; a loop that never got one would count every tick
    assert control["no_state"] <= 5 + STALL_TICKS
    assert report["harness"]["malformed_messages"] == 0  # the replayer never received a bad chunk/command


@pytest.mark.parametrize("factor", [2, 5])
def test_engine_slowed_past_its_budget_still_commands_every_tick(tmp_path, factor):
    budget_ms = 20.0
    runtime = RuntimeConfig(faults=FaultConfig(fault_pass_delay_ms=factor * budget_ms))
    assert runtime.scheduler.resolved_budget_ms(5, 4_000_000) == budget_ms  # the Schunk policy at 250 Hz
    report = replay(ReplayConfig(log=_log(tmp_path, 3.0), out=tmp_path / "out", runtime=runtime, fork_nodes=True),
                    Console(quiet=True))
    _accounting(report)
    _every_tick_commanded(report)
    _safe(report)
    rungs = report["chunks"]["rungs"]
    assert rungs.get("full", 0) == 0 and rungs.get("partial", 0) == 0  # one target pass never fits the budget
    assert rungs.get("draft", 0) > 0  # the drafter's unverified chunk is the rung that serves
    runtime_counts = report["node_stats"]["runtime"]["counters"]
    # the runtime counts every chunk it sent, the pre-roll's too
    assert runtime_counts["rung.draft"] == rungs["draft"] + report["start_up"]["chunks"]["rungs"].get("draft", 0)
    # the miss definition: a hold (no chunk covered the tick) is a miss like a late or lost command
    o = report["outcomes"]
    assert report["deadline_misses"] == o["hold"] + o["late"] + o["lost"]


def test_runtime_killed_then_restarted_holds_and_recovers(tmp_path):
    runtime = RuntimeConfig()
    # fork_nodes: the restarted runtime is a fork of a process that imported edgeinfer once, so that its start
    # takes a second, not the 5+ s of a cold torch import on a loaded 2-core machine (the recovery, not the
    # import, is under test)
    # on_runtime_lost "hold": the strict reading (no command from a lost runtime's chunks after it is found lost);
    # the default "finish" follows its last chunk to the end first (tests/test_control_live.py)
    cfg = ReplayConfig(log=_log(tmp_path, 14.0), out=tmp_path / "out", runtime=runtime, kill_runtime_at_tick=500,
                       restart_runtime_after_ms=100.0, fork_nodes=True, control=ControlConfig(on_runtime_lost="hold"))
    report = replay(cfg, Console(quiet=True))
    _accounting(report)
    _safe(report)
    gap = report["runtime_fault"]
    assert gap["killed_at_row"] >= 500 and gap["killed_exit_code"] == -9
    # held within two control periods (4 ms each at 250 Hz): no command from the dead runtime's plans after that.
    # The lease (6 ms) leaves 2 ms for the dead runtime's last heartbeat to arrive; a host that delays that
    # delivery by more lets one command through (seen once in CI on this VM), and the report counts it.
    assert gap["unheld_after_two_periods"] <= 1
    assert gap["first_hold_after_kill_ms"] is not None
    assert gap["recovered"] and gap["time_to_recover_ms"] > 100.0
    assert gap["ticks_held"] > 0 and gap["longest_hold_ms"] > 0
    control = report["node_stats"]["control"]["counters"]
    assert control["runtime_lost"] >= 1 and control["runtime_restarts"] == 1
    assert report["process_exit_codes"] == {"runtime": 0, "control": 0}  # the restarted one, stopped cleanly
    # after recovery the new runtime serves: commands from chunks it planned (observations after the kill)
    assert report["chunks"]["received"] > 0


def test_malformed_flood_is_counted_by_both_nodes_which_keep_running(tmp_path):
    # the null policy (a chunk per observation at no cost) keeps this about the transport, not the decoder
    cfg = ReplayConfig(log=_log(tmp_path, 6.0), out=tmp_path / "out", garbage_per_row=2, fork_nodes=True,
                       runtime=RuntimeConfig(null_policy=True))
    report = replay(cfg, Console(quiet=True))
    sent = report["garbage_sent"]
    assert sum(sent.values()) == 2 * report["observations_sent"] == 3_000
    _accounting(report)
    _every_tick_commanded(report)
    assert report["process_exit_codes"] == {"runtime": 0, "control": 0}
    # A node starved of CPU falls behind, and ZMQ drops what overflows its bounded queue (HWM) silently; on
    # a machine that kept up (no stall of the replayer, no overrun of the control loop) every one is counted.
    starved = report["replayer"]["rows_skipped"] > 0 or report["node_stats"]["control"]["counters"]["overruns"] > 0
    for node in ("runtime", "control"):
        counters = report["node_stats"][node]["counters"]
        got = {kind: counters.get(f"malformed.{kind}", 0) for kind in GARBAGE_KINDS}
        assert all(got[k] <= sent[k] for k in sent) and sum(got.values()) >= 0.99 * sum(sent.values()), node
        assert got == sent or starved, node
        assert counters["error.garbage"] == got["garbage"]  # each one counted as an error event too
    # the runtime kept serving real observations through it
    assert report["chunks"]["received"] > 0 and report["outcomes"]["on_time"] > 0


def test_no_observation_is_lost_to_a_late_subscriber(tmp_path):
    # the runtime subscribes seconds late (it loads and warms up its engine first): the start handshake
    # must still deliver observation 0 onwards to both nodes
    cfg = ReplayConfig(log=_log(tmp_path, 1.0), out=tmp_path / "out", runtime=RuntimeConfig(warmup_chunks=30),
                       fork_nodes=True)
    report = replay(cfg, Console(quiet=True))
    n = report["replayer"]["rows_sent"]  # not the rows it skipped as stale after a stall of this machine
    assert n > 0.5 * report["observations_sent"]
    n += report["start_up"]["observations_sent"]  # the nodes count the pre-roll's observations too
    assert report["node_stats"]["runtime"]["counters"]["observations"] == n  # it reads until the Stop
    # the control loop ends on its schedule, after the last tick: the last row, sent late by a stalled replayer
    # (the last row is never skipped as stale), can arrive after that and go uncounted
    assert n - 1 <= report["node_stats"]["control"]["counters"]["observations"] <= n


def test_non_finite_policy_output_never_reaches_the_robot(tmp_path):
    runtime = RuntimeConfig(faults=FaultConfig(fault_nonfinite_every=3))
    report = replay(ReplayConfig(log=_log(tmp_path, 3.0), out=tmp_path / "out", runtime=runtime, fork_nodes=True),
                    Console(quiet=True))
    _accounting(report)
    _every_tick_commanded(report)
    _safe(report)
    counters = report["node_stats"]["runtime"]["counters"]
    injected = counters["error.nonfinite_action"]
    assert injected == counters["chunks_sent"] // 3 > 0
    # each poisoned chunk went out as the continue rung (anchor only): the control loop kept serving the
    # previous chunk (its commands name that chunk's rung) or held
    continued = report["chunks"]["rungs"].get("continue", 0) + report["start_up"]["chunks"]["rungs"].get("continue", 0)
    assert continued == injected  # the runtime's count covers the pre-roll's chunks too
    assert report["commands_received"] - report["fallbacks"]["hold"] > 0
    assert np.isfinite(report["quality"]["action_rmse_rad"])
