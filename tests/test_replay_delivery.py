"""The replayer never loses an observation silently at any time scale: at --as-fast-as-possible and at
--time-scale 20 (a 200 us period, the replayer at real-time priority on the control loop's CPU), every
observation it sent reaches the runtime and the control loop (their Stats' "observations" counters), and
report.json says so (report["observations"]: sent, refused_full_queue, delivered, dropped). Real processes and
sockets, the embedded default log."""
import pytest
from rich.console import Console

from edgeinfer.control.loop import ControlConfig
from edgeinfer.sim.replay import replay
from edgeinfer.sim.run_config import ReplayConfig


@pytest.mark.parametrize("pacing", [{"as_fast_as_possible": True}, {"time_scale": 20.0}], ids=["afap", "x20"])
def test_every_observation_sent_is_delivered_and_counted(tmp_path, pacing):
    cfg = ReplayConfig(out=tmp_path, plots=False, host_baseline_s=0.0, duration_s=1.5, fork_nodes=True,
                       control=ControlConfig(phase_ms=0.05), **pacing)
    obs = replay(cfg, Console(quiet=True))["observations"]
    assert obs["sent"] >= 375 + 40  # 1.5 s of rows at 250 Hz, and the pre-roll (200 ms)
    assert obs["refused_full_queue"] == 0
    assert obs["delivered"] == {"control": obs["sent"], "runtime": obs["sent"]}
    assert obs["dropped"] == {"control": 0, "runtime": 0}
