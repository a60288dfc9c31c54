"""procs/forkserver.py: nodes forked from a server that imported edgeinfer once behave as subprocess.Popen children
(exit codes, signals, timeouts, log files) and run the real `edgeinfer` command line."""
import json
import os
import signal
import subprocess
import sys
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



def test_a_node_takes_the_niceness_of_the_thread_that_asked_for_it(tmp_path):
    """As a subprocess of the asking thread would (Linux keeps a niceness per thread), whatever the fork server's: in a
    fresh process whose server a thread at nice 10 started, a node asked for at nice 15 runs at 15 and one asked for
    at nice 0 at 0 (lowering a niceness needs CAP_SYS_NICE: without it, the server's 10)."""
    script = f"""
import json, os, threading, time
from pathlib import Path
from edgeinfer.core.config import to_argv
from edgeinfer.core.transport import Endpoints
from edgeinfer.procs import forkserver

def nice_of(pid):
    return int(Path(f"/proc/{{pid}}/stat").read_text().rsplit(")", 1)[1].split()[16])

def at(nice, fn):
    out = []
    def run():
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        out.append(fn())
    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out[0]

def node():
    n = forkserver.ForkedNode(["control", *to_argv(Endpoints.free_loopback())], Path({str(tmp_path)!r}) / "c.log")
    want, deadline = os.getpriority(os.PRIO_PROCESS, 0), time.monotonic() + 30
    while nice_of(n.pid) != want and time.monotonic() < deadline:  # the child renices itself after the fork's reply
        time.sleep(0.01)
    nice = nice_of(n.pid)
    n.kill()
    n.wait(timeout=60)
    return nice

at(10, forkserver.start)
print(json.dumps([nice_of(forkserver._server().proc.pid), at(15, node), node()]))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    server, at_15, at_0 = json.loads(out.stdout)
    assert server == 10 and at_15 == 15 and at_0 == (0 if os.geteuid() == 0 else 10)
