"""Nodes do not outlive the process that started them, and a run that cannot work is refused up front."""
import os
import subprocess
import sys
import time

import pytest

from edgeinfer.control.loop import ControlConfig
from edgeinfer.control.safety import SafetyLimits
from edgeinfer.core.transport import Endpoints
from edgeinfer.logs.arm_log import synthetic_log
from edgeinfer.sim.preflight import check_run_fits, policy_shape
from edgeinfer.sim.replay import ReplayConfig


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it has exited all the same
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split()[2] != "Z"


def test_orphaned_control_node_exits_when_its_parent_dies():
    ep = Endpoints.free_loopback()
    args = " ".join(f"--{k} {v}" for k, v in vars(ep).items())
    # a parent shell that starts the node and exits at once, as a SIGKILLed replayer would leave it
    cmd = f"EDGEINFER_PARENT_PID=$$ {sys.executable} -m edgeinfer control {args} >/dev/null 2>&1 & echo $!"
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=30)
    pid = int(out.stdout.strip())
    deadline = time.monotonic() + 30  # python + torch import, then one handshake check period
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = _alive(pid)
    if alive:
        os.kill(pid, 9)
    assert not alive, "control node outlived its parent"


def test_runs_that_cannot_work_are_refused_up_front():
    log = synthetic_log(seconds=0.5)
    manifest = policy_shape(ReplayConfig().runtime, log)
    with pytest.raises(ValueError, match="phase_ms=4.0 is not before the 4.0 ms deadline"):
        check_run_fits(log, manifest, ReplayConfig(control=ControlConfig(phase_ms=4.0)), 4.0)
    short = SafetyLimits(q_min_rad=[-1.0] * 3, q_max_rad=[1.0] * 3)
    with pytest.raises(ValueError, match=r"have \[3\] entries, the log has 6 joints"):
        check_run_fits(log, manifest, ReplayConfig(control=ControlConfig(limits=short)), 4.0)
    with pytest.raises(ValueError, match=r"stall_runtime_at_tick=125 is past the last row .*125 rows"):
        check_run_fits(log, manifest, ReplayConfig(stall_runtime_at_tick=125), 4.0)
    with pytest.raises(ValueError, match=r"kill_runtime_at_tick=900 is past the last row"):
        check_run_fits(log, manifest, ReplayConfig(kill_runtime_at_tick=900), 4.0)
    check_run_fits(log, manifest, ReplayConfig(stall_runtime_at_tick=124), 4.0)  # the last row
    check_run_fits(log, manifest, ReplayConfig(), 4.0)  # the defaults fit


def test_nodes_that_do_not_run_the_policy_never_import_torch():
    # a control loop on a robot's computer, the replayer and the launcher start in well under a second, and need
    # no torch installed; only the runtime node that serves the policy imports it
    code = """
import sys
from edgeinfer.cli import main
for command in ("control", "replay", "hil", "launch"):
    try:
        main([command, "--help"])
    except SystemExit:
        pass
import edgeinfer.sim.replay, edgeinfer.sim.hil, edgeinfer.launch, edgeinfer.node.runtime
assert "torch" not in sys.modules, "torch was imported"
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
