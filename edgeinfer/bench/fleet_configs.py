"""The ways `edgeinfer bench fleet` serves a fleet (bench/fleet_capacity.py's module docstring and docs/fleet.md
describe them): each a label, whether each robot gets its own runtime process, the FleetPolicy fields it sets, and
whether the runtime runs once per core."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Configuration:
    """One way of serving the fleet: its label, whether each robot gets its own runtime process, and the
    FleetPolicy fields (edgeinfer/core/fleet_batching.py) it sets over the defaults."""

    label: str
    process_per_robot: bool
    policy: dict
    per_core: bool = False  # one runtime per CPU core of this machine, the robots spread over them (robot i on i % n)


CONFIGURATIONS = {
    "a": Configuration("one runtime process per robot", True, {"batching": False}),
    "b": Configuration("one runtime, robots one after another", False,
                       {"batching": False, "order": "arrival", "admission": False}),
    "c": Configuration("batching in arrival order, no deadlines", False,
                       {"batching": True, "order": "arrival", "adaptive_k": False, "k": 0, "deadline_cut": False,
                        "admission": False}),
    "d": Configuration("edgeinfer fleet", False, {}),
    "e": Configuration("edgeinfer fleet, one runtime per core", False, {}, per_core=True),
}
