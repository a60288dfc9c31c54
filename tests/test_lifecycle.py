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
from edgeinfer.sim.run_config import ReplayConfig


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
    with pytest.raises(ValueError, match=r"log has 6 joints, the policy expects 6, the limits have 3 \(q_min_rad/"):
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


def test_node_group_tears_down_a_node_and_a_descendant_that_left_its_group(tmp_path):
    import psutil

    from edgeinfer.procs.node_spec import NodeSpec
    from edgeinfer.procs.nodes import NodeGroup, kill_tree

    said = []
    with NodeGroup(grace_s=10.0, say=lambda node, text, style: said.append((node.name, text))) as group:
        # a control node with nobody to hand-shake with waits for Hellos: a live node to tear down
        node = group.start(NodeSpec("control", (Endpoints.free_loopback(),), log=tmp_path / "control.log"))
        group.check_started()
        assert os.getsid(node.pid) == node.pid  # a session of its own
        assert group.poll() == [] and node.state == "starting"
    assert node.state == "stopped" and node.returncode is not None and not _alive(node.pid)
    assert said == [("control", "SIGTERM")]  # SIGTERM was enough
    # a grandchild in a session of its own outlives its parent; kill_tree ends it by (pid, create time)
    parent = subprocess.Popen(["bash", "-c", "setsid sleep 60 & sleep 60"])
    deadline = time.monotonic() + 10
    while len(kids := psutil.Process(parent.pid).children(recursive=True)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    parent.kill()
    parent.wait()
    kill_tree(kids, grace_s=5.0)
    assert not any(_alive(k.pid) for k in kids)


def test_a_node_that_dies_during_start_up_is_named_with_its_log(tmp_path):
    from edgeinfer.procs.node_spec import NodeSpec
    from edgeinfer.procs.nodes import NodeGroup

    with NodeGroup() as group:
        node = group.start(NodeSpec("control", (), "ctl", tmp_path / "ctl.log"))  # no endpoints: argparse exits 2
        assert node.wait(timeout=120) == 2
        with pytest.raises(RuntimeError, match=r"(?s)ctl process exited with code 2 during start-up:\n.*--obs"):
            group.check_started()
    assert [n.state for n in group.nodes] == ["failed"]


def test_exit_now_writes_the_queued_log_lines_and_stdout_then_skips_the_teardown(tmp_path):
    """A node ends with core.lifecycle.exit_now: every line queued for the log writer is in its log, its closing
    summary (print_last) after them, the exit status is kept, and nothing of the interpreter's teardown runs (an atexit
    handler here)."""
    script = ("import atexit\n"
              "from edgeinfer.core.lifecycle import exit_now\n"
              "from edgeinfer.core.logwriter import emit, print_last\n"
              "atexit.register(lambda: print('teardown ran'))\n"
              "for i in range(200):\n"
              "    emit(f'line {i}')\n"
              "print_last('summary last')\n"
              "exit_now(3)\n")
    with open(tmp_path / "node.log", "w") as log:
        code = subprocess.run([sys.executable, "-c", script], stdout=log, stderr=subprocess.STDOUT,
                              timeout=60).returncode
    text = (tmp_path / "node.log").read_text()
    assert code == 3 and "teardown ran" not in text and text.splitlines()[-1] == "summary last"  # after the queue
    assert [f"line {i}" for i in range(200)] == [line for line in text.splitlines() if line.startswith("line ")]


def test_a_node_command_exits_without_the_interpreter_teardown_and_others_do_not():
    """Only a node's command (Command.node) skips the teardown (cli.process_main); the exit status is main()'s either
    way. main() stands in for the command's run here: what is under test is the exit after it."""
    hook = "import atexit; atexit.register(lambda: print('teardown ran'))"
    for command, node in (("control", True), ("replay", True), ("keys", False), ("bench", False)):
        script = (f"import sys; {hook}; import edgeinfer.cli as cli; cli.main = lambda: 5; "
                  f"sys.argv = ['edgeinfer', {command!r}]; cli.process_main()")
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert out.returncode == 5 and ("teardown ran" in out.stdout) is not node, (command, out.stdout)
