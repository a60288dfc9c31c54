"""What is checked before a replay (or a hardware-in-the-loop run) starts any process: that the policy the
runtime will serve can run on the log, and that the run's settings can work on it; and what a run takes from the
policy's manifest when it is not told otherwise.

From the manifest (written by `edgeinfer train`; the shipped Schunk manifest has neither key):
    "data"    the log is read with the options the policy was trained with (reader options given here win,
              key by key) when it has the training data's format; when it IS the training dataset (the same
              resolved path) split by episode, and no episode is given, the first held-out episode is replayed
    "limits"  the joint limits fitted on the training data (control/limits.py: below given values and --urdf)
Both show in report.json: "policy_defaults" (what was taken) and "limits" (values and the source of each).
"""
from __future__ import annotations

import os
import shlex
from pathlib import Path

from rich.console import Console

from edgeinfer.control.limits import JointCountError, ResolvedLimits, resolve_limits
from edgeinfer.core.progress import say
from edgeinfer.engines.models.paths import read_manifest, trained_policy_path
from edgeinfer.logs import detect_format
from edgeinfer.logs.arm_log import ArmLog, LogError
from edgeinfer.logs.options import ReaderOptions
from edgeinfer.node.runtime import RuntimeConfig
from edgeinfer.sim.run_config import ReplayConfig


def policy_manifest(runtime: RuntimeConfig) -> dict | None:
    """The manifest JSON of the action-token policy the runtime serves (None: a bring-your-own spec). Raises
    ValueError naming the file when it is not JSON."""
    if runtime.byo_spec is not None:
        return None
    return read_manifest(runtime.policy)


def policy_shape(runtime: RuntimeConfig, log: ArmLog) -> dict:
    """n_joints, stride_ticks (control ticks per chunk step), horizon (chunk steps after the anchor),
    control_rate_hz (None: any), joint_names (None: unknown), limits (the manifest's "limits", or None) and
    manifest (its path, None for a spec) of the policy the runtime will serve: the action-token policy's
    manifest, or a bring-your-own spec (one step per period). Raises ObservationMismatch (a ValueError) naming
    the spec's field, the channel and the log when the log lacks an extra channel the spec reads."""
    if runtime.byo_spec is not None:
        from edgeinfer.engines.models.byo import ByoSpec

        spec = ByoSpec.load(runtime.byo_spec, model=runtime.byo_model)
        spec.check_channels({k: v.shape[1] for k, v in log.extra.items()}, f"the log {log.name}")
        return {"n_joints": spec.n_joints, "stride_ticks": max(1, round(log.rate_hz / spec.rate_hz)), "horizon": 1,
                "control_rate_hz": None, "joint_names": None, "limits": None, "manifest": None}
    manifest = policy_manifest(runtime)
    data = manifest.get("data") or {}
    config = manifest.get("config")
    missing = [k for k in ("n_joints", "stride_ticks", "horizon") if not isinstance(config, dict) or k not in config]
    if missing:
        raise ValueError(f"{runtime.policy}: the manifest's \"config\" lacks {missing} (a policy manifest names its "
                         "joint count, chunk stride and horizon there: docs/byo-policy.md)")
    return {"n_joints": config["n_joints"], "stride_ticks": config["stride_ticks"], "horizon": config["horizon"],
            "control_rate_hz": manifest.get("control_rate_hz", data.get("rate_hz")),
            "joint_names": data.get("joint_names"), "limits": manifest.get("limits"), "manifest": str(runtime.policy)}


def log_defaults(cfg: ReplayConfig, console: Console | None = None) -> tuple[dict, dict | None]:
    """The reader options the log is read with, and report.json's "policy_defaults" section (None: the
    manifest has no "data", or there is no log): cfg's reader options over the manifest's "data.reader_options"
    when the log has the training data's format, plus the first held-out episode when the log is the training
    dataset itself (see the module docstring). Says on `console` what it took. Raises LogError for a log path
    that matches no format."""
    given = cfg.reader_options()
    manifest = policy_manifest(cfg.runtime)
    data = manifest.get("data") if manifest is not None else None
    if cfg.log is None or not isinstance(data, dict):
        return given, None
    section = {"manifest": str(cfg.runtime.policy), "taken": {}, "not_taken": None, "episode_why": None}
    fmt = cfg.log_format or detect_format(cfg.log)
    if fmt != data.get("format"):
        section["not_taken"] = f"the log is {fmt}, the policy was trained on {data.get('format')}"
        return given, section
    split = data.get("split") or {}
    by_episode = split.get("by") == "episode"  # the episodes are the split's units, not a reader option
    taken = {k: v for k, v in (data.get("reader_options") or {}).items()
             if v is not None and k not in given and not (by_episode and k == "episode")}
    source = data.get("source_resolved") or data.get("source")  # as given: relative to where training ran
    if ("episode" not in given and by_episode and split.get("held_out") and source is not None
            and Path(source).resolve() == Path(cfg.log).resolve()):
        taken["episode"] = int(split["held_out"][0])
        section["episode_why"] = "the log is the policy's training dataset: its first held-out episode"
    section["taken"] = taken
    if console is not None and taken:
        say(console, f"policy defaults from {cfg.runtime.policy}: {', '.join(f'{k}={v}' for k, v in taken.items())}"
            + (f" ({section['episode_why']}; --episode N for another)" if section["episode_why"] else ""))
    return taken | given, section


def check_run_fits(log: ArmLog, policy: dict, cfg: ReplayConfig, deadline_ms: float) -> ResolvedLimits:
    """The joint limits the run uses (control/limits.resolve_limits: cfg.control.limits's fields, its URDF, the
    manifest's "limits", the defaults), once the run is checked. Raises LogError when the log, the policy (see
    policy_shape) and the limits do not have one joint count (JointCountError: one error naming all three and
    where each comes from) or the log's rate is not the policy's; ValueError (UrdfError, LimitsError) when the
    limits cannot be resolved, the phase is past the deadline, a CPU pin names a CPU this process may not run on,
    or a runtime kill or stall is asked for at a row the log does not reach."""
    names, names_from = ((log.joint_names, f"the log {log.name}") if log.joint_names is not None
                         else (policy["joint_names"], f"the policy {policy['manifest']}"))
    policy_where = f"{policy['manifest']} config.n_joints" if policy["manifest"] else f"spec {cfg.runtime.byo_spec}"
    try:
        limits = resolve_limits(cfg.control.limits, names, names_from, policy["limits"],
                                policy["manifest"] or "the policy",
                                counts={"the log": (log.n_joints, f"{log.name}, its joint positions"),
                                        "the policy": (policy["n_joints"], policy_where)})
    except JointCountError as e:
        if log.n_joints == policy["n_joints"]:
            raise  # the limits alone differ: the error says which option fixes them
        raise JointCountError(f"{e} - the policy is for another robot: {train_hint(cfg)}") from None
    rate = policy["control_rate_hz"]
    if rate is not None and abs(log.rate_hz - rate) > 0.01 * rate:
        raise LogError(f"{log.name}: log rate {log.rate_hz:.1f} Hz, the policy was trained at {rate:.1f} Hz "
                       f"(its chunk step is {policy['stride_ticks']} ticks) - {train_hint(cfg)}")
    if cfg.control.phase_ms >= deadline_ms:
        raise ValueError(f"ControlConfig.phase_ms={cfg.control.phase_ms} is not before the {deadline_ms} ms "
                         "deadline: every command would be late")
    allowed = sorted(os.sched_getaffinity(0))  # a pin this host cannot give is refused, not run unpinned
    for name, cpus in (("ControlConfig.control_cpus", cfg.control.control_cpus),
                       ("RuntimeConfig.runtime_cpus", cfg.runtime.runtime_cpus)):
        if cpus is not None and not set(cpus) <= set(allowed):
            raise ValueError(f"{name} {cpus}: not among the CPUs this process may run on, {allowed}")
    for name in ("kill_runtime_at_tick", "stall_runtime_at_tick"):  # a fault asked for must happen
        if (row := getattr(cfg, name)) is not None and row >= len(log):
            raise ValueError(f"ReplayConfig.{name}={row} is past the last row of {log.name} ({len(log)} rows"
                             f"{' after --duration-s' if cfg.duration_s is not None else ''}): the fault would "
                             "never be injected")
    return limits


def train_hint(cfg: ReplayConfig) -> str:
    """What to do when the policy cannot run on the log (another joint count or rate): the exact commands that
    train a policy on this log, with the reader options it is read with here, and replay it."""
    out = trained_policy_path(cfg.log) if cfg.log is not None else None
    train = ["edgeinfer", "train", "--data", str(cfg.log) if cfg.log is not None else "LOG"]
    if cfg.log_format is not None:
        train += ["--log-format", cfg.log_format]
    for name, value in cfg.reader_options().items():
        if name in ReaderOptions.READER_OPTIONS:  # training reads joints only: not --episode or --extra
            train += [f"--{name.replace('_', '-')}", str(value)]
    replay = ["edgeinfer", "replay", "--policy", str(out or "OUT.json"), "--log", train[3]]
    if out is not None:
        train += ["--out", str(out)]
    return f"train a policy for this robot: {shlex.join(train)}, then {shlex.join(replay)}"
