"""Hardware in the loop over a real network link: `edgeinfer serve` in one network namespace (the runtime host),
`edgeinfer hil` in another (the robot host), joined by a veth pair, CURVE-encrypted as any non-loopback run.
The link is shaped with tc netem where the kernel has it, and cut mid-run: the control loop must detect the
lost runtime and hold, with a command for every tick. Skips by capability (no iproute2, no CAP_NET_ADMIN, no
sch_netem), never fails for the lack of one."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from netns import VethLink, unavailable

pytestmark = pytest.mark.slow
PORT = 41000  # each namespace has its own ports: no collision with other tests or runs


@pytest.fixture
def link():
    why = unavailable()
    if why:
        pytest.skip(why)
    with VethLink() as link:
        yield link


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    out = tmp_path_factory.mktemp("curve") / "keys"
    subprocess.run([sys.executable, "-m", "edgeinfer", "keys", str(out)], check=True, capture_output=True)
    return out


def run_hil(link, keys, schunk_dir, out, cut_after_s=None):
    """serve in the runtime namespace, hil in the robot namespace; cut the link cut_after_s after the runtime
    has started serving. Returns (hil's exit code, its output, report.json)."""
    at = lambda host, off: f"tcp://{host}:{PORT + off}"  # noqa: E731
    serve_log = out.parent / f"{out.name}_serve.log"
    serve = subprocess.Popen(link.run_in(link.rt, [
        sys.executable, "-m", "edgeinfer", "serve", "--chunks", at("0.0.0.0", 0), "--echo-endpoint", at("0.0.0.0", 1),
        "--obs", at(link.rb_addr, 2), "--ready", at(link.rb_addr, 3), "--status", at(link.rb_addr, 4),
        "--commands", at(link.rb_addr, 5), "--max-obs-age-ms", "1e12", "--curve-dir", str(keys)]),
        stdout=serve_log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    hil_log = out.parent / f"{out.name}_hil.log"
    try:
        hil = subprocess.Popen(link.run_in(link.rb, [
            sys.executable, "-m", "edgeinfer", "hil", "--endpoint", at(link.rt_addr, 0), "--log",
            str(schunk_dir / "measurement_1"), "--rtt-before", "100", "--out", str(out), "--curve-dir", str(keys),
            "--handshake-timeout-s", "240"]), stdout=hil_log.open("w"), stderr=subprocess.STDOUT)
        if cut_after_s is not None:
            limit = time.monotonic() + 300
            while "started" not in serve_log.read_text() and hil.poll() is None and time.monotonic() < limit:
                time.sleep(0.05)
            time.sleep(cut_after_s)
            link.cut()
        rc = hil.wait(timeout=400)
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
    text = hil_log.read_text()
    assert rc == 0, text[-3000:] + serve_log.read_text()[-2000:]
    return json.loads((out / "report.json").read_text())


def check_counts(r):
    """Every observation sent got a command (a held one counts), all finite and inside the limits."""
    n = r["observations_sent"]
    assert n == 937  # measurement_1: 3.75 s at 250 Hz
    assert sum(r["outcomes"].values()) == n  # every tick has an outcome (a held one counts)
    # a command for every tick, but for those a host stall made the control loop skip (overruns, "lost"):
    # a 100 ms stall is 25 ticks at 250 Hz
    assert n - 25 <= r["commands_received"] <= n and r["outcomes"]["lost"] <= 25
    assert r["safety"]["nonfinite"] == 0 and r["safety"]["outside_position_limits"] == 0
    assert r["process_exit_codes"] == {"control": 0}
    assert r["network"]["n"] > 50 and r["hil"]["obs_to_chunk_n"] > 0


def test_hil_over_a_veth_link_cut_mid_run(link, keys, schunk_dir, tmp_path):
    r = run_hil(link, keys, schunk_dir, tmp_path / "cut", cut_after_s=1.5)
    check_counts(r)
    control = r["node_stats"]["control"]["counters"]
    # served before the cut; after it, the lost runtime is detected and every later tick holds
    assert r["outcomes"]["on_time"] > 50
    assert control["runtime_lost"] >= 1
    # at least the last ~1 s of the 3.7 s log; the control loop also counts the pre-roll's holds, and a loaded
    # host may let it tick past the last row before the Stop reaches it (held: the runtime is gone): up to a
    # 100 ms stall's 25 ticks (6 seen under two burners, a training run and a breaker)
    held = r["outcomes"]["hold"] + r["start_up"]["outcomes"]["hold"]
    assert held <= control["holds"] <= held + 25
    assert r["outcomes"]["hold"] > 200
    # the network figures stay separate from the inference: probes lost after the cut are counted, not timed
    assert r["network"]["during"]["lost"] >= 1
    assert r["hil"]["network_median_ms"] == r["network"]["round_trip_ms"]["p50"]


def test_hil_over_a_shaped_link(link, keys, schunk_dir, tmp_path):
    why = link.shape(delay_ms=1.0, jitter_ms=0.2, loss_pct=0.1)
    if why:
        pytest.skip(why)
    r = run_hil(link, keys, schunk_dir, tmp_path / "shaped")
    check_counts(r)
    # netem delays each direction by 1 ms (+- 0.2 ms): the round trip is at least ~2 ms, and the latency
    # minus the network median is what the runtime and the control loop added
    assert r["network"]["round_trip_ms"]["p50"] >= 1.6
    assert r["hil"]["obs_to_chunk_ms"]["p50"] >= r["network"]["round_trip_ms"]["p50"]
    assert r["hil"]["obs_to_chunk_minus_network_ms"]["p50"] >= 0
