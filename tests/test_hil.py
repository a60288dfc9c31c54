"""Hardware in the loop: a real `edgeinfer serve` process stands in for the remote runtime (on loopback ports, as
the port map asks of another host), and `edgeinfer hil` replays a real Schunk recording against it."""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from ports import free_port_block

from edgeinfer.sim.hil import PORT_MAP, HilConfig, hil_endpoints, hil_serve_command, parse_endpoint


def test_endpoint_maps_to_a_port_block():
    cfg = HilConfig(endpoint="tcp://127.0.0.1:40000")
    ep, echo, robot = hil_endpoints(cfg)
    assert robot == "127.0.0.1"  # the address that routes to the runtime host
    assert (ep.chunks, echo) == ("tcp://127.0.0.1:40000", "tcp://127.0.0.1:40001")
    assert (ep.obs, ep.ready, ep.status, ep.commands) == tuple(
        f"tcp://127.0.0.1:{40000 + PORT_MAP[k]}" for k in ("obs", "ready", "status", "commands"))
    line = hil_serve_command(cfg, "192.168.1.7")
    assert "--chunks tcp://0.0.0.0:40000 --echo-endpoint tcp://0.0.0.0:40001 --obs tcp://192.168.1.7:40002" in line
    for bad in ("udp://h:1", "tcp://h", "tcp://:5", "tcp://h:65533"):
        with pytest.raises(ValueError, match="endpoint"):
            parse_endpoint(bad)


@pytest.mark.slow
def test_hil_against_a_served_runtime(schunk_dir, tmp_path):
    port = free_port_block(len(PORT_MAP))
    at = lambda k: f"tcp://127.0.0.1:{port + PORT_MAP[k]}"  # noqa: E731
    serve = subprocess.Popen([sys.executable, "-m", "edgeinfer", "serve", "--chunks", at("chunks"), "--echo-endpoint",
                              at("echo"), "--obs", at("obs"), "--ready", at("ready"), "--status", at("status"),
                              "--commands", at("commands")],
                             stdout=(tmp_path / "serve.log").open("w"), stderr=subprocess.STDOUT,
                             start_new_session=True)
    out = tmp_path / "hil"
    try:
        proc = subprocess.run([sys.executable, "-m", "edgeinfer", "hil", "--endpoint", f"tcp://127.0.0.1:{port}",
                               "--log", str(schunk_dir / "measurement_1"), "--duration-s", "2", "--rtt-before", "100",
                               "--out", str(out), "--handshake-timeout-s", "240"],
                              capture_output=True, text=True, timeout=400)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert serve.wait(timeout=30) == 0  # the runtime served the run and exited on the Stop
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
    r = json.loads((out / "report.json").read_text())

    net = r["network"]
    assert net["before"]["n"] + net["before"]["lost"] == 100
    assert net["during"]["n"] > 10  # one probe every 20 ms for 2 s of replay
    assert net["n"] == net["before"]["n"] + net["during"]["n"]
    # a probe not echoed within rtt_timeout_ms (1 s) is lost and counted; a host that stalls loses the odd one
    assert net["lost"] == net["before"]["lost"] + net["during"]["lost"] <= 2
    rtt = net["round_trip_ms"]
    assert 0 < rtt["p50"] <= rtt["p99"] <= rtt["max"]
    lo, hi = net["round_trip_ci95_ms"]["p50"]
    assert lo <= rtt["p50"] <= hi
    assert len(np.load(out / "rtt_during.npy")) == net["during"]["n"] + net["during"]["lost"]

    # observation sent -> a command planned from it, and -> its chunk: both legs of the network and more
    hil = r["hil"]
    assert hil["network_median_ms"] == rtt["p50"]
    for name in ("obs_to_command", "obs_to_chunk"):
        assert hil[f"{name}_n"] > 0
        assert hil[f"{name}_ms"]["p50"] >= rtt["p50"]
        assert hil[f"{name}_minus_network_ms"]["p50"] == pytest.approx(hil[f"{name}_ms"]["p50"] - rtt["p50"])
    # no figure mixes the runtime's clock with ours
    assert "receive+plan+decode" not in r["stages_ms"] and "publish" not in r["stages_ms"]
    assert "time_to_chunk" not in r["node_stats"].get("runtime", {}).get("latency_us", {})

    # counts add up, every command finite and inside the limits
    n = r["observations_sent"]
    assert n == 500  # 2 s at 250 Hz
    assert sum(r["outcomes"].values()) == n
    assert r["deadline_misses"] == n - r["outcomes"]["on_time"]
    assert sum(r["fallbacks"].values()) == r["commands_received"] > 0
    # the safety check covers every command the arm got, the pre-roll's too
    assert r["safety"]["commands_checked"] == r["commands_received"] + r["start_up"]["commands_received"]
    assert r["safety"]["nonfinite"] == 0 and r["safety"]["outside_position_limits"] == 0
    assert r["decode"] == "remote" and r["process_exit_codes"] == {"control": 0}
    for png in ("latency_histogram.png", "latency.png", "stages.png"):
        assert (out / png).stat().st_size > 5_000
