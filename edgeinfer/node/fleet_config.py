"""The fleet runtime's configuration (`edgeinfer fleet`): one runtime process serving many robots
(edgeinfer/node/fleet_node.py; the protocol: Join -> Admission, Observations -> ActionChunks, Stop)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from edgeinfer.core.fleet_batching import FleetPolicy
from edgeinfer.core.transport import is_loopback
from edgeinfer.engines.models.drafters import DRAFTERS
from edgeinfer.engines.models.paths import DEFAULT_POLICY

CONTROLLER = "controller"  # the routing id of the peer whose Stop ends the fleet runtime


@dataclass
class FleetConfig:
    """The fleet runtime node: the policy it serves to every robot, its engine, the robots it admits, how it
    schedules their chunks (scheduling: core/fleet_batching.py FleetPolicy), and when it exits."""

    policy: Path = DEFAULT_POLICY  # the policy's manifest JSON (the built-in policy, or a factory one)
    # Run a factory manifest's code (a policy folder with a "factory" is code; like RuntimeConfig's, off by default)
    trust_policy_code: bool = False
    # the target's engine (batching: the batched engine, engines/backends/batched.py, auto = fused; no batching: the
    # single-sequence engine, auto = the fastest exact one here, measured at start-up as `edgeinfer serve` does)
    backend: Literal["auto", "fused", "torch", "onnxruntime"] = "auto"
    drafter: str = "kinematic"  # each robot's drafter (its own instance), by name (engines/models/drafters.py)
    threads: int = 1  # intra-op threads of the engine
    n_slots: int = 32  # the most robots served at once (KV-cache slots of the batched engine)
    endpoint: str = "tcp://127.0.0.1:5590"  # the ROUTER the robots' DEALERs connect to (loopback only)
    robot_lease_ms: float = 500.0  # a robot unheard for this long is dropped (robot_lost) and its slot freed, ms
    # exit when no robot is admitted and no message arrived for this long (also from the start), s
    idle_timeout_s: float = 30.0
    warmup: bool = True  # measure the engine (pass costs at every batch size, or warm-up chunks) before serving
    report: Path | None = None  # write the run's report (JSON) here at exit; None: only the summary line
    runtime_cpus: list[int] | None = None  # CPUs the runtime may use (None: any)
    scheduling: FleetPolicy = field(default_factory=FleetPolicy)  # batching, order, k, deadline cuts, admission

    def __post_init__(self):
        self.policy = Path(self.policy)
        self.report = Path(self.report) if self.report is not None else None
        if self.drafter not in DRAFTERS:
            raise ValueError(f"FleetConfig.drafter must be one of {sorted(DRAFTERS)}, got {self.drafter!r}")
        if self.threads < 1:
            raise ValueError(f"FleetConfig.threads must be >= 1, got {self.threads}")
        if not 1 <= self.n_slots <= 1024:
            raise ValueError(f"FleetConfig.n_slots must be in 1..1024, got {self.n_slots}")
        if not is_loopback(self.endpoint):
            raise ValueError(f"FleetConfig.endpoint must be loopback (tcp://127.0.0.1:PORT, ipc://...), got "
                             f"{self.endpoint!r}: a fleet over several hosts is not served here (docs/fleet.md)")
        if not self.robot_lease_ms > 0:
            raise ValueError(f"FleetConfig.robot_lease_ms must be > 0, got {self.robot_lease_ms}")
        if not self.idle_timeout_s > 0:
            raise ValueError(f"FleetConfig.idle_timeout_s must be > 0, got {self.idle_timeout_s}")
