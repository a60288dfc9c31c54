"""procs/forkserver.py: nodes forked from a server that imported edgeinfer once behave as subprocess.Popen children
(exit codes, signals, timeouts, log files) and run the real `edgeinfer` command line."""
import os
import signal
import subprocess
from pathlib import Path

import pytest

from edgeinfer.core.config import to_argv
from edgeinfer.core.transport import Endpoints
from edgeinfer.procs.forkserver import ForkedNode


def test_exit_code_and_output_of_the_command_line(tmp_path):
    log = tmp_path / "bad.log"
    node = ForkedNode(["control", "--no-such-option"], log)
    assert node.wait(timeout=120) == 2 and node.poll() == 2 == node.returncode  # argparse's usage error
    assert "edgeinfer control: error: the following arguments are required: --obs" in log.read_text()
    ok = ForkedNode(["keys", str(tmp_path / "keys")], tmp_path / "keys.log")
    assert ok.wait(timeout=60) == 0
    assert "wrote" in (tmp_path / "keys.log").read_text() and any((tmp_path / "keys").iterdir())


def test_a_waiting_node_times_out_then_is_killed_in_its_own_session(tmp_path):
    # a control node with nobody to hand-shake with waits (up to 300 s) for Hellos
    node = ForkedNode(["control", *to_argv(Endpoints.free_loopback())], tmp_path / "control.log")
    with pytest.raises(subprocess.TimeoutExpired):
        node.wait(timeout=0.5)
    assert node.poll() is None
    assert os.getsid(node.pid) == node.pid != os.getsid(0)  # Ctrl-C on our terminal does not reach it
    ppid = next(int(line.split()[1]) for line in Path(f"/proc/{node.pid}/status").read_text().splitlines()
                if line.startswith("PPid:"))
    assert ppid != os.getpid()  # a child of the fork server, not of this process
    node.kill()
    assert node.wait(timeout=60) == -signal.SIGKILL
    node.kill()  # reaped: a no-op, never a signal to a reused pid
