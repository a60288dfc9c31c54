"""procs/peers.py: helper processes (the transport floors' echo peers, the hil round-trip prober) start in a session
of their own, are torn down by their starter, and do not outlive it."""
import os
import signal
import subprocess
import sys

import psutil
import pytest

from edgeinfer.procs.peers import spawn_peer


def test_peer_leads_its_own_group_and_is_torn_down():
    with spawn_peer("edgeinfer.bench.echo_peers", ["rep"], name="echo") as peer:
        assert peer.stdout.readline().strip().isdigit()  # its handshake: the port it bound
        assert os.getpgid(peer.pid) == peer.pid
        assert peer.poll() is None
    assert peer.returncode == -signal.SIGTERM


def test_peer_stderr_goes_to_its_log(tmp_path):
    log = tmp_path / "peer.log"
    peer = spawn_peer("edgeinfer.bench.echo_peers", ["nonsense"], log=log)
    assert peer.finish(timeout_s=30.0) == 2
    assert "usage: python -m edgeinfer.bench.echo_peers" in log.read_text()


# a starter that spawns one peer, prints its pid and waits to be killed
_STARTER = """
import sys, time
from edgeinfer.procs.peers import spawn_peer
peer = spawn_peer(sys.argv[1], sys.argv[2:], stdin=True)
print(peer.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("module, args", [
    ("edgeinfer.bench.echo_peers", ["rep"]),
    ("edgeinfer.bench.echo_peers", ["pubsub", "tcp://127.0.0.1:9", "echo"]),
    # no echo answers: the prober would warm up for ever
    ("edgeinfer.sim.roundtrip", ["tcp://127.0.0.1:9", "20", "50", os.devnull]),
])
def test_peer_exits_when_its_starter_is_killed(module, args):
    starter = subprocess.Popen([sys.executable, "-c", _STARTER, module, *args], stdout=subprocess.PIPE, text=True)
    try:
        peer = psutil.Process(int(starter.stdout.readline()))
    finally:
        starter.kill()
        starter.wait()
        starter.stdout.close()
    try:
        peer.wait(timeout=20)  # ParentWatch: within a wake-up (1 s) or a warm-up (5 x 50 ms)
    except psutil.TimeoutExpired:
        peer.kill()
        pytest.fail(f"{module} {args} outlived its starter")
