"""What is checked before a replay (or a hardware-in-the-loop run) starts any process: that the policy the
runtime will serve can run on the log, and that the run's settings can work on it."""
from __future__ import annotations

import json

from edgeinfer.logs.arm_log import ArmLog, LogError
from edgeinfer.node.runtime import RuntimeConfig
from edgeinfer.sim.config import ReplayConfig


def policy_shape(runtime: RuntimeConfig, log: ArmLog) -> dict:
    """n_joints, stride_ticks (control ticks per chunk step), horizon (chunk steps after the anchor) and
    control_rate_hz (None: any) of the policy the runtime will serve: the action-token policy's manifest, or a
    bring-your-own spec (one step per period)."""
    if runtime.byo_spec is not None:
        from edgeinfer.engines.byo import ByoSpec

        spec = ByoSpec.load(runtime.byo_spec, model=runtime.byo_model)
        return {"n_joints": spec.n_joints, "stride_ticks": max(1, round(log.rate_hz / spec.rate_hz)), "horizon": 1,
                "control_rate_hz": None}
    manifest = json.loads(runtime.policy.read_text())
    return {"n_joints": manifest["config"]["n_joints"], "stride_ticks": manifest["config"]["stride_ticks"],
            "horizon": manifest["config"]["horizon"], "control_rate_hz": manifest.get("control_rate_hz")}


def check_run_fits(log: ArmLog, policy: dict, cfg: ReplayConfig, deadline_ms: float) -> None:
    """Raise LogError when the policy (see policy_shape) cannot run on this log (joint count, control rate),
    ValueError when the control settings cannot (limits for another joint count, a phase past the deadline)
    or a runtime kill or stall is asked for at a row the log does not reach."""
    if log.n_joints != policy["n_joints"]:
        raise LogError(f"{log.name}: log has {log.n_joints} joints, the policy expects {policy['n_joints']}")
    rate = policy["control_rate_hz"]
    if rate is not None and abs(log.rate_hz - rate) > 0.01 * rate:
        raise LogError(f"{log.name}: log rate {log.rate_hz:.1f} Hz, the policy was trained at {rate:.1f} Hz "
                       f"(its chunk step is {policy['stride_ticks']} ticks)")
    n_limits = {len(cfg.control.limits.q_min_rad), len(cfg.control.limits.q_max_rad)}
    if n_limits != {log.n_joints}:
        raise ValueError(f"SafetyLimits: q_min_rad/q_max_rad have {sorted(n_limits)} entries, the log has "
                         f"{log.n_joints} joints")
    if cfg.control.phase_ms >= deadline_ms:
        raise ValueError(f"ControlConfig.phase_ms={cfg.control.phase_ms} is not before the {deadline_ms} ms "
                         "deadline: every command would be late")
    for name in ("kill_runtime_at_tick", "stall_runtime_at_tick"):  # a fault asked for must happen
        if (row := getattr(cfg, name)) is not None and row >= len(log):
            raise ValueError(f"ReplayConfig.{name}={row} is past the last row of {log.name} ({len(log)} rows"
                             f"{' after --duration-s' if cfg.duration_s is not None else ''}): the fault would "
                             "never be injected")
