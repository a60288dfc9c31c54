"""CURVE on edgeinfer endpoints: keys from `edgeinfer keys`, encryption and client authentication over
tcp://127.0.0.1 with curve forced on; and the loopback-by-default rule."""
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq
import zmq.auth

from edgeinfer.core import transport
from edgeinfer.core.keys import make_keys
from edgeinfer.core.transport import CurveKeys, Endpoints, is_loopback
from edgeinfer.core.wire import Observation


def _obs(seq):
    q = np.zeros(6)
    return Observation(seq, time.perf_counter_ns(), q, q, q)


def _receives(ctx, ep: str, keys: CurveKeys | None, pub, timeout_s: float = 1.5) -> bool:
    """Whether a SUB with `keys` (None: plain) gets anything from `pub` within timeout_s."""
    rx = transport.Receiver(transport.sub(ctx, ep, curve=keys))
    deadline = time.monotonic() + timeout_s
    i = 0
    try:
        while time.monotonic() < deadline:
            transport.send(pub, _obs(i))
            i += 1
            if rx.recv(20) is not None:
                return True
        return False
    finally:
        rx.close()


def test_cli_writes_keys_and_never_overwrites(tmp_path):
    run = lambda: subprocess.run([sys.executable, "-m", "edgeinfer", "keys", str(tmp_path / "k")],  # noqa: E731
                                 capture_output=True, text=True, timeout=60)
    first = run()
    assert first.returncode == 0, first.stderr
    for name in ("server.key_secret", "client.key_secret", "authorized_clients/client.key"):
        assert (tmp_path / "k" / name).is_file()
    assert (tmp_path / "k" / "server.key_secret").stat().st_mode & 0o077 == 0  # secret: owner only
    second = run()
    assert second.returncode == 2 and "already exists" in second.stderr


def test_curve_forced_on_loopback_refuses_the_unauthenticated_and_serves_the_authenticated(tmp_path):
    make_keys(tmp_path / "k")
    ep = Endpoints.free_loopback()
    ep.curve, ep.curve_dir = "on", tmp_path / "k"
    keys = ep.curve_keys()
    assert keys is not None
    ctx = zmq.Context()
    auth = transport.start_authenticator(ctx, keys)
    try:
        pub = transport.pub(ctx, ep.obs, bind=True, curve=keys)
        assert pub.curve_server
        # a plain client, and one with a key pair the server never authorised: nothing reaches them
        assert not _receives(ctx, ep.obs, None, pub)
        stranger_pub, stranger_secret = zmq.curve_keypair()
        stranger = CurveKeys(keys.server_public, keys.server_secret, stranger_pub, stranger_secret, keys.authorized_dir)
        assert not _receives(ctx, ep.obs, stranger, pub)
        # the authorised client gets the messages
        assert _receives(ctx, ep.obs, keys, pub, timeout_s=10)
    finally:
        auth.stop()
        ctx.destroy(linger=0)


def test_endpoints_are_loopback_by_default_and_remote_ones_need_keys(tmp_path):
    ep = Endpoints.free_loopback()
    assert all(is_loopback(e) for e in ep.all()) and ep.curve_keys() is None
    assert is_loopback("tcp://[::1]:5555") and is_loopback("ipc:///tmp/x") and not is_loopback("tcp://10.0.0.2:5555")
    remote = Endpoints("tcp://10.0.0.2:5555", ep.chunks, ep.commands, ep.ready)
    with pytest.raises(ValueError, match="not loopback"):
        remote.curve_keys()
    remote.curve = "off"  # explicit: unencrypted
    assert remote.curve_keys() is None
    with pytest.raises(ValueError, match="curve_dir"):
        Endpoints(ep.obs, ep.chunks, ep.commands, ep.ready, curve="on")
    with pytest.raises(ValueError, match="cannot read CURVE key"):
        CurveKeys.load(tmp_path / "nothing-here")
