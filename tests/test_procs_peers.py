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


def test_the_codec_echo_drops_a_malformed_message_counts_it_and_keeps_echoing(tmp_path):
    import numpy as np
    import zmq

    from edgeinfer.bench.floors import minimal_decode, minimal_encode

    ctx = zmq.Context()
    pub, sub = ctx.socket(zmq.PUB), ctx.socket(zmq.SUB)
    try:
        for s in (pub, sub):
            s.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.RCVTIMEO, 100)
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        log = tmp_path / "peer.log"
        with spawn_peer("edgeinfer.bench.echo_peers", ["pubsub", f"tcp://127.0.0.1:{port}", "codec"], log=log) as peer:
            sub.connect(f"tcp://127.0.0.1:{int(peer.stdout.readline())}")
            for _ in range(300):  # the subscriptions come up: a one-frame probe comes back as it went
                pub.send(b"probe")
                try:
                    sub.recv()
                    break
                except zmq.Again:
                    pass
            else:
                pytest.fail("the echo peer never answered a probe")
            pub.send_multipart([b"garbage", b"\x00\x01"])  # neither a msgpack header nor whole float64s
            pub.send_multipart(minimal_encode({"seq": 7}, np.arange(3.0)))
            sub.setsockopt(zmq.RCVTIMEO, 10_000)
            while len(reply := sub.recv_multipart()) == 1:  # late probe replies
                pass
            header, flat = minimal_decode(reply)
            assert header == {"seq": 7} and flat.tolist() == [0.0, 1.0, 2.0]
            pub.send(b"stop")
            assert peer.finish(timeout_s=10.0) == 0
        assert "1 message(s) refused by the codec" in log.read_text()
    finally:
        ctx.destroy(linger=0)


@pytest.mark.parametrize("argv", [[], ["bogus"], ["rep", "extra"], ["pubsub", "notanendpoint", "echo"],
                                  ["pubsub", "tcp://127.0.0.1:9", "loud"]])
def test_an_echo_peer_with_bad_arguments_prints_its_usage_and_exits_2(argv, tmp_path):
    peer = spawn_peer("edgeinfer.bench.echo_peers", argv, log=tmp_path / "peer.log")
    assert peer.finish(timeout_s=30.0) == 2
    assert "usage: python -m edgeinfer.bench.echo_peers rep" in (tmp_path / "peer.log").read_text()
