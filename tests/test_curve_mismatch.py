"""docs/hil.md on one host: `edgeinfer serve` bound on 0.0.0.0 with keys speaks CURVE, `edgeinfer hil` pointed at
127.0.0.1 without them does not. Both real processes must see the mismatch at the ZMTP handshake and end within
seconds, each with one line naming it and the fix, not wait out their handshake timeouts (300 s)."""
import subprocess
import sys
import time

from ports import free_port_block

from edgeinfer.core.keys import make_keys
from edgeinfer.core.transport import Endpoints
from edgeinfer.sim.hil import PORT_MAP, HilConfig, hil_serve_command


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error" in line.lower()]


def test_serve_with_curve_and_hil_without_both_say_so_within_seconds(tmp_path):
    keys = tmp_path / "keys"
    make_keys(keys)
    port = free_port_block(len(PORT_MAP))
    at = lambda host, k: f"tcp://{host}:{port + PORT_MAP[k]}"  # noqa: E731
    serve = subprocess.Popen(
        [sys.executable, "-m", "edgeinfer", "serve", "--chunks", at("0.0.0.0", "chunks"), "--echo-endpoint",
         at("0.0.0.0", "echo"), "--obs", at("127.0.0.1", "obs"), "--ready", at("127.0.0.1", "ready"), "--status",
         at("127.0.0.1", "status"), "--commands", at("127.0.0.1", "commands"), "--max-obs-age-ms", "1e12",
         "--curve-dir", str(keys), "--null-policy", "true"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    t0 = time.monotonic()
    hil = subprocess.Popen(
        [sys.executable, "-m", "edgeinfer", "hil", "--endpoint", f"tcp://127.0.0.1:{port}", "--duration-s", "1",
         "--out", str(tmp_path / "hil"), "--handshake-timeout-s", "120", "--host-baseline-s", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    # both end on their own, long before their handshake timeouts (hil 120 s, serve 300 s): start-up (the log, this
    # host's state, the control process; the runtime's policy) takes seconds, the verdict then comes at once
    hil_s = None
    while time.monotonic() - t0 < 60 and (hil.poll() is None or serve.poll() is None):
        if hil_s is None and hil.poll() is not None:
            hil_s = time.monotonic() - t0
        time.sleep(0.05)
    hil_s = hil_s or time.monotonic() - t0
    for proc in (hil, serve):
        if proc.poll() is None:
            proc.kill()
    (hil_out, hil_err), (out, err) = hil.communicate(), serve.communicate()
    assert serve.returncode is not None and hil.returncode is not None
    assert hil.returncode == 2, f"hil: {hil_out[-2000:]}{hil_err[-2000:]}\nserve: {out[-2000:]}{err[-2000:]}"
    assert hil_s < 45
    lines = _error_lines(hil_err)
    assert len(lines) == 1 and "Traceback" not in hil_err, hil_err
    assert lines[0].startswith("edgeinfer hil: error: ") and "CURVE mismatch" in lines[0]
    assert "this side does not use CURVE" in lines[0] and "--curve-dir" in lines[0] and "--curve off" in lines[0]
    # serve: the same, from its side
    assert serve.returncode == 2, out[-2000:] + err[-2000:]
    lines = _error_lines(err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("edgeinfer serve: error: ") and "CURVE mismatch" in lines[0]
    assert "this side uses CURVE" in lines[0] and "--curve-dir" in lines[0]


def test_keys_decide_curve_on_both_sides_whatever_the_addresses(tmp_path):
    make_keys(tmp_path / "k")
    loop = Endpoints.free_loopback()
    # the runtime binds 0.0.0.0, the robot side names 127.0.0.1: given the same keys, both speak CURVE
    runtime = Endpoints("tcp://127.0.0.1:5702", "tcp://0.0.0.0:5700", loop.commands, loop.ready,
                        curve_dir=tmp_path / "k")
    robot = Endpoints(loop.obs, "tcp://127.0.0.1:5700", loop.commands, loop.ready, curve_dir=tmp_path / "k")
    assert runtime.curve_keys() is not None and robot.curve_keys() is not None
    assert Endpoints(loop.obs, loop.chunks, loop.commands, loop.ready).curve_keys() is None  # no keys, loopback
    # the serve line hil prints spells out what this side decided: never "--curve auto"
    with_keys = HilConfig(endpoint="tcp://127.0.0.1:5700", curve_dir=tmp_path / "k")
    assert f"--curve on --curve-dir {tmp_path / 'k'}" in hil_serve_command(with_keys, "127.0.0.1")
    assert hil_serve_command(HilConfig(endpoint="tcp://127.0.0.1:5700"), "127.0.0.1").endswith("--curve off")
