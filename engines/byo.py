"""Bring your own policy: run an ONNX or TorchScript policy (an MLP or a recurrent net) from a TOML spec.

The spec names the model file, the policy rate, how the observation vector is built from the robot state
(ordered fields), and how the raw action becomes joint targets:

    obs    = concat_i((x_i - offset_i) * scale_i)   x_i: q (rad), qd (rad/s), a constant, or the last action
    target = action.offset + action.scale * raw      (rad)

last_action is the raw policy output of the previous step (zero after a reset), as in Isaac Lab. A stateful
TorchScript policy keeps its hidden state in module buffers (Isaac Lab's recurrent export does); `reset()`
restores every buffer to its value at load time. Example: launch/ur10_reach_policy.toml.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from edgeinfer.core.clock import now_ns
from edgeinfer.core.wire import ActionChunk, Observation

SOURCES = ("q", "qd", "constant", "last_action")
_SOURCE_UNITS = {"q": "rad", "qd": "rad/s"}  # what the runtime hands in; constant/last_action units are free text
_FORMAT_OF_SUFFIX = {".onnx": "onnx", ".pt": "torchscript", ".ts": "torchscript"}
_MAX_JOINTS = 32  # the wire's bound on D


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
    value: (width,) float64 for source "constant", else None."""

    name: str
    source: str
    units: str
    width: int
    offset: np.ndarray
    scale: np.ndarray
    value: np.ndarray | None = None


@dataclass
class ActionMap:
    """Joint target (rad) = offset + scale * raw_action. offset, scale: (n_joints,) float64."""

    name: str
    units: str
    offset: np.ndarray
    scale: np.ndarray


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
        with open(path, "rb") as fh:
            try:
                doc = tomllib.load(fh)
            except tomllib.TOMLDecodeError as e:
                raise ValueError(f"{path.name}: {e}") from None
        top = _Table(path.name, "", doc, required=("model", "rate_hz", "n_joints", "observation", "action"),
                     optional=("format", "input_name", "output_name", "stateful"))
        model_path = path.parent / top.text("model")
        fmt = top.text("format", _FORMAT_OF_SUFFIX.get(model_path.suffix), choices=tuple(RUNNERS))
        if model is not None:
            model_path = Path(model)
            fmt = _FORMAT_OF_SUFFIX.get(model_path.suffix)
        if fmt is None:
            raise top.error("format", f"cannot infer from the suffix of {model_path.name}; set onnx or torchscript")
        if not model_path.is_file():
            raise top.error("model", f"no such file {model_path}")
        n_joints = top.integer("n_joints", 1, _MAX_JOINTS)
        fields_doc = doc["observation"]
        if not isinstance(fields_doc, list) or not fields_doc:
            raise top.error("observation", "expected one or more [[observation]] tables")
        spec = cls(path=path, model=model_path, format=fmt, rate_hz=top.number("rate_hz", positive=True),
                   n_joints=n_joints,
                   observation=[_obs_field(_Table(path.name, f"observation[{i}]", d, ("name", "source", "units"),
                                                  ("offset", "scale", "value")), n_joints)
                                for i, d in enumerate(fields_doc)],
                   action=_action(_Table(path.name, "action", doc["action"], ("name", "units"), ("offset", "scale")),
                                  n_joints),
                   input_name=top.text("input_name", None), output_name=top.text("output_name", None),
                   stateful=top.flag("stateful", False))
        if spec.stateful and fmt == "onnx":
            raise top.error("stateful", "the ONNX runner is stateless; export a recurrent policy to TorchScript")
        _check_model(spec, top)
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

    def observation(self, q_rad: np.ndarray, qd_rad_s: np.ndarray) -> np.ndarray:
        """The model input (1, n_obs) float32 for joint positions/velocities (n_joints,) rad, rad/s.
        Raises ValueError for a wrong shape."""
        d = self.spec.n_joints
        state = {"q": np.asarray(q_rad, np.float64), "qd": np.asarray(qd_rad_s, np.float64),
                 "last_action": self.last_action}
        if state["q"].shape != (d,) or state["qd"].shape != (d,):
            raise ValueError(f"{self.spec.path.name}: want q, qd of shape ({d},), got "
                             f"{state['q'].shape}, {state['qd'].shape}")
        parts = [((f.value if f.source == "constant" else state[f.source]) - f.offset) * f.scale
                 for f in self.spec.observation]
        return np.concatenate(parts).astype(np.float32)[None, :]

    def act(self, q_rad: np.ndarray, qd_rad_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One policy step from q (n_joints,) rad, qd (n_joints,) rad/s.

        Returns (joint target (n_joints,) float64 rad, raw action (n_joints,) float32); the raw action is
        the next step's last_action. Raises ValueError naming the spec for a wrong input shape or a
        non-finite model output.
        """
        raw = self.runner(self.observation(q_rad, qd_rad_s))[0].astype(np.float32)
        if not np.all(np.isfinite(raw)):
            raise ValueError(f"{self.spec.path.name}: the model returned a non-finite action {raw}")
        self.last_action = raw.copy()
        a = self.spec.action
        return a.offset + a.scale * raw.astype(np.float64), raw


class ByoRuntime:
    """In-process API shaped like edgeinfer.node.runtime.PolicyRuntime, for a spec: one forward pass makes a
    one-step ActionChunk (anchor q, then the target one policy period later)."""

    def __init__(self, spec_path: str | Path, model_override: str | Path | None = None, warmup_steps: int = 10):
        self.spec = ByoSpec.load(spec_path, model=model_override)
        self.policy = ByoPolicy(self.spec)
        self.step_ns = round(1e9 / self.spec.rate_hz)  # one policy period
        self.warmup_steps = warmup_steps
        self.n_chunks = 0

    def chunk_timing(self, period_ns: int) -> tuple[int, int]:
        """(control ticks between policy steps, rounded: 8 for a 30 Hz policy at 250 Hz, i.e. 31.25 Hz; the
        chunk step in ns, one policy period) for a control period of period_ns."""
        return max(1, round(1e9 / period_ns / self.spec.rate_hz)), self.step_ns

    def warmup_observation(self) -> Observation:
        """The robot at its default joint positions (the action offset), at rest."""
        q = self.spec.action.offset.astype(np.float64)
        return Observation(0, now_ns(), q, np.zeros_like(q), q)

    def reset(self) -> None:
        """New episode: recurrent state and last action back to their start. Chunk numbering continues."""
        self.policy.reset()

    def warmup(self, obs: Observation) -> None:
        """Run a few steps so that the runtime's first-call costs are paid, then reset the episode."""
        for _ in range(self.warmup_steps):
            self.step(obs)
        self.reset()
        self.n_chunks = 0

    def step(self, obs: Observation, t_start_ns: int | None = None, step_ns: int | None = None,
             budget: bool = True) -> ActionChunk:
        """The chunk for `obs`: steps_rad (2, D) = [obs.q_rad, target], step_ns (default one policy period)
        apart. A single forward pass has nothing to cut short, so t_start_ns and budget are accepted for the
        serve loop's sake and unused. Raises ValueError as ByoPolicy.act."""
        target, _ = self.policy.act(obs.q_rad, obs.qd_rad_s)
        self.n_chunks += 1
        return ActionChunk(
            seq=self.n_chunks, obs_seq=obs.seq, t_obs_ns=obs.t_ns, t_ready_ns=now_ns(),
            step_ns=self.step_ns if step_ns is None else step_ns, steps_rad=np.vstack([obs.q_rad, target]),
            rung="full", tokens=0, target_passes=1, drafted=0, accepted=0)


def _obs_field(t: _Table, n_joints: int) -> ObsField:
    source = t.text("source", choices=SOURCES)
    units = t.text("units")
    if source in _SOURCE_UNITS and units != _SOURCE_UNITS[source]:
        raise t.error("units", f"source {source!r} is in {_SOURCE_UNITS[source]!r}, got {units!r}")
    value = None
    if source == "constant":
        value = t.numbers("value", None)
    elif "value" in t.doc:
        raise t.error("value", f"only for source 'constant', not {source!r}")
    width = n_joints if value is None else len(value)
    return ObsField(name=t.text("name"), source=source, units=units, width=width,
                    offset=t.numbers("offset", width, 0.0), scale=t.numbers("scale", width, 1.0), value=value)


def _action(t: _Table, n_joints: int) -> ActionMap:
    units = t.text("units")
    if units != "rad":
        raise t.error("units", f"joint position targets are in 'rad', got {units!r}")
    return ActionMap(name=t.text("name"), units=units, offset=t.numbers("offset", n_joints, 0.0),
                     scale=t.numbers("scale", n_joints, 1.0))


def _check_model(spec: ByoSpec, top: _Table) -> None:
    """Load the model once and check that it fits the spec (see ByoSpec.load). Raises ValueError."""
    try:
        runner: PolicyRunner = RUNNERS[spec.format](spec.model, spec.input_name, spec.output_name)
    except ValueError as e:
        raise ValueError(f"{top.file}: {e}") from None
    except Exception as e:  # onnxruntime and torch raise their own types for a file they cannot read
        raise top.error("model", f"cannot load {spec.model} as {spec.format}: {e}") from e
    widths = " + ".join(f"{f.name} {f.width}" for f in spec.observation)
    if runner.input_width is not None and runner.input_width != spec.n_obs:
        raise top.error("observation", f"fields give {spec.n_obs} values ({widths}), the model takes "
                                       f"{runner.input_width}")
    probe = np.zeros((1, spec.n_obs), np.float32)
    try:
        out = runner(probe)
    except RuntimeError as e:  # TorchScript: a shape mismatch surfaces here, its cause on the last line
        raise top.error("observation", f"fields give {spec.n_obs} values ({widths}), which the model rejects: "
                                       f"{str(e).strip().splitlines()[-1]}") from None
    except ValueError as e:
        raise ValueError(f"{top.file}: {e}") from None
    if out.shape != (1, spec.n_joints) or out.dtype != np.float32:
        raise top.error("n_joints", f"the model returns {out.dtype}{out.shape}, expected float32 "
                                    f"(1, {spec.n_joints})")
    if not spec.stateful and not np.array_equal(runner(probe), out):
        raise top.error("stateful", "false, but two identical calls gave different actions (set stateful = true)")


class _Table:
    """Typed reads from one TOML table; every error names the spec file and the field (`observation[2].value`)."""

    def __init__(self, file: str, at: str, doc: Any, required: tuple[str, ...], optional: tuple[str, ...]):
        self.file, self.at, self.doc = file, at, doc
        if not isinstance(doc, dict):
            raise ValueError(f"{file}: {at}: expected a table, got {type(doc).__name__}")
        for key in doc:
            if key not in required + optional:
                raise self.error(key, f"unknown key; expected one of {list(required + optional)}")
        for key in required:
            if key not in doc:
                raise self.error(key, "missing")

    def error(self, key: str, msg: str) -> ValueError:
        return ValueError(f"{self.file}: {self.at + '.' if self.at else ''}{key}: {msg}")

    def _get(self, key: str, default: Any, types: tuple[type, ...], what: str) -> Any:
        value = self.doc.get(key, default)
        if key in self.doc and type(value) not in types:  # `type() in`, not isinstance: bool is an int subclass
            raise self.error(key, f"expected {what}, got {type(value).__name__} {value!r}")
        return value

    def text(self, key: str, default: str | None = None, choices: tuple[str, ...] | None = None) -> Any:
        value = self._get(key, default, (str,), "a string")
        if choices is not None and key in self.doc and value not in choices:
            raise self.error(key, f"expected one of {list(choices)}, got {value!r}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        return self._get(key, default, (bool,), "true or false")

    def integer(self, key: str, lo: int, hi: int) -> int:
        value = self._get(key, None, (int,), "an integer")
        if not lo <= value <= hi:
            raise self.error(key, f"expected {lo}..{hi}, got {value}")
        return value

    def number(self, key: str, positive: bool = False) -> float:
        value = float(self._get(key, None, (int, float), "a number"))
        if not np.isfinite(value) or (positive and value <= 0):
            raise self.error(key, f"expected a finite{' positive' if positive else ''} number, got {value}")
        return value

    def numbers(self, key: str, n: int | None, default: float | None = None) -> np.ndarray:
        """(n,) float64 from a list of n numbers or one number (broadcast); n None: a list of any length >= 1.
        A missing key gives `default` broadcast, or an error when default is None."""
        if key not in self.doc:
            if default is None:
                raise self.error(key, "missing")
            return np.full(n, default)
        value = self.doc[key]
        if isinstance(value, list):
            items = value
        else:
            items = [value] * n if n is not None else []  # a number stands for the whole field
        if not items or any(type(v) not in (int, float) for v in items):
            raise self.error(key, f"expected {'a number or ' if n else ''}a list of numbers, got {value!r}")
        if n is not None and len(items) != n:
            raise self.error(key, f"expected {n} numbers, got {len(items)}")
        arr = np.array(items, np.float64)
        if not np.all(np.isfinite(arr)):
            raise self.error(key, f"expected finite numbers, got {value!r}")
        return arr
