"""Wire format: one msgpack header frame plus raw little-endian array frames. Never pickle.

A message is a list of ZMQ frames::

    frame 0   msgpack map {"schema": str, "version": int, <scalar fields>,
                           "arrays": [{"name": str, "dtype": "<f8", "shape": [int, ...]}, ...]}
    frame 1.. one C-contiguous "<f8" buffer per entry of "arrays", in that order

`decode` treats every frame as hostile: it checks sizes before unpacking or allocating and
raises `WireError` naming the schema and field for anything off-spec. All times are ns on
CLOCK_MONOTONIC (`time.perf_counter_ns()` on Linux), which every process on one host shares.
"""

import math
import typing
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Sequence

import msgpack
import numpy as np

RUNGS = ("full", "partial", "draft", "continue", "hold")
MAX_HEADER_BYTES = 64 * 1024  # headers are a few hundred bytes; anything bigger is an attack or a bug
MAX_FRAMES = 16
_DTYPE = "<f8"  # the only array dtype on the wire: joint-space data is float64, little-endian
_DIM_BOUNDS = {"D": (1, 32), "H": (0, 256)}  # inclusive; D = joints, H = chunk steps
# unpackb has no max_buffer_size; the header is capped by MAX_HEADER_BYTES before unpacking.
_UNPACK_LIMITS = dict(max_str_len=4096, max_bin_len=0, max_array_len=64, max_map_len=64, max_ext_len=0)
_INT64 = (-(2**63), 2**63 - 1)
MAX_STR = 4096  # UTF-8 bytes in any string field (msgpack's max_str_len on decode)
# What was wrong with a rejected message, for per-kind counters (WireError.kind):
#   garbage: not msgpack / not a map; truncated: a header or array frame cut short; oversize: a header over
#   MAX_HEADER_BYTES or an array frame too long; frames: wrong frame count; schema: unknown schema;
#   version: known schema, other version; field: a field missing, extra or of the wrong type or value;
#   nonfinite: NaN or inf in an array.
ERROR_KINDS = ("garbage", "truncated", "oversize", "frames", "schema", "version", "field", "nonfinite")


class WireError(ValueError):
    """Frames that are not a valid message; the text names the schema and field at fault, `kind` (one of
    ERROR_KINDS) says what sort of fault it was."""

    def __init__(self, text: str, kind: str = "field"):
        super().__init__(text)
        self.kind = kind


@dataclass
class Observation:
    """Robot state, replayer/robot -> runtime and control. Arrays are (D,) float64."""

    SCHEMA: ClassVar[str] = "edgeinfer.Observation"
    VERSION: ClassVar[int] = 1
    ARRAYS: ClassVar[dict] = {"q_rad": ("D",), "qd_rad_s": ("D",), "q_prev_rad": ("D",)}
    seq: int  # observation index == control tick index
    t_ns: int  # monotonic time the observation was taken (the replayer: its scheduled send time)
    q_rad: np.ndarray  # (D,) joint positions
    qd_rad_s: np.ndarray  # (D,) joint velocities
    q_prev_rad: np.ndarray  # (D,) joint positions one chunk step (stride) earlier


@dataclass
class ActionChunk:
    """Future joint targets, runtime -> control (the replayer listens too)."""

    SCHEMA: ClassVar[str] = "edgeinfer.ActionChunk"
    VERSION: ClassVar[int] = 1
    ARRAYS: ClassVar[dict] = {"steps_rad": ("H", "D")}
    seq: int  # chunk counter of the runtime
    obs_seq: int  # observation this chunk was built from
    t_obs_ns: int  # that observation's t_ns
    t_ready_ns: int  # monotonic time the chunk was ready
    step_ns: int  # time between chunk steps
    # (H+1, D) rad: row 0 the observed q at t_obs (the anchor), row h the target at t_obs + h * step_ns
    steps_rad: np.ndarray
    rung: str  # fallback rung that produced it, one of RUNGS
    tokens: int  # action tokens produced this chunk
    target_passes: int  # target forward passes used
    drafted: int  # draft tokens proposed to the target
    accepted: int  # draft tokens accepted by the target


@dataclass
class JointCommand:
    """One control tick's command, control -> replayer."""

    SCHEMA: ClassVar[str] = "edgeinfer.JointCommand"
    VERSION: ClassVar[int] = 1
    ARRAYS: ClassVar[dict] = {"q_rad": ("D",)}
    seq: int  # control tick index
    obs_seq: int  # newest observation the control loop had seen, -1 if none
    chunk_obs_seq: int  # obs_seq of the chunk used, -1 if none
    t_ns: int  # monotonic time the command was sent
    q_rad: np.ndarray  # (D,) commanded joint positions
    rung: str  # rung of the chunk used, or "hold" when the watchdog held


@dataclass
class Hello:
    """Start-handshake probe (see edgeinfer.transport); also a peer's ready report."""

    SCHEMA: ClassVar[str] = "edgeinfer.Hello"
    VERSION: ClassVar[int] = 1
    ARRAYS: ClassVar[dict] = {}
    sender: str
    seq: int
    t_ns: int


@dataclass
class Start:
    """Run start: tick k is due at t0_ns + k * period_ns, for k < n_ticks."""

    SCHEMA: ClassVar[str] = "edgeinfer.Start"
    VERSION: ClassVar[int] = 1
    ARRAYS: ClassVar[dict] = {}
    t0_ns: int
    period_ns: int
    n_ticks: int


@dataclass
class Stop:
    """Run end, with a human-readable reason."""

    SCHEMA: ClassVar[str] = "edgeinfer.Stop"
    VERSION: ClassVar[int] = 1
    ARRAYS: ClassVar[dict] = {}
    reason: str


@dataclass
class Heartbeat:
    """Liveliness beat, every `lease_ns / 3` or so on the sender's own PUB (replayer: observations, runtime:
    chunks, control: status). A peer that hears nothing from `sender` for `lease_ns` deems it dead (the
    ROS 2 / DDS liveliness lease). `instance` changes when the sender restarts (its pid); `peer_instance` is
    the instance of the peer the sender currently hears alive (-1: none), which closes a re-handshake.
    t0_ns/period_ns/n_ticks repeat the run's Start (-1 before the start), so a node that joins mid-run learns
    the schedule."""

    SCHEMA: ClassVar[str] = "edgeinfer.Heartbeat"
    VERSION: ClassVar[int] = 1
    ARRAYS: ClassVar[dict] = {}
    sender: str
    instance: int
    seq: int
    t_ns: int
    lease_ns: int
    peer_instance: int
    t0_ns: int
    period_ns: int
    n_ticks: int


@dataclass
class ErrorEvent:
    """A fault a node noticed (a malformed message, a non-finite action, a dead peer), published on its status
    channel, rate-limited: `count` is the running total of this `kind` at the sender, so a receiver loses no
    count when events are skipped. `detail` is the newest error text (at most MAX_STR characters)."""

    SCHEMA: ClassVar[str] = "edgeinfer.ErrorEvent"
    VERSION: ClassVar[int] = 1
    ARRAYS: ClassVar[dict] = {}
    sender: str
    kind: str
    count: int
    t_ns: int
    detail: str


@dataclass
class Stats:
    """Periodic metrics of a node (edgeinfer.telemetry): monotonically growing counters, and latency
    histograms as bucket counts over telemetry.BUCKET_BOUNDS_US (one more bucket than bounds: the overflow)."""

    SCHEMA: ClassVar[str] = "edgeinfer.Stats"
    VERSION: ClassVar[int] = 1
    ARRAYS: ClassVar[dict] = {}
    sender: str
    instance: int
    seq: int
    t_ns: int
    counters: dict[str, int]
    histograms: dict[str, list[int]]


Message = Observation | ActionChunk | JointCommand | Hello | Start | Stop | Heartbeat | ErrorEvent | Stats
_REGISTRY = {cls.SCHEMA: cls for cls in (Observation, ActionChunk, JointCommand, Hello, Start, Stop, Heartbeat,
                                         ErrorEvent, Stats)}


# Per-class tables, computed once: decode runs on every message of the control path.
_SCALARS = {cls: tuple((f.name, f.type) for f in fields(cls) if f.name not in cls.ARRAYS) for cls in _REGISTRY.values()}
_EXPECTED = {cls: frozenset({"schema", "version", "arrays", *(n for n, _ in _SCALARS[cls])})
             for cls in _REGISTRY.values()}
_ARRAY_NAMES = {cls: list(cls.ARRAYS) for cls in _REGISTRY.values()}
_META_KEYS = frozenset({"name", "dtype", "shape"})


def _scalars(cls: type) -> tuple[tuple[str, Any], ...]:
    """(name, type) of the non-array fields of a message class."""
    return _SCALARS[cls]


def _check_int(where: str, name: str, value: Any) -> None:
    if type(value) is not int or not _INT64[0] <= value <= _INT64[1]:
        raise WireError(f"{where}: field {name!r}: {value!r} is not an int64")


def _check_map(where: str, name: str, typ: Any, value: Any) -> None:
    """dict[str, int] or dict[str, list[int]], within the decoder's map/array limits."""
    if type(value) is not dict or len(value) > _UNPACK_LIMITS["max_map_len"]:
        raise WireError(f"{where}: field {name!r}: expected a map of at most {_UNPACK_LIMITS['max_map_len']} entries")
    as_list = typing.get_args(typ)[1] is not int
    for k, v in value.items():
        if type(k) is not str or len(k) > MAX_STR:
            raise WireError(f"{where}: field {name!r}: key {k!r} is not a string")
        items = v if as_list else [v]
        if as_list and (type(v) is not list or len(v) > _UNPACK_LIMITS["max_array_len"]):
            raise WireError(f"{where}: field {name!r}[{k!r}]: expected a list of at most "
                            f"{_UNPACK_LIMITS['max_array_len']} ints")
        for x in items:
            _check_int(where, f"{name}[{k}]", x)


def _check_scalar(where: str, name: str, typ: type, value: Any) -> None:
    # `type(...) is` rather than isinstance: bool is an int subclass and must not pass as one.
    if type(value) is not typ:
        if typing.get_origin(typ) is dict:
            return _check_map(where, name, typ, value)
        raise WireError(f"{where}: field {name!r}: got {type(value).__name__}, expected {typ.__name__}")
    if typ is int and not _INT64[0] <= value <= _INT64[1]:
        raise WireError(f"{where}: field {name!r}: {value} does not fit int64")
    if typ is str and len(value.encode()) > MAX_STR:
        raise WireError(f"{where}: field {name!r}: {len(value.encode())} bytes of UTF-8, limit {MAX_STR}")
    if name == "rung" and value not in RUNGS:
        raise WireError(f"{where}: field 'rung': {value!r} not in {RUNGS}")


def _check_arrays(cls: type, metas: Any) -> list[tuple[int, ...]]:
    """Shapes of the arrays described by `metas`, checked against `cls.ARRAYS` and the D/H bounds."""
    where = cls.SCHEMA
    if type(metas) is not list:
        raise WireError(f"{where}: field 'arrays': got {type(metas).__name__}, expected list")
    names = [m.get("name") if type(m) is dict else None for m in metas]
    if names != _ARRAY_NAMES[cls]:
        raise WireError(f"{where}: field 'arrays': names {names!r}, expected {_ARRAY_NAMES[cls]!r}")
    dims: dict[str, int] = {}
    shapes = []
    for meta in metas:
        name, symbols = meta["name"], cls.ARRAYS[meta["name"]]
        if meta.keys() != _META_KEYS:
            raise WireError(f"{where}: array {name!r}: keys {sorted(map(str, meta))}, "
                            "expected ['dtype', 'name', 'shape']")
        if meta["dtype"] != _DTYPE:
            raise WireError(f"{where}: array {name!r}: dtype {meta['dtype']!r} not allowed, expected {_DTYPE!r}")
        shape = meta["shape"]
        if type(shape) is not list or len(shape) != len(symbols) or any(type(n) is not int for n in shape):
            raise WireError(f"{where}: array {name!r}: shape {shape!r}, expected {len(symbols)} ints "
                            f"({', '.join(symbols)})")
        for sym, n in zip(symbols, shape):
            lo, hi = _DIM_BOUNDS[sym]
            if not lo <= n <= hi:
                raise WireError(f"{where}: array {name!r}: shape {shape}: {sym}={n} outside [{lo}, {hi}]")
            if dims.setdefault(sym, n) != n:
                raise WireError(f"{where}: array {name!r}: shape {shape}: {sym}={n} disagrees with "
                                f"{sym}={dims[sym]} of another array")
        shapes.append(tuple(shape))
    return shapes


def _check_header(header: Any) -> tuple[type, list[tuple[int, ...]]]:
    """Message class and array shapes of a decoded header; raises WireError on anything off-spec."""
    if not isinstance(header, dict):
        raise WireError(f"header: got {type(header).__name__}, expected a msgpack map", "garbage")
    schema = header.get("schema")
    cls = _REGISTRY.get(schema) if isinstance(schema, str) else None
    if cls is None:
        raise WireError(f"header: field 'schema': unknown schema {schema!r}", "schema")
    version = header.get("version")
    if type(version) is not int or version != cls.VERSION:
        raise WireError(f"{cls.SCHEMA}: field 'version': got {version!r}, expected {cls.VERSION}", "version")
    expected = _EXPECTED[cls]
    if header.keys() != expected:
        if missing := expected - set(header):
            raise WireError(f"{cls.SCHEMA}: missing field(s) {sorted(missing)}")
        raise WireError(f"{cls.SCHEMA}: extra field(s) {sorted(map(str, set(header) - expected))}")
    for name, typ in _scalars(cls):
        _check_scalar(cls.SCHEMA, name, typ, header[name])
    return cls, _check_arrays(cls, header["arrays"])


def encode(msg: Message) -> list[bytes | memoryview]:
    """Frames for `msg`: [msgpack header, one "<f8" buffer per array].

    Arrays may be any real numeric dtype, byte order or layout; they are converted to
    little-endian C-contiguous float64, without a copy when already so (the frame is then a
    memoryview of the caller's array). Raises WireError when `msg` would not decode (a non-finite
    array value included), so the sender fails loudly instead of the receiver dropping it.
    """
    cls = type(msg)
    if _REGISTRY.get(getattr(cls, "SCHEMA", None)) is not cls:
        raise WireError(f"encode: {cls.__name__} is not a wire message")
    header: dict[str, Any] = {"schema": cls.SCHEMA, "version": cls.VERSION}
    header.update({name: getattr(msg, name) for name, _ in _scalars(cls)})
    metas, arrays = [], []
    for name in cls.ARRAYS:
        a = np.asarray(getattr(msg, name))
        if a.dtype.kind not in "fiu":
            raise WireError(f"{cls.SCHEMA}: array {name!r}: dtype {a.dtype.str!r} is not real numeric")
        if a.dtype.kind == "f" and not np.isfinite(a).all():  # the receiver would reject it: fail here
            raise WireError(f"{cls.SCHEMA}: array {name!r}: non-finite value", "nonfinite")
        metas.append({"name": name, "dtype": _DTYPE, "shape": list(a.shape)})
        arrays.append(a)
    header["arrays"] = metas
    _check_header(header)
    packed = msgpack.packb(header, use_bin_type=True)
    if len(packed) > MAX_HEADER_BYTES:
        raise WireError(f"{cls.SCHEMA}: header is {len(packed)} bytes, limit {MAX_HEADER_BYTES}")
    # ravel + uint8 view keeps the memoryview 1-D bytes even for H=0, where memoryview.cast fails.
    flat = [np.ascontiguousarray(a, dtype=_DTYPE).reshape(-1).view(np.uint8) for a in arrays]
    return [packed, *(memoryview(b) for b in flat)]


def _as_bytes(frame: Any, i: int) -> memoryview:
    """1-D byte view of a bytes / memoryview / zmq.Frame, without copying."""
    try:
        mv = memoryview(frame)
    except TypeError:
        raise WireError(f"frame {i}: {type(frame).__name__} is not bytes-like", "garbage") from None
    if mv.nbytes == 0:
        return memoryview(b"")
    if mv.ndim == 1 and mv.format == "B":
        return mv
    if not mv.c_contiguous:
        raise WireError(f"frame {i}: buffer is not contiguous", "garbage")
    return mv.cast("B")


def decode(frames: Sequence[Any]) -> Message:
    """The message carried by `frames` (bytes, memoryview or zmq.Frame), with arrays copied out.

    Arrays come back as fresh, writeable native float64 with the header's shape. Raises
    WireError, naming schema and field, for: wrong frame count (1..MAX_FRAMES, and one frame
    per array), oversized or non-msgpack header, header not a map, unknown schema, wrong
    version, missing/extra fields, wrong scalar types (bool is not int), rung not in RUNGS,
    dtype other than "<f8", shape of wrong rank or outside D 1..32 / H 0..256 or disagreeing
    on D, and an array frame whose length is not prod(shape) * 8.
    """
    if not 1 <= len(frames) <= MAX_FRAMES:
        raise WireError(f"frames: got {len(frames)}, expected 1..{MAX_FRAMES}", "frames")
    bufs = [_as_bytes(f, i) for i, f in enumerate(frames)]
    if bufs[0].nbytes > MAX_HEADER_BYTES:
        raise WireError(f"header: {bufs[0].nbytes} bytes, limit {MAX_HEADER_BYTES}", "oversize")
    try:
        header = msgpack.unpackb(bufs[0], raw=False, strict_map_key=True, **_UNPACK_LIMITS)
    except (ValueError, TypeError, OverflowError, msgpack.UnpackException) as e:
        kind = "truncated" if "incomplete" in str(e) else "garbage"
        raise WireError(f"header: not valid msgpack ({type(e).__name__}: {e})", kind) from None
    cls, shapes = _check_header(header)
    if len(bufs) - 1 != len(shapes):
        raise WireError(f"{cls.SCHEMA}: frames: {len(bufs) - 1} array frame(s) for {len(shapes)} array(s)",
                        "frames")
    values = {name: header[name] for name, _ in _scalars(cls)}
    for name, shape, buf in zip(cls.ARRAYS, shapes, bufs[1:]):
        # Shapes are bounded by _DIM_BOUNDS, so this product is small and safe to compute.
        want = math.prod(shape) * np.dtype(_DTYPE).itemsize
        if buf.nbytes != want:
            short = buf.nbytes < want
            raise WireError(f"{cls.SCHEMA}: array {name!r}: {'truncated' if short else 'oversized'} frame, "
                            f"{buf.nbytes} bytes, expected {want} for shape {list(shape)}",
                            "truncated" if short else "oversize")
        arr = np.frombuffer(buf, dtype=_DTYPE).reshape(shape).astype(np.float64)
        if not np.isfinite(arr).all():  # a NaN joint target must never reach a robot
            raise WireError(f"{cls.SCHEMA}: array {name!r}: non-finite value", "nonfinite")
        values[name] = arr
    return cls(**values)
