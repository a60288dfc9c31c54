"""The run session (sim/session.py) that replay, hil and fleet replay share: whatever way its block ends, the nodes
are stopped, the deferred calls run first, the context is destroyed and the process gets back its signal handlers,
scheduler and CPUs; prepare() reads and checks a run before any process starts; write_outputs writes the files."""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import zmq
from rich.console import Console

from edgeinfer.core import transport
from edgeinfer.core.lifecycle import raise_interrupt
from edgeinfer.core.transport import Endpoints
from edgeinfer.core.wire import Stop
from edgeinfer.engines.models.paths import DEFAULT_POLICY
from edgeinfer.logs.arm_log import ArmLog, synthetic_log, write_schunk
from edgeinfer.node.runtime import RuntimeConfig
from edgeinfer.procs.node_spec import NodeSpec
from edgeinfer.sim.metrics import summarize
from edgeinfer.sim.run_config import ReplayConfig
from edgeinfer.sim.session import RobotSockets, RunSession, prepare, write_outputs

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_runs import PERIOD_NS, STRIDE, recording  # noqa: E402

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _edgeinfer_children() -> list[psutil.Process]:
    """This process's living descendants that run edgeinfer (the nodes a run started; not the fork server, which
    outlives runs by design and which an earlier test in this process may have started)."""
    from edgeinfer.procs import forkserver

    server = forkserver._client.proc.pid if forkserver._client is not None else None
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.pid != server and p.status() != psutil.STATUS_ZOMBIE and "edgeinfer" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            pass
    return out


def test_a_body_that_raises_still_stops_the_nodes_after_the_deferred_calls_and_restores_the_process(tmp_path):
    handlers = [signal.getsignal(s) for s in SIGNALS]
    cpus = sorted(os.sched_getaffinity(0))
    seen = []
    with pytest.raises(RuntimeError, match="the body failed"):
        with RunSession(grace_s=10.0) as run:
            assert [signal.getsignal(s) for s in SIGNALS] == [raise_interrupt] * 2
            # a control node with nobody to hand-shake with waits for Hellos: a live node to tear down
            (node,) = run.start(NodeSpec("control", (Endpoints.free_loopback(),), log=tmp_path / "control.log"))
            run.realtime(cpus[:1], 0)  # pinned; priority 0: no SCHED_FIFO asked (none is granted here anyway)
            assert sorted(os.sched_getaffinity(0)) == cpus[:1] and run.rt_warning is None
            ctx = run.ctx
            sock = ctx.socket(zmq.PUB)
            run.defer(seen.append, "first deferred")
            # the newest deferred call runs first, while the node still runs and with the signals ignored
            run.defer(lambda: seen.append(("node alive", _alive(node.pid), signal.getsignal(signal.SIGINT))))
            raise RuntimeError("the body failed")
    assert seen == [("node alive", True, signal.SIG_IGN), "first deferred"]
    assert node.state == "stopped" and not _alive(node.pid)
    assert ctx.closed and sock.closed
    assert [signal.getsignal(s) for s in SIGNALS] == handlers
    assert sorted(os.sched_getaffinity(0)) == cpus
    assert run.sched["replayer"]["requested"] == 0


def test_a_deferred_call_that_raises_does_not_keep_the_nodes_running(tmp_path):
    def broken() -> None:
        raise ValueError("a deferred call failed")

    handlers = [signal.getsignal(s) for s in SIGNALS]
    with pytest.raises(ValueError, match="a deferred call failed"):
        with RunSession(grace_s=10.0) as run:
            (node,) = run.start(NodeSpec("control", (Endpoints.free_loopback(),), log=tmp_path / "control.log"))
            run.defer(broken)
    assert not _alive(node.pid)
    assert [signal.getsignal(s) for s in SIGNALS] == handlers


def test_sigterm_in_the_block_is_a_keyboard_interrupt_and_a_second_one_cannot_cut_the_teardown_short():
    handlers = [signal.getsignal(s) for s in SIGNALS]
    seen = []
    with pytest.raises(KeyboardInterrupt):
        with RunSession() as run:
            run.defer(seen.append, "after the second signal")
            run.defer(os.kill, os.getpid(), signal.SIGINT)  # runs first: ignored, the teardown goes on
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises in this thread long before this ends
    assert seen == ["after the second signal"]
    assert [signal.getsignal(s) for s in SIGNALS] == handlers


def test_a_failed_start_tells_the_nodes_once_and_a_run_that_ended_is_not_told_again():
    ep = Endpoints.free_loopback()
    with RunSession() as run:
        run.realtime(None, 0)
        socks = RobotSockets.open(run.ctx, ep, 6, nodrop=True)
        node = transport.Receiver(transport.sub(run.ctx, ep.obs))
        assert socks.obs_pub.poll(5000) and socks.obs_pub.recv() == b"\x01"  # the XPUB sees the subscription
        socks.abort("failed on the robot side")
        msg = node.recv(5000)
        assert isinstance(msg, Stop) and msg.reason == "failed on the robot side"
        socks.stop(interrupted=True)
        socks.repeat_stop()
        assert [node.recv(5000).reason for _ in range(2)] == ["interrupted", "interrupted"]
        socks.abort("failed on the robot side")  # the run ended with its Stop: nothing more is sent
        assert node.recv(200) is None


def test_prepare_reads_cuts_and_checks_the_log_before_any_process(tmp_path):
    cfg = ReplayConfig(duration_s=1.0, time_scale=2.0)
    prep = prepare(cfg, Console(quiet=True))
    assert len(prep.log) == 250 and len(prep.ticks) == 250  # 1 s of the embedded 250 Hz log
    assert prep.period_ns == 2_000_000 and prep.deadline_ms == 2.0  # one time-scaled control period
    assert prep.stride == prep.policy["stride_ticks"] and prep.shortened["count"] == 0
    assert cfg.control.limits is prep.limits.limits  # the control node gets the resolved limits
    # a gap longer than max_gap_s is shortened to it
    log = synthetic_log(seconds=2.0)
    gap = np.r_[log.t_s[:100], log.t_s[100:] + 10.0]
    write_schunk(ArmLog("gap", gap, log.q_rad, log.qd_rad_s), tmp_path / "gap")
    prep = prepare(ReplayConfig(log=tmp_path / "gap", max_gap_s=1.0), Console(quiet=True))
    assert prep.shortened["count"] == 1 and int(prep.ticks[100] - prep.ticks[99]) == 250  # 1 s at 250 Hz


def test_write_outputs_writes_every_file_and_hands_the_plots_their_inputs(tmp_path):
    rec, log = recording(seconds=1.0)
    cfg = ReplayConfig(out=tmp_path)
    report, per_tick = summarize(rec, log, cfg, PERIOD_NS / 1e6, STRIDE)
    plotted = []
    write_outputs(report, per_tick, rec, log, cfg, Console(quiet=True),
                  plots=lambda r, t, out: plotted.append((r is report, t is per_tick, out)))
    assert plotted == [(True, True, tmp_path)]
    assert json.loads((tmp_path / "report.json").read_text())["observations_sent"] == len(log)
    assert len((tmp_path / "ticks.csv").read_text().splitlines()) == 1 + len(log)
    if report["run_mcap"]["file"] is not None:  # the mcap library is an extra
        assert (tmp_path / "run.mcap").stat().st_size == report["run_mcap"]["bytes"]


@pytest.mark.slow
def test_a_replay_whose_runtime_dies_at_start_leaves_no_node_and_restores_the_process(tmp_path):
    manifest = json.loads(DEFAULT_POLICY.read_text())
    manifest["sha256"] = "0" * 64  # the runtime must refuse weights that do not match their manifest
    (tmp_path / "bad.json").write_text(json.dumps(manifest))
    (tmp_path / manifest["weights"]).write_bytes(DEFAULT_POLICY.with_suffix(".pt").read_bytes())
    handlers = [signal.getsignal(s) for s in SIGNALS]
    cpus = sorted(os.sched_getaffinity(0))
    from edgeinfer.sim.replay import replay

    cfg = ReplayConfig(out=tmp_path, runtime=RuntimeConfig(policy=tmp_path / "bad.json"), handshake_timeout_s=60,
                       host_baseline_s=0)
    with pytest.raises(RuntimeError, match="runtime process exited"):
        replay(cfg, Console(quiet=True))
    assert _edgeinfer_children() == []  # the control node that was still waiting was stopped too
    assert [signal.getsignal(s) for s in SIGNALS] == handlers
    assert sorted(os.sched_getaffinity(0)) == cpus and os.sched_getscheduler(0) == os.SCHED_OTHER
