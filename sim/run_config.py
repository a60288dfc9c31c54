"""What a replay and a hardware-in-the-loop run are configured with: the robot side's settings both share
(SessionConfig: which log and how it is read, the pacing, the control loop, network faults, outputs), and
ReplayConfig, which adds the runtime it starts and the fault drills on it. HilConfig (sim/hil.py) adds the
remote runtime's endpoint and the network probes.

The shared groups are base classes with keyword-only fields, so a run's options stay flat: `--time-scale`,
`time_scale = 2.0` in a launch file's [replay] or [hil] table, `cfg.time_scale`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from edgeinfer.control.loop import ControlConfig
from edgeinfer.logs.options import ReaderOptions
from edgeinfer.node.runtime import RuntimeConfig
from edgeinfer.sim.network_faults import NetworkFaultConfig


@dataclass(kw_only=True)
class LogSourceConfig(ReaderOptions):
    """The recorded log replayed and how it is read: the reader options every command that reads logs shares
    (edgeinfer/logs/options.py), plus the LeRobot episode and the extra channels the replay sends."""

    # The log: a Schunk directory, CSV, MCAP, rosbag2/ROS 1 bag or LeRobot dataset (None: the embedded
    # synthetic log, fresh clones).
    log: Path | None = None
    # The log's format (None: detected from the path).
    log_format: Literal["schunk", "csv", "mcap", "rosbag2", "rosbag1", "lerobot"] | None = None
    episode: int | None = None  # reader option: the LeRobot episode replayed
    # reader option: other channels sent with the joints (Observation.extra), "NAME=SOURCE,...": SOURCE is
    # "TOPIC:FIELD|FIELD" for MCAP and bags (e.g. "imu.ang_vel=/imu:angular_velocity,imu.gravity=/imu:gravity(
    # orientation)"), a feature for LeRobot, a column pattern for CSV; docs/log-formats.md
    extra: str | None = None
    duration_s: float | None = None  # replay only the start of the log, this many seconds of recorded time (None: all)
    # A gap in the log longer than this is replayed as this long, s (the ticks after it move earlier; the report
    # says how much was cut): a real export with hours between two sessions replays in seconds, not hours.
    max_gap_s: float = 2.0

    READER_OPTIONS = (*ReaderOptions.READER_OPTIONS, "episode", "extra")

    def __post_init__(self):
        super().__post_init__()
        self.log = Path(self.log) if self.log is not None else None
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"{type(self).__name__}.duration_s must be > 0, got {self.duration_s}")
        if not 0 < self.max_gap_s <= 3600:
            raise ValueError(f"{type(self).__name__}.max_gap_s must be in (0, 3600], got {self.max_gap_s}")


@dataclass(kw_only=True)
class PacingConfig:
    """When the replayer sends each observation and how long it waits for the others."""

    # Replay speed, 0.1..20 (2.0 = twice as fast: the control loop runs at the scaled rate too).
    time_scale: float = 1.0
    as_fast_as_possible: bool = False  # publish each observation right after the previous one (no schedule)
    # After a stall, send the rows whose time passed in a burst (false: skip them, counted).
    catch_up: bool = False
    deadline_ms: float | None = None  # per-tick command deadline, ms (None: one control period of the log, time-scaled)
    settle_ms: float = 200.0  # wait for the last commands and chunks after the last observation, ms
    # How long the runtime and control nodes may take to start and answer the handshake, s. One default for
    # every command (serve, launch, replay, hil): an engine's warm-up on a slow host must not fail a run.
    handshake_timeout_s: float = 300.0
    # SCHED_FIFO priority of the replayer (best effort; 0 = off). Above the control loop's 60: the replayer
    # stands in for the sensor hardware, whose timing the system under test must not be able to delay.
    replayer_priority: int = 70
    # State streamed before the log's first row, ms: the arm at rest at the log's first position, as a robot's
    # state stream runs before control engages. Its ticks are start-up (report.json start_up), not in the
    # headline figures. The default is ten default budgets (the first chunk arrives after about one); 0 counts
    # start-up in the headline.
    pre_roll_ms: float = 200.0

    def __post_init__(self):
        name = type(self).__name__
        if not 0.1 <= self.time_scale <= 20:
            raise ValueError(f"{name}.time_scale must be in [0.1, 20], got {self.time_scale}")
        if self.deadline_ms is not None and not 0 < self.deadline_ms <= 60_000:  # beyond a minute: a typo
            raise ValueError(f"{name}.deadline_ms must be in (0, 60000], got {self.deadline_ms}")
        if not 0 < self.settle_ms <= 60_000:
            raise ValueError(f"{name}.settle_ms must be in (0, 60000], got {self.settle_ms}")
        if not self.handshake_timeout_s > 0:
            raise ValueError(f"{name}.handshake_timeout_s must be > 0, got {self.handshake_timeout_s}")
        if not 0 <= self.replayer_priority <= 99:
            raise ValueError(f"{name}.replayer_priority must be in 0..99, got {self.replayer_priority}")
        if not 0 <= self.pre_roll_ms <= 60_000:
            raise ValueError(f"{name}.pre_roll_ms must be in [0, 60000], got {self.pre_roll_ms}")


@dataclass(kw_only=True)
class SessionConfig(PacingConfig, LogSourceConfig):
    """The robot side of a run, replay or hardware in the loop: log, pacing, control loop, faults, outputs."""

    out: Path = Path("out")  # output folder: report.json, ticks.csv, plots, node logs
    # Service-level objective judged with confidence bounds, e.g. "p99<=5ms,miss<=0.1%" (see sim/slo.py).
    slo: str | None = None
    control: ControlConfig = field(default_factory=ControlConfig)  # the control loop node
    faults: NetworkFaultConfig = field(default_factory=NetworkFaultConfig)  # faults on the observation stream
    # Print the process graph this run would start, as a launch file, and exit: nothing is started.
    dry_run: bool = False
    # Wake-up latency baseline measured before the run, s (sim/host.py: sleeps to absolute deadlines at the
    # control period, at the replayer's priority and CPU; 0 = none). In report.json's host section.
    host_baseline_s: float = 0.5
    # Write run.mcap after the run (sim/run_mcap.py: observations, chunks, commands, ticks; opens in Foxglove).
    run_mcap: bool = True

    def __post_init__(self):
        LogSourceConfig.__post_init__(self)
        PacingConfig.__post_init__(self)
        self.out = Path(self.out)
        if not 0 <= self.host_baseline_s <= 60:
            raise ValueError(f"{type(self).__name__}.host_baseline_s must be in [0, 60], got {self.host_baseline_s}")
        if self.slo is not None:
            from edgeinfer.sim.slo import parse_slo

            parse_slo(self.slo)  # raises SLOError (a ValueError) naming the bad term


@dataclass(kw_only=True)
class ReplayConfig(SessionConfig):
    """One replay through a runtime and a control node started here (sim/replay.py). The fault drills on the
    runtime (SIGKILL, SIGSTOP/SIGCONT, garbage) are run by sim/supervisor.py."""

    kill_runtime_at_tick: int | None = None  # fault drill: SIGKILL the runtime when this row is sent
    restart_runtime_after_ms: float | None = None  # with kill_runtime_at_tick: start a new runtime this long after, ms
    stall_runtime_at_tick: int | None = None  # fault drill: SIGSTOP the runtime when this row is sent
    stall_runtime_ms: float | None = None  # with stall_runtime_at_tick: SIGCONT it this long after, ms (default 20)
    garbage_per_row: int = 0  # fault drill: malformed messages (sim/supervisor.GARBAGE_KINDS) after each row
    # Pin the replayer and control loop to CPU 0, the runtime to the others. Only when there are >= 2 and the
    # runtime/control CPU options are unset; real-time wake-ups then never preempt a decode.
    pin_cpus: bool = True
    # Start the runtime and control nodes as forks of a server that imported edgeinfer once (procs/forkserver.py).
    # Seconds less per replay than fresh interpreters when one process replays many times (the bench).
    fork_nodes: bool = False
    plots: bool = True  # write the plots.PLOT_FILES PNGs (matplotlib: about 2 s per replay on a 2-core CPU)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)  # the runtime node

    def __post_init__(self):
        super().__post_init__()
        if self.kill_runtime_at_tick is not None and self.kill_runtime_at_tick < 0:
            raise ValueError(f"ReplayConfig.kill_runtime_at_tick must be >= 0, got {self.kill_runtime_at_tick}")
        if self.restart_runtime_after_ms is not None and (self.kill_runtime_at_tick is None
                                                          or not self.restart_runtime_after_ms >= 0):
            raise ValueError("ReplayConfig.restart_runtime_after_ms needs ReplayConfig.kill_runtime_at_tick and must "
                             f"be >= 0, got {self.restart_runtime_after_ms}")
        if self.stall_runtime_at_tick is not None and self.stall_runtime_at_tick < 0:
            raise ValueError(f"ReplayConfig.stall_runtime_at_tick must be >= 0, got {self.stall_runtime_at_tick}")
        if self.stall_runtime_ms is not None and self.stall_runtime_at_tick is None:
            raise ValueError(f"ReplayConfig.stall_runtime_ms needs stall_runtime_at_tick, got {self.stall_runtime_ms}")
        if self.stall_runtime_at_tick is not None and self.stall_runtime_ms is None:
            self.stall_runtime_ms = 20.0
        if self.stall_runtime_ms is not None and not 0 < self.stall_runtime_ms <= 60_000:
            raise ValueError(f"ReplayConfig.stall_runtime_ms must be in (0, 60000], got {self.stall_runtime_ms}")
        if not 0 <= self.garbage_per_row <= 100:
            raise ValueError(f"ReplayConfig.garbage_per_row must be in 0..100, got {self.garbage_per_row}")
