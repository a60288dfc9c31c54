"""The embeddable Controller on a real Schunk recording: every tick gets a finite, limited command at once."""
import numpy as np
import pytest

from edgeinfer.core.clock import Ticker, now_ns
from edgeinfer.core.wire import Observation
from edgeinfer.logs.arm_log import read_schunk
from edgeinfer.node.controller import Controller, ControllerConfig
from edgeinfer.node.runtime import RuntimeConfig


def _run(log, n_ticks: int, cfg: ControllerConfig):
    """Drive the controller at the log's rate on absolute deadlines (a tick the loop overran is skipped, as on a
    robot); returns (tick numbers, commands, stats)."""
    ticks, commands = [], []
    with Controller(cfg) as ctl:
        ticker = Ticker(now_ns() + 5_000_000, log.period_ns, 200_000)
        while (n := ticker.wait()) < n_ticks:
            prev = max(0, n - 5)
            obs = Observation(n, ticker.tick_time_ns(n), log.q_rad[n], log.qd_rad_s[n], log.q_rad[prev])
            ticks.append(n)
            commands.append(ctl.step(ticker.tick_time_ns(n), obs))
        stats = ctl.stats
    return np.array(ticks), commands, stats


def test_controller_commands_every_tick_and_tracks_the_recording(schunk_dir):
    log = read_schunk(schunk_dir / "measurement_1")
    cfg = ControllerConfig(RuntimeConfig(warmup_chunks=10), period_ms=log.period_ns / 1e6)
    ticks, commands, stats = _run(log, 500, cfg)  # 2 s at 250 Hz
    assert stats.ticks == len(commands) >= 250  # every call got its command (a loaded machine skips some ticks)
    q = np.array([c.q_rad for c in commands])
    assert np.all(np.isfinite(q))
    assert np.all(q >= np.array(cfg.limits.q_min_rad)) and np.all(q <= np.array(cfg.limits.q_max_rad))
    # rate limit between consecutive commands (consecutive calls, one period apart for the controller)
    assert np.all(np.abs(np.diff(q, axis=0)) <= cfg.limits.qd_max_rad_s * cfg.period_ms / 1e3 + 1e-12)
    assert stats.chunks >= 10 and stats.decoder_errors == 0  # one per 5 ticks asked for; a slow CPU decodes fewer
    served = np.array([c.rung != "hold" for c in commands])
    assert served[ticks >= 100].mean() > 0.5  # after the start, chunks cover most ticks (fewer on a slow CPU)
    err = q[served] - log.q_rad[ticks[served]]
    assert np.sqrt(np.mean(err ** 2)) < 0.03  # rad: the policy's targets follow the recorded motion
    assert sum(stats.rungs.values()) == len(commands) and stats.rungs.get("hold", 0) == stats.holds


def test_controller_rejects_an_observation_of_the_wrong_shape():
    with Controller(ControllerConfig(RuntimeConfig(warmup_chunks=1), warmup=False)) as ctl:
        with pytest.raises(ValueError, match="3 joints"):
            ctl.step(now_ns(), Observation(0, now_ns(), np.zeros(3), np.zeros(3), np.zeros(3)))
