"""Bring your own policy: run an ONNX or TorchScript policy (an MLP or a recurrent net) from a TOML spec.

The spec names the model file, the policy rate, how the observation vector is built from the robot state
(ordered fields), and how the raw action becomes joint targets:

    obs    = concat_i((x_i - offset_i) * scale_i)   x_i from the field's source (below)
    target = action.offset + action.scale * raw      (rad)

Sources: q (rad), qd (rad/s), a constant, last_action (the raw policy output of the previous step, zero after a
reset, as in Isaac Lab), channel (an extra channel of the observation, Observation.extra: an IMU's angular
velocity, the gravity direction in the base frame, a velocity command; all of it, or the elements `select`
names), and phase: [sin(2 pi t / T), cos(2 pi t / T)], T = period_s, t = the observation's time since the
episode's first observation (its t_ns; the episode starts at load and at each reset()), the gait clock of
legged policies (unitree_rl_gym, rl_sar). A stateful TorchScript policy keeps its hidden state in module buffers
(Isaac Lab's recurrent export does); `reset()` restores every buffer to its value at load time. Examples:
launch/ur10_reach_policy.toml (an arm), launch/legged_example.toml (IMU, command and phase).
"""
from __future__ import annotations

import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Protocol

import numpy as np
import torch

from edgeinfer.core.clock import now_ns
from edgeinfer.core.config import load, read_toml
from edgeinfer.core.protocols import Runtime
from edgeinfer.core.wire import (
    CHANNEL_NAME,
    MAX_EXTRA,
    MAX_JOINTS,
    ActionChunk,
    Observation,
    ObservationMismatch,
    pack_channels,
)

# where an observation field's x comes from
Source = Literal["q", "qd", "constant", "last_action", "channel", "phase"]
SOURCES = typing.get_args(Source)
_SOURCE_UNITS = {"q": "rad", "qd": "rad/s"}  # what the runtime hands in; constant/last_action units are free text
_FORMAT_OF_SUFFIX = {".onnx": "onnx", ".pt": "torchscript", ".ts": "torchscript"}


class PolicyRunner(Protocol):
    """One model file behind one call. input_width: the input width the file declares, None if it declares none."""

    input_width: int | None

    def reset(self) -> None:
        """Start a new episode (restore any recurrent state)."""

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """obs (1, n_obs) float32 -> raw action (1, n_act) float32."""


class OnnxRunner:
    """onnxruntime on one CPU thread. Stateless: a recurrent ONNX export takes its state as extra inputs,
    which this runner refuses. Raises ValueError (text starting with the spec field) for a model whose
    inputs/outputs do not fit: more than one input, an unknown name, a non-float32 or unfixed-width input."""

    def __init__(self, path: Path, input_name: str | None = None, output_name: str | None = None):
        import onnxruntime as ort  # lazy: only ONNX specs need it

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        inputs = {i.name: i for i in self.session.get_inputs()}
        outputs = [o.name for o in self.session.get_outputs()]
        self.input_name = input_name or next(iter(inputs))
        self.output_name = output_name or outputs[0]
        if self.input_name not in inputs:
            raise ValueError(f"input_name: {self.input_name!r} is not a model input {list(inputs)}")
        if self.output_name not in outputs:
            raise ValueError(f"output_name: {self.output_name!r} is not a model output {outputs}")
        if len(inputs) > 1:
            raise ValueError(f"model: {len(inputs)} inputs {list(inputs)}; only single-input models run here")
        inp = inputs[self.input_name]
        if inp.type != "tensor(float)" or len(inp.shape) != 2 or not isinstance(inp.shape[1], int):
            raise ValueError(f"model: input {inp.name!r} is {inp.type}{inp.shape}; expected float32 (1, n_obs)")
        self.input_width = inp.shape[1]

    def reset(self) -> None:
        pass  # stateless

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        return self.session.run([self.output_name], {self.input_name: obs})[0]


class TorchScriptRunner:
    """A TorchScript module on CPU, eval mode, under inference_mode. Its buffers are snapshotted at load and
    restored by reset(). A TorchScript file declares no input shape, so input_width is None (the spec probes
    the width with a call). Raises ValueError for input_name/output_name (ONNX only) or a non-tensor output."""

    input_width = None

    def __init__(self, path: Path, input_name: str | None = None, output_name: str | None = None):
        if input_name is not None or output_name is not None:
            raise ValueError("input_name/output_name: only for ONNX models (TorchScript takes one positional tensor)")
        self.module = torch.jit.load(str(path), map_location="cpu").eval()
        self._initial = {name: buf.detach().clone() for name, buf in self.module.named_buffers()}

    def reset(self) -> None:
        # inference_mode too: a forward that reassigns a buffer leaves an inference tensor, writable only there
        with torch.inference_mode():
            for name, buf in self.module.named_buffers():
                buf.copy_(self._initial[name])

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            out = self.module(torch.from_numpy(obs))
        if not isinstance(out, torch.Tensor):
            raise ValueError(f"model: forward returned {type(out).__name__}, expected one tensor")
        return out.numpy().copy()  # the caller's own array, even if forward returned a buffer


RUNNERS: dict[str, type] = {"onnx": OnnxRunner, "torchscript": TorchScriptRunner}


@dataclass
class ObsField:
    """One observation field: (x - offset) * scale, x taken from `source`. offset, scale: (width,) float64;
    value: (width,) float64 for source "constant", else None. channel, select: source "channel"'s channel name
    and the (width,) int64 elements taken (None: all of it, `width` values); period_s: source "phase"'s T."""

    name: str
    source: str
    units: str
    width: int
    offset: np.ndarray
    scale: np.ndarray
    value: np.ndarray | None = None
    channel: str | None = None
    select: np.ndarray | None = None
    period_s: float | None = None


@dataclass
class ActionMap:
    """Joint target (rad) = offset + scale * raw_action. offset, scale: (n_joints,) float64."""

    name: str
    units: str
    offset: np.ndarray
    scale: np.ndarray


@dataclass
class ObservationTable:
    """One [[observation]] table of a spec file, as written (ObsField is the checked form)."""

    name: str  # the field's name, for errors and reports
    # where x comes from: q (rad), qd (rad/s), a constant, the last action, an extra channel, the phase clock
    source: Source
    units: str  # x's units: "rad" for q, "rad/s" for qd, free text for the others
    offset: float | list[float] = 0.0  # subtracted from x: one number for every entry, or one per entry
    scale: float | list[float] = 1.0  # multiplies x - offset: one number for every entry, or one per entry
    value: list[float] | None = None  # x for source "constant" (its length is the field's width)
    channel: str | None = None  # source "channel": the observation's extra channel (e.g. "imu.ang_vel")
    # source "channel": its elements taken, 0-based, in order (None: the whole channel, `width` values)
    select: list[int] | None = None
    width: int | None = None  # source "channel": the values taken (the channel's width without `select`)
    period_s: float | None = None  # source "phase": the gait period T, s; x = [sin(2 pi t / T), cos(2 pi t / T)]


@dataclass
class ActionTable:
    """The [action] table of a spec file, as written (ActionMap is the checked form)."""

    name: str  # the action's name, for errors and reports
    units: str  # the joint targets' units: must be "rad"
    offset: float | list[float] = 0.0  # target = offset + scale * raw, rad: one number or one per joint
    scale: float | list[float] = 1.0  # target = offset + scale * raw: one number or one per joint


@dataclass
class SpecFile:
    """A spec file as written (see the module docstring); ByoSpec.load checks it and builds the ByoSpec."""

    model: str  # the ONNX or TorchScript file, relative to the spec's folder
    rate_hz: float  # the policy's rate, Hz (one action per step)
    n_joints: int  # joints the policy commands (the model's output width)
    observation: list[ObservationTable]  # the observation vector's fields, in order
    action: ActionTable  # how the raw action becomes joint targets
    format: Literal["onnx", "torchscript"] | None = None  # the model's format (None: from its suffix)
    input_name: str | None = None  # the model's input (None: its only one)
    output_name: str | None = None  # the model's output (None: its only one)
    stateful: bool = False  # the model keeps state between calls (a recurrent policy); reset() restores it


@dataclass
class ByoSpec:
    """A policy spec (see the module docstring); build it with `ByoSpec.load`. path: the spec file."""

    path: Path
    model: Path
    format: str
    rate_hz: float
    n_joints: int
    observation: list[ObsField]
    action: ActionMap
    input_name: str | None = None
    output_name: str | None = None
    stateful: bool = False

    @property
    def n_obs(self) -> int:
        return sum(f.width for f in self.observation)

    def channels(self) -> dict[str, int]:
        """{channel: the fewest values it must have} for every channel a field reads, in field order."""
        need: dict[str, int] = {}
        for f in self.observation:
            if f.source == "channel":
                n = f.width if f.select is None else int(f.select.max()) + 1
                need[f.channel] = max(need.get(f.channel, 0), n)
        return need

    def check_channels(self, widths: dict[str, int], where: str) -> None:
        """Check the channels a source provides ({name: width}: a log's extra channels, an observation's layout;
        `where` names the source) against the fields that read them. Raises ObservationMismatch (a ValueError)
        naming the spec file, the field, the channel and `where`: a channel missing, a whole channel of another
        width, an element past its end."""
        for i, f in enumerate(self.observation):
            if f.source != "channel":
                continue
            at = f"{self.path.name}: observation[{i}] ({f.name})"
            if f.channel not in widths:
                raise ObservationMismatch(f"{at}: channel {f.channel!r} is not in {where} (its channels: "
                                          f"{sorted(widths) or 'none'}; a log's channels are read with --extra)")
            n = widths[f.channel]
            if f.select is None and n != f.width:
                raise ObservationMismatch(f"{at}.width: {f.width}, but channel {f.channel!r} of {where} has {n} "
                                          "values (set select to take some of them)")
            if f.select is not None and int(f.select.max()) >= n:
                raise ObservationMismatch(f"{at}.select: element {int(f.select.max())} is past channel "
                                          f"{f.channel!r} of {where}, which has {n} values")

    @classmethod
    def load(cls, path: str | Path, model: str | Path | None = None) -> ByoSpec:
        """Read and check a spec. The spec's model path is relative to the spec's folder; `model` overrides it
        (relative to the working directory), its format then inferred from its suffix (.onnx, .pt, .ts).

        Loads the model once to check it: the fields' widths must sum to the model's input width and the
        output must be (1, n_joints); with stateful = false, two identical calls must agree.
        Raises ValueError naming the spec file and the field for invalid TOML, an unknown or missing key, a
        wrong type or length, a missing or unreadable model file, or a model that does not fit.
        FileNotFoundError: no spec file.
        """
        path = Path(path)
        raw = load(SpecFile, read_toml(path), file=path.name)
        err = _Errors(path.name)
        model_path = path.parent / raw.model
        fmt = raw.format or _FORMAT_OF_SUFFIX.get(model_path.suffix)
        if model is not None:
            model_path = Path(model)
            fmt = _FORMAT_OF_SUFFIX.get(model_path.suffix)
        if fmt is None:
            raise err("format", f"cannot infer from the suffix of {model_path.name}; set onnx or torchscript")
        if not model_path.is_file():
            raise err("model", f"no such file {model_path}")
        if not 1 <= raw.n_joints <= MAX_JOINTS:
            raise err("n_joints", f"expected 1..{MAX_JOINTS}, got {raw.n_joints}")
        if not (np.isfinite(raw.rate_hz) and raw.rate_hz > 0):
            raise err("rate_hz", f"expected a finite positive number, got {raw.rate_hz}")
        if not raw.observation:
            raise err("observation", "expected one or more [[observation]] tables")
        spec = cls(path=path, model=model_path, format=fmt, rate_hz=raw.rate_hz, n_joints=raw.n_joints,
                   observation=[_obs_field(t, raw.n_joints, err, f"observation[{i}]")
                                for i, t in enumerate(raw.observation)],
                   action=_action(raw.action, raw.n_joints, err),
                   input_name=raw.input_name, output_name=raw.output_name, stateful=raw.stateful)
        if spec.stateful and fmt == "onnx":
            raise err("stateful", "the ONNX runner is stateless; export a recurrent policy to TorchScript")
        _check_model(spec, err)
        return spec


class ByoPolicy:
    """A spec's policy, one step per call; `reset()` starts an episode (runner state, last action zeroed)."""

    def __init__(self, spec: ByoSpec):
        self.spec = spec
        self.runner: PolicyRunner = RUNNERS[spec.format](spec.model, spec.input_name, spec.output_name)
        self.last_action = np.zeros(spec.n_joints, np.float32)  # raw policy output of the previous step

    def reset(self) -> None:
        self.runner.reset()
        self.last_action[:] = 0.0

    def observation(self, q_rad: np.ndarray, qd_rad_s: np.ndarray, channels: dict[str, np.ndarray] | None = None,
                    t_s: float = 0.0) -> np.ndarray:
        """The model input (1, n_obs) float32 for joint positions/velocities (n_joints,) rad, rad/s, the extra
        channels {name: (width,) float64} (Observation.channels()) and the time since the episode's start t_s (s,
        for phase fields); a value past float32's range (|x| > 3.4e38 after offset and scale) is inf here.
        Raises ValueError for a wrong shape, ObservationMismatch (a ValueError) naming the field for a channel
        missing or of another width (ByoSpec.check_channels)."""
        d = self.spec.n_joints
        state = {"q": np.asarray(q_rad, np.float64), "qd": np.asarray(qd_rad_s, np.float64),
                 "last_action": self.last_action}
        if state["q"].shape != (d,) or state["qd"].shape != (d,):
            raise ValueError(f"{self.spec.path.name}: want q, qd of shape ({d},), got "
                             f"{state['q'].shape}, {state['qd'].shape}")
        channels = channels or {}
        parts = []
        for f in self.spec.observation:
            if f.source == "constant":
                x = f.value
            elif f.source == "phase":
                angle = 2.0 * np.pi * t_s / f.period_s
                x = np.array([np.sin(angle), np.cos(angle)])
            elif f.source == "channel":
                x = channels.get(f.channel)
                if x is None or (x.size != f.width if f.select is None else x.size <= f.select.max()):
                    self.spec.check_channels({k: v.size for k, v in channels.items()}, "the observation")
                x = x if f.select is None else x[f.select]
            else:
                x = state[f.source]
            parts.append((x - f.offset) * f.scale)
        with np.errstate(over="ignore"):  # a finite float64 past float32's range becomes inf: act() checks it
            return np.concatenate(parts).astype(np.float32)[None, :]

    def act(self, q_rad: np.ndarray, qd_rad_s: np.ndarray, channels: dict[str, np.ndarray] | None = None,
            t_s: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """One policy step from q (n_joints,) rad, qd (n_joints,) rad/s, the extra channels and the time since
        the episode's start t_s, s (see observation).

        Returns (joint target (n_joints,) float64 rad, raw action (n_joints,) float32); the raw action is
        the next step's last_action. When the model input is not finite (an observation past float32's range)
        the model is not run, and when it returns a non-finite action that action is dropped: both return a NaN
        target and raw action and keep last_action, so the step is skipped, not the runtime (the serve loop
        sends the continue rung for a non-finite chunk and counts error.nonfinite_action; a saturating model
        could map an inf input to a finite, plausible action, which is why the input is checked too).
        Raises ValueError naming the spec for a wrong input shape, ObservationMismatch for a channel that
        does not fit.
        """
        obs = self.observation(q_rad, qd_rad_s, channels, t_s)
        raw = self.runner(obs)[0].astype(np.float32) if np.all(np.isfinite(obs)) else None
        if raw is None or not np.all(np.isfinite(raw)):
            nan = np.full(self.spec.n_joints, np.nan)
            return nan, nan.astype(np.float32)
        self.last_action = raw.copy()
        a = self.spec.action
        return a.offset + a.scale * raw.astype(np.float64), raw


class ByoRuntime(Runtime):
    """A spec's policy as a Runtime (core/protocols.py), served by the same node as the action-token policy: one
    forward pass makes a one-step ActionChunk (anchor q, then the target one policy period later). No separate
    target engine, no planner (engine, engine_choice: None)."""

    def __init__(self, spec_path: str | Path, model_override: str | Path | None = None, warmup_steps: int = 10):
        self.spec = ByoSpec.load(spec_path, model=model_override)
        self.policy = ByoPolicy(self.spec)
        self.n_joints = self.spec.n_joints  # D of the observations it takes (serve.py's receiver checks it)
        self.step_ns = round(1e9 / self.spec.rate_hz)  # one policy period
        self.warmup_steps = warmup_steps
        self.n_chunks = 0
        self.t0_ns: int | None = None  # t_ns of the episode's first observation (phase fields count from it)

    def set_budget_ms(self, budget_ms: float) -> None:
        pass  # one forward pass per step: nothing to cut short

    def observe_costs(self, observer: Callable[[str, int], None]) -> None:
        pass  # no planner, no costs

    def chunk_timing(self, period_ns: int) -> tuple[int, int]:
        """(control ticks between policy steps, rounded: 8 for a 30 Hz policy at 250 Hz, i.e. 31.25 Hz; the
        chunk step in ns, one policy period) for a control period of period_ns."""
        return max(1, round(1e9 / period_ns / self.spec.rate_hz)), self.step_ns

    def warmup_observation(self) -> Observation:
        """The robot at its default joint positions (the action offset), at rest, every channel the spec reads
        at zero."""
        q = self.spec.action.offset.astype(np.float64)
        zeros = pack_channels({name: np.zeros(n) for name, n in self.spec.channels().items()})
        return Observation(0, now_ns(), q, np.zeros_like(q), q, *zeros)

    def reset(self) -> None:
        """New episode: recurrent state, last action and the phase clock back to their start. Chunk numbering
        continues."""
        self.policy.reset()
        self.t0_ns = None

    def warmup(self, obs: Observation) -> None:
        """Run a few steps so that the runtime's first-call costs are paid, then reset the episode."""
        for _ in range(self.warmup_steps):
            self.step(obs)
        self.reset()
        self.n_chunks = 0

    def step(self, obs: Observation, t_start_ns: int | None = None, step_ns: int | None = None,
             budget: bool = True, on_first_step: Callable[[ActionChunk], None] | None = None) -> ActionChunk:
        """The chunk for `obs`: steps_rad (2, D) = [obs.q_rad, target], step_ns (default one policy period)
        apart; obs's extra channels feed the channel fields, its time since the episode's first observation the
        phase fields. A single forward pass has nothing to cut short, so t_start_ns and budget are accepted for
        the serve loop's sake and unused, and the chunk is its first step (on_first_step is never called). A
        step the policy skips (ByoPolicy.act: an input past float32, a non-finite action) gives a NaN target,
        which the serve loop turns into the continue rung. Raises ValueError as ByoPolicy.act
        (ObservationMismatch, a ValueError, for an observation without a channel the spec reads: the episode's
        clock is then not started by it)."""
        t0_ns = obs.t_ns if self.t0_ns is None else self.t0_ns
        target, _ = self.policy.act(obs.q_rad, obs.qd_rad_s, obs.channels(), (obs.t_ns - t0_ns) / 1e9)
        self.t0_ns = t0_ns
        self.n_chunks += 1
        return ActionChunk(
            seq=self.n_chunks, obs_seq=obs.seq, t_obs_ns=obs.t_ns, t_ready_ns=now_ns(),
            step_ns=self.step_ns if step_ns is None else step_ns, steps_rad=np.vstack([obs.q_rad, target]),
            rung="full", tokens=0, target_passes=1, drafted=0, accepted=0)


_ONLY_FOR = {"value": "constant", "channel": "channel", "select": "channel", "width": "channel", "period_s": "phase"}


def _obs_field(t: ObservationTable, n_joints: int, err: _Errors, at: str) -> ObsField:
    if t.source in _SOURCE_UNITS and t.units != _SOURCE_UNITS[t.source]:
        raise err(f"{at}.units", f"source {t.source!r} is in {_SOURCE_UNITS[t.source]!r}, got {t.units!r}")
    for key, source in _ONLY_FOR.items():
        if getattr(t, key) is not None and t.source != source:
            raise err(f"{at}.{key}", f"only for source {source!r}, not {t.source!r}")
    value = select = None
    width = n_joints
    if t.source == "constant":
        if t.value is None:
            raise err(f"{at}.value", "missing")
        value = _numbers(t.value, None, err, f"{at}.value")
        width = len(value)
    elif t.source == "phase":
        if t.period_s is None or not (np.isfinite(t.period_s) and t.period_s > 0):
            raise err(f"{at}.period_s", f"expected the gait period, a finite positive number of s, got {t.period_s}")
        width = 2
    elif t.source == "channel":
        select, width = _channel(t, err, at)
    return ObsField(name=t.name, source=t.source, units=t.units, width=width,
                    offset=_numbers(t.offset, width, err, f"{at}.offset"),
                    scale=_numbers(t.scale, width, err, f"{at}.scale"), value=value, channel=t.channel,
                    select=select, period_s=t.period_s)


def _channel(t: ObservationTable, err: _Errors, at: str) -> tuple[np.ndarray | None, int]:
    """(select as (width,) int64 or None, width) of a "channel" field. Raises ValueError naming the key."""
    if t.channel is None or not CHANNEL_NAME.fullmatch(t.channel):
        raise err(f"{at}.channel", f"expected a channel name (letters, digits, _ . -), got {t.channel!r}")
    if t.select is None:
        if t.width is None or not 1 <= t.width <= MAX_EXTRA:
            raise err(f"{at}.width", f"expected the channel's width, 1..{MAX_EXTRA} (or select some of its elements), "
                                     f"got {t.width}")
        return None, t.width
    if not t.select or not all(isinstance(i, int) and 0 <= i < MAX_EXTRA for i in t.select):
        raise err(f"{at}.select", f"expected element indices 0..{MAX_EXTRA - 1}, got {t.select!r}")
    if t.width is not None and t.width != len(t.select):
        raise err(f"{at}.width", f"{t.width}, but select takes {len(t.select)} elements")
    return np.array(t.select, dtype=np.int64), len(t.select)


def _action(t: ActionTable, n_joints: int, err: _Errors) -> ActionMap:
    if t.units != "rad":
        raise err("action.units", f"joint position targets are in 'rad', got {t.units!r}")
    return ActionMap(name=t.name, units=t.units, offset=_numbers(t.offset, n_joints, err, "action.offset"),
                     scale=_numbers(t.scale, n_joints, err, "action.scale"))


def _numbers(value: float | list[float], n: int | None, err: _Errors, at: str) -> np.ndarray:
    """(n,) float64 from a list of n numbers or one number (broadcast); n None: a list of any length >= 1."""
    items = value if isinstance(value, list) else ([value] * n if n is not None else [])
    if not items:
        raise err(at, f"expected {'a number or ' if n else ''}a list of numbers, got {value!r}")
    if n is not None and len(items) != n:
        raise err(at, f"expected {n} numbers, got {len(items)}")
    arr = np.array(items, np.float64)
    if not np.all(np.isfinite(arr)):
        raise err(at, f"expected finite numbers, got {value!r}")
    return arr


def _check_model(spec: ByoSpec, err: _Errors) -> None:
    """Load the model once and check that it fits the spec (see ByoSpec.load). Raises ValueError."""
    try:
        runner: PolicyRunner = RUNNERS[spec.format](spec.model, spec.input_name, spec.output_name)
    except ValueError as e:
        raise ValueError(f"{err.file}: {e}") from None
    except Exception as e:  # onnxruntime and torch raise their own types for a file they cannot read
        raise err("model", f"cannot load {spec.model} as {spec.format}: {e}") from e
    widths = " + ".join(f"{f.name} {f.width}" for f in spec.observation)
    if runner.input_width is not None and runner.input_width != spec.n_obs:
        raise err("observation", f"fields give {spec.n_obs} values ({widths}), the model takes "
                                 f"{runner.input_width}")
    probe = np.zeros((1, spec.n_obs), np.float32)
    try:
        out = runner(probe)
    except ValueError as e:
        raise ValueError(f"{err.file}: {e}") from None
    except Exception as e:  # TorchScript: a shape mismatch is a RuntimeError, or torch.jit.Error (not one) when
        # the check is in scripted code (nn.LSTM's "Expected 41, got 47"); its cause is on the last line
        takes = _probed_width(runner, spec.n_obs)
        raise err("observation", f"fields give {spec.n_obs} values ({widths}), which the model rejects"
                                 f"{f' (it takes {takes})' if takes else ''}: {str(e).strip().splitlines()[-1]}"
                  ) from None
    if out.shape != (1, spec.n_joints) or out.dtype != np.float32:
        raise err("n_joints", f"the model returns {out.dtype}{out.shape}, expected float32 "
                              f"(1, {spec.n_joints})")
    if not spec.stateful and not np.array_equal(runner(probe), out):
        raise err("stateful", "false, but two identical calls gave different actions (set stateful = true)")


def _probed_width(runner: PolicyRunner, tried: int) -> int | None:
    """The input width a TorchScript model takes, when the spec's (`tried`) failed: the input width of its first
    weight matrix (a Linear's or an LSTM's, (out, in)), confirmed by one probe call of that width. None when there
    is no such weight or the call fails too (the model's error then says what it wants)."""
    if not isinstance(runner, TorchScriptRunner):
        return None
    weights = [p for p in runner.module.parameters() if p.dim() == 2]
    if not weights or (width := int(weights[0].shape[1])) == tried:
        return None
    try:
        runner(np.zeros((1, width), np.float32))
    except Exception:  # noqa: BLE001  (a guess that does not run: say nothing about the width)
        return None
    return width  # the runner is the load check's own: the call leaves no state in the served policy


class _Errors:
    """Errors that name the spec file and the field (`recurrent.toml: observation[2].value: ...`)."""

    def __init__(self, file: str):
        self.file = file

    def __call__(self, key: str, msg: str) -> ValueError:
        return ValueError(f"{self.file}: {key}: {msg}")
