"""End to end through the CLI: a slice of the real measurement_1 written as an MCAP file by mcap's own ROS 2
writer, replayed through the real runtime and control processes with network faults injected; the report says
what was read and what was injected, and the nodes survive the malformed frames."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edgeinfer.logs.arm_log import ArmLog, read_schunk
from edgeinfer.sim.network_faults import FaultInjector, NetworkFaultConfig

pytest.importorskip("mcap_ros2")
pytestmark = pytest.mark.slow


def test_cli_replays_an_mcap_log_with_faults(schunk_dir, tmp_path):
    from test_readers_formats import write_mcap_ros2

    full = read_schunk(schunk_dir / "measurement_1")
    n = 500  # 2 s
    log = ArmLog("slice", full.t_s[:n], full.q_rad[:n], full.qd_rad_s[:n])
    path = write_mcap_ros2(log, tmp_path / "measurement_1_slice.mcap")
    faults = ["--drop-rate", "0.05", "--duplicate-rate", "0.05", "--malformed-rate", "0.02", "--reorder-rate", "0.02",
              "--delay-ms", "exp:1", "--delay-rate", "0.1", "--fault-seed", "3"]
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "edgeinfer", "replay", "--log", str(path), "--decode", "target-only",
                           "--out", str(out), *faults], capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["log"] == "measurement_1_slice" and report["observations_sent"] == n
    assert report["process_exit_codes"] == {"runtime": 0, "control": 0}  # garbage frames did not kill a node
    r = report["replayer"]
    assert r["log_source"] == {"format": "mcap", "reordered_records": 0, "qd_from_differences": False,
                               "q_from_integration": False, "truncated_at": None,
                               "gaps": {"count": 0, "empty_ticks": 0, "longest_s": 0.0, "rows": [], "min_periods": 3},
                               "rows_skipped": 0, "rows_filled": 0,
                               "gaps_shortened": {"count": 0, "ticks_removed": 0, "rows": [], "max_gap_s": 2.0}}
    assert r["send_error_us"]["n"] == r["rows_sent"] and r["rows_sent"] + r["rows_skipped"] == n
    f = r["faults"]
    assert f["seed"] == 3 and f["config"]["delay_ms"] == "exp:1"
    # the fates are a function of the seed and the row: replaying the draws offline gives the same rows
    # (minus any row the replayer skipped after a stall on this shared machine)
    inj = FaultInjector(NetworkFaultConfig(drop_rate=0.05, duplicate_rate=0.05, malformed_rate=0.02,
                                           reorder_rate=0.02, delay_ms="exp:1", delay_rate=0.1, fault_seed=3))
    fates = [inj.decide(i) for i in range(n)]
    for kind in ("dropped", "malformed"):
        expected = {i for i, fate in enumerate(fates) if fate[0] == kind}
        assert set(f["rows"].get(kind, [])) <= expected
        assert len(expected) - r["rows_skipped"] <= f["counts"][kind] <= len(expected)
    assert f["counts"]["malformed"] > 0 and f["counts"]["dropped"] > 0 and f["counts"]["delayed"] > 0
