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
import re
import typing
import warnings
from dataclasses import MISSING, dataclass, fields
from typing import Annotated, Any, ClassVar, Literal, Sequence

import msgpack
import msgspec
import numpy as np

# The fallback ladder, best first (edgeinfer/node/runtime.py; hold: the control loop's watchdog). Its index is
# the int8 rung code of recordings and run.mcap (sim/received.py).
RUNGS = ("full", "coarse", "partial", "draft", "continue", "hold")
MAX_HEADER_BYTES = 64 * 1024  # headers are a few hundred bytes; anything bigger is an attack or a bug
MAX_FRAMES = 16
_DTYPE = "<f8"  # the only array dtype on the wire: joint-space data is float64, little-endian
MAX_JOINTS = 64  # the most joints (D) a message carries: a full humanoid (a Fourier GR1 logs 44)
MAX_EXTRA = 256  # the most numbers (E) of an observation's extra channels (an IMU, commands: tens)
_DIM_BOUNDS = {"D": (1, MAX_JOINTS), "H": (0, 256), "E": (1, MAX_EXTRA)}  # inclusive; D joints, H chunk steps
MAX_STR = 4096  # characters in any string field
MAX_ITEMS = 64  # entries in a map field (Stats counters, histograms) and ints in a histogram
# What was wrong with a rejected message, for per-kind counters (WireError.kind):
#   garbage: not msgpack / not a map; truncated: a header or array frame cut short; oversize: a header over
#   MAX_HEADER_BYTES or an array frame too long; frames: wrong frame count; schema: unknown schema;
#   version: known schema, other version; field: a field missing, extra or of the wrong type or value;
#   nonfinite: NaN or inf in an array; joints: a valid message with another joint count (D) than its receiver's
#   (check_joints).
ERROR_KINDS = ("garbage", "truncated", "oversize", "frames", "schema", "version", "field", "nonfinite", "joints")


class WireError(ValueError):
    """Frames that are not a valid message; the text names the schema and field at fault, `kind` (one of
    ERROR_KINDS) says what sort of fault it was."""

    def __init__(self, text: str, kind: str = "field"):
        super().__init__(text)
        self.kind = kind


class ObservationMismatch(ValueError):
    """A valid Observation that does not fit its consumer: another joint count than the policy's, or a channel the
    policy reads missing from its extra_layout or of another width. Counted and skipped by the runtime node, never
    fatal."""


@dataclass
class Observation:
    """Robot state, replayer/robot -> runtime and control. Joint arrays are (D,) float64.

    Other channels (an IMU's angular velocity, the gravity direction, a velocity command) travel in `extra`,
    (E,) float64, their names and widths in `extra_layout` ("imu.ang_vel:3,cmd:3", see parse_layout); without
    them (None, "") the message has neither, byte for byte the message it was before extras existed."""

    SCHEMA: ClassVar[str] = "edgeinfer.Observation"
    VERSION: ClassVar[int] = 1
    ARRAYS: ClassVar[dict] = {"q_rad": ("D",), "qd_rad_s": ("D",), "q_prev_rad": ("D",)}
    OPTIONAL_ARRAYS: ClassVar[dict] = {"extra": ("E",)}  # after ARRAYS when present; left out when None
    seq: int  # observation index == control tick index
    t_ns: int  # monotonic time the observation was taken (the replayer: its scheduled send time)
    q_rad: np.ndarray  # (D,) joint positions
    qd_rad_s: np.ndarray  # (D,) joint velocities
    q_prev_rad: np.ndarray  # (D,) joint positions one chunk step (stride) earlier
    extra: np.ndarray | None = None  # (E,) the extra channels' values, in extra_layout's order; None: none
    extra_layout: str = ""  # "name:width,..." of `extra` (parse_layout); "" exactly when extra is None

    def channels(self) -> dict[str, np.ndarray]:
        """{name: (width,) float64 view of extra} in layout order; {} without extras. Raises WireError for a
        layout that does not describe `extra` (a message decoded from the wire always does)."""
        if self.extra is None:
            return {}
        out, i = {}, 0
        for name, width in _layout_of(self.extra_layout, np.shape(self.extra)[0]):
            out[name] = self.extra[i:i + width]
            i += width
        return out


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
    """Start-handshake probe (see edgeinfer.core.transport); also a peer's ready report."""

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
    """Periodic metrics of a node (edgeinfer.core.telemetry): monotonically growing counters, and latency
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


@dataclass
class Join:
    """A robot asks a fleet runtime (edgeinfer/node/fleet_node.py) to serve it: robot -> runtime, on the robot's DEALER.
    The runtime answers with an Admission. A Join again from an admitted robot (a restart) re-admits it."""

    SCHEMA: ClassVar[str] = "edgeinfer.Join"
    VERSION: ClassVar[int] = 1
    ARRAYS: ClassVar[dict] = {}
    robot: str  # the robot's name, unique in the fleet (its DEALER routing id)
    n_joints: int  # D of its observations and chunks
    period_ns: int  # its control period
    replan_every_ticks: int  # it sends the observation a chunk is planned from every this many control ticks
    budget_ns: int  # chunk deadline: from an observation's t_ns to its chunk ready, ns
    max_budget_ns: int  # the longest budget it accepts when its own cannot be kept (<= budget_ns: none longer)


@dataclass
class Admission:
    """The fleet runtime's answer to a Join: runtime -> robot. admitted 0 is a refusal, `reason` says why, with the
    numbers it was decided on (the measured pass cost at the batch it would make)."""

    SCHEMA: ClassVar[str] = "edgeinfer.Admission"
    VERSION: ClassVar[int] = 1
    ARRAYS: ClassVar[dict] = {}
    robot: str
    admitted: int  # 1 admitted, 0 refused
    budget_ns: int  # the budget it is served on (its own, or a longer one it accepted); 0 when refused
    batch: int  # robots served once it is admitted (refused: that would have been)
    chunk_ns: int  # the predicted high-quantile time of a chunk at that batch, ns
    reason: str


# An observation's extra channels: "name:width" terms joined by ",", names as below, widths summing to E.
CHANNEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}")
_WIDTH = re.compile(r"[0-9]{1,3}")
_LAYOUTS: dict[tuple[str, int], tuple[tuple[str, int], ...]] = {}  # (text, E) -> checked layout
_LAYOUTS_MAX = 1024


def parse_layout(text: str) -> tuple[tuple[str, int], ...]:
    """((name, width), ...) of an extra_layout "imu.ang_vel:3,cmd:3". Names: a letter or "_" then up to 63 of
    letters, digits, "_", ".", "-"; unique; widths 1..MAX_EXTRA. Raises WireError naming the bad term."""
    out, seen = [], set()
    for term in text.split(","):
        name, _, width = term.partition(":")
        if not (CHANNEL_NAME.fullmatch(name) and _WIDTH.fullmatch(width) and 1 <= int(width) <= MAX_EXTRA):
            raise WireError(f"{Observation.SCHEMA}: field 'extra_layout': term {term[:80]!r} is not name:width "
                            f"(width 1..{MAX_EXTRA})")
        if name in seen:
            raise WireError(f"{Observation.SCHEMA}: field 'extra_layout': channel {name!r} twice")
        seen.add(name)
        out.append((name, int(width)))
    return tuple(out)


def _layout_of(text: str, size: int) -> tuple[tuple[str, int], ...]:
    """The layout `text` checked against an extra array of `size` numbers (0: none, then text must be "");
    remembered per (text, size). Raises WireError."""
    key = (text, size)
    if (layout := _LAYOUTS.get(key)) is None:
        if not text or not size:
            raise WireError(f"{Observation.SCHEMA}: field 'extra_layout': {text[:80]!r} with "
                            f"{'an extra array of ' + str(size) if size else 'no extra array'}; the two come together")
        layout = parse_layout(text)
        if (total := sum(w for _, w in layout)) != size:
            raise WireError(f"{Observation.SCHEMA}: field 'extra_layout': widths sum to {total}, array 'extra' "
                            f"has {size}")
        if len(_LAYOUTS) >= _LAYOUTS_MAX:
            _LAYOUTS.clear()
        _LAYOUTS[key] = layout
    return layout


def pack_channels(channels: dict[str, Any]) -> tuple[np.ndarray | None, str]:
    """(extra (E,) float64, extra_layout) for an Observation from {name: value} (each a number or a 1-D array,
    in order); (None, "") for no channels. Raises WireError for a bad name or width (parse_layout)."""
    if not channels:
        return None, ""
    parts = [np.atleast_1d(np.asarray(v, dtype=np.float64)).reshape(-1) for v in channels.values()]
    layout = ",".join(f"{name}:{p.size}" for name, p in zip(channels, parts))
    extra = np.concatenate(parts)
    _layout_of(layout, extra.size)
    return extra, layout


Message = (Observation | ActionChunk | JointCommand | Hello | Start | Stop | Heartbeat | ErrorEvent | Stats | Join
           | Admission)
_REGISTRY = {cls.SCHEMA: cls for cls in (Observation, ActionChunk, JointCommand, Hello, Start, Stop, Heartbeat,
                                         ErrorEvent, Stats, Join, Admission)}


# Header schemas, generated once from the message classes: msgspec validates a header while it decodes it
# (types, int64 range, bool is not int, string/map/list limits, unknown or missing fields, the schema tag),
# in C; what it cannot express (version, array names, dtypes and shapes) is checked below.
class _ArrayMeta(msgspec.Struct, forbid_unknown_fields=True, frozen=True):  # frozen: hashable, for _SHAPES
    name: str
    dtype: str
    shape: Annotated[tuple[int, ...], msgspec.Meta(max_length=4)]


_I64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
_STR = Annotated[str, msgspec.Meta(max_length=MAX_STR)]
_HEADER_TYPES = {int: _I64, str: _STR,
                 dict[str, int]: Annotated[dict[_STR, _I64], msgspec.Meta(max_length=MAX_ITEMS)],
                 dict[str, list[int]]: Annotated[dict[_STR, Annotated[list[_I64], msgspec.Meta(max_length=MAX_ITEMS)]],
                                                 msgspec.Meta(max_length=MAX_ITEMS)]}
# every array of a message: ARRAYS, always sent, then OPTIONAL_ARRAYS, sent when not None (a prefix of them)
_ARRAYS = {cls: {**cls.ARRAYS, **getattr(cls, "OPTIONAL_ARRAYS", {})} for cls in _REGISTRY.values()}
_SCALARS = {cls: tuple(f.name for f in fields(cls) if f.name not in _ARRAYS[cls]) for cls in _REGISTRY.values()}
# scalar fields with a default, left out of the header when they hold it (Observation.extra_layout)
_DEFAULTS = {cls: {f.name: f.default for f in fields(cls) if f.name in _SCALARS[cls] and f.default is not MISSING}
             for cls in _REGISTRY.values()}


def _header_struct(cls: type) -> type:
    typed = {f.name: Literal[RUNGS] if f.name == "rung" else _HEADER_TYPES[f.type] for f in fields(cls)
             if f.name not in _ARRAYS[cls]}
    defaults = _DEFAULTS[cls]
    return msgspec.defstruct(f"{cls.__name__}Header",
                             [("version", int), *((n, typed[n]) for n in _SCALARS[cls] if n not in defaults),
                              ("arrays", Annotated[list[_ArrayMeta], msgspec.Meta(max_length=MAX_FRAMES)]),
                              *((n, typed[n], defaults[n]) for n in defaults)],
                             tag_field="schema", tag=cls.SCHEMA, forbid_unknown_fields=True)


_HEADERS = {_header_struct(cls): cls for cls in _REGISTRY.values()}
_DECODER = msgspec.msgpack.Decoder(typing.Union[tuple(_HEADERS)])


def _numpy_scalar(obj: Any) -> Any:
    """msgspec's enc_hook: a numpy bool, integer, float or str scalar (np.int64(1) from an array, a sum) as the
    Python value it holds, which the header then checks like any other (range, type). Raises TypeError otherwise."""
    if isinstance(obj, np.generic) and obj.dtype.kind in "biufU":
        value = obj.item()
        return float(value) if isinstance(value, np.floating) else value  # longdouble.item() is a longdouble
    raise TypeError(f"Encoding objects of type {type(obj).__name__} is unsupported")  # msgspec's own words


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_numpy_scalar)
# OpenBLAS runs a ddot of more than 10,000 elements on its thread pool (kernel/x86_64/ddot.c): waking it costs
# milliseconds on a loaded host. Dots of at most this many stay on the calling thread.
_DOT_MAX = 8192
_ZEROS = np.zeros(_DOT_MAX)


# inf * 0 is NaN by design below (the non-finite value is then counted as an error): not a warning to print
warnings.filterwarnings("ignore", "invalid value encountered in dot", RuntimeWarning, module=__name__)


def _all_finite(a: np.ndarray) -> bool:
    """True when no element of the float64 array is NaN or inf: x * 0 is 0 for every finite x, NaN otherwise. A dot
    with zeros needs no temporary (np.isfinite allocates one); it runs in slices of _DOT_MAX, off BLAS threads."""
    flat = a.reshape(-1)
    for i in range(0, flat.size, _DOT_MAX):
        part = flat[i: i + _DOT_MAX]
        if not math.isfinite(part.dot(_ZEROS[: part.size])):
            return False
    return True


_SHAPES: dict[tuple, list[tuple[int, ...]]] = {}  # (cls, *metas) -> shapes: the array headers already checked
_SHAPES_MAX = 1024


def _shapes(cls: type, metas: list[_ArrayMeta]) -> list[tuple[int, ...]]:
    """Shapes of the arrays described by `metas`, checked against the class's arrays and the D/H/E bounds (a pure
    function of its arguments, so a message's usual array headers are checked once and remembered)."""
    key = (cls, *metas)
    if (shapes := _SHAPES.get(key)) is None:
        shapes = _check_shapes(cls, metas)
        if len(_SHAPES) >= _SHAPES_MAX:
            _SHAPES.clear()
        _SHAPES[key] = shapes
    return shapes


def _check_shapes(cls: type, metas: list[_ArrayMeta]) -> list[tuple[int, ...]]:
    where = cls.SCHEMA
    names = [m.name for m in metas]
    if names != list(_ARRAYS[cls])[:len(names)] or len(names) < len(cls.ARRAYS):
        optional = list(getattr(cls, "OPTIONAL_ARRAYS", ()))
        raise WireError(f"{where}: field 'arrays': names {names!r}, expected {list(cls.ARRAYS)!r}"
                        f"{f' then optionally {optional!r}' if optional else ''}")
    dims: dict[str, int] = {}
    shapes = []
    for meta in metas:
        name, symbols, shape = meta.name, _ARRAYS[cls][meta.name], meta.shape
        if meta.dtype != _DTYPE:
            raise WireError(f"{where}: array {name!r}: dtype {meta.dtype!r} not allowed, expected {_DTYPE!r}")
        if len(shape) != len(symbols):
            raise WireError(f"{where}: array {name!r}: shape {list(shape)}, expected {len(symbols)} ints "
                            f"({', '.join(symbols)})")
        for sym, n in zip(symbols, shape):
            lo, hi = _DIM_BOUNDS[sym]
            if not lo <= n <= hi:
                raise WireError(f"{where}: array {name!r}: shape {shape}: {sym}={n} outside [{lo}, {hi}]")
            if dims.setdefault(sym, n) != n:
                raise WireError(f"{where}: array {name!r}: shape {shape}: {sym}={n} disagrees with "
                                f"{sym}={dims[sym]} of another array")
        shapes.append(shape)
    return shapes


def _header(buf: bytes | memoryview) -> tuple[type, Any, list[tuple[int, ...]]]:
    """(message class, validated header struct, array shapes) of a header frame; raises WireError."""
    try:
        header = _DECODER.decode(buf)
    except msgspec.DecodeError as e:
        raise _header_error(buf, e) from None
    except RecursionError:  # msgspec recurses per level: a 1 KiB frame of maps in maps reaches Python's limit
        raise WireError("header: nested deeper than the decoder's recursion limit", "garbage") from None
    cls = _HEADERS[type(header)]
    if header.version != cls.VERSION:
        raise WireError(f"{cls.SCHEMA}: field 'version': got {header.version!r}, expected {cls.VERSION}", "version")
    shapes = _shapes(cls, header.arrays)
    if cls is Observation and (len(shapes) > 3 or header.extra_layout):
        _layout_of(header.extra_layout, shapes[3][0] if len(shapes) > 3 else 0)
    return cls, header, shapes


def _header_error(buf: bytes | memoryview, e: msgspec.DecodeError) -> WireError:
    """The WireError for a header msgspec rejected, naming schema, field and kind (the slow path: errors only)."""
    try:
        raw = msgpack.unpackb(buf, raw=False, strict_map_key=False)
    except Exception as parse_error:  # noqa: BLE001 - any failure to parse means the same: not msgpack
        kind = "truncated" if "incomplete" in str(parse_error) else "garbage"
        return WireError(f"header: not valid msgpack ({type(parse_error).__name__}: {parse_error})", kind)
    if not isinstance(raw, dict):
        return WireError(f"header: got {type(raw).__name__}, expected a msgpack map", "garbage")
    schema = raw.get("schema")
    cls = _REGISTRY.get(schema) if isinstance(schema, str) else None
    if cls is None:  # repr of a hostile value could recurse (a list 999 deep): a string's start, else its type
        shown = repr(schema[:80]) if isinstance(schema, str) else f"of type {type(schema).__name__}"
        return WireError(f"header: field 'schema': unknown schema {shown}", "schema")
    # msgspec's text: "Expected `int`, got `bool` - at `$.seq`" or "... - at `key` in `$.counters`"
    text, _, where = str(e).partition(" - at ")
    key = where.startswith("`key`")
    path = re.sub(r"^\$\.?", "", where.rpartition(" in ")[2].strip("`"))
    if path.startswith("arrays["):  # name the array: arrays[1].shape[0] -> array 'qd_rad_s' shape[0]
        i, _, rest = path[len("arrays["):].partition("]")
        name = list(_ARRAYS[cls])[int(i)] if i.isdigit() and int(i) < len(_ARRAYS[cls]) else f"#{i}"
        path = f"array {name!r}{' ' + rest.lstrip('.') if rest else ''}"
    elif path:
        path = f"field {path!r}{' (a key)' if key else ''}"
    for theirs, ours in (("Object missing required field", "missing field"), ("Object contains unknown field",
                         "extra field"), ("`object`", "map"), ("`array`", "list"), ("`", "")):
        text = text.replace(theirs, ours)
    kind = "version" if path == "field 'version'" else "field"
    return WireError(f"{cls.SCHEMA}: {path + ': ' if path else ''}{text[:1].lower()}{text[1:]}", kind)


def encode(msg: Message) -> list[bytes | memoryview]:
    """Frames for `msg`: [msgpack header, one "<f8" buffer per array].

    Arrays may be any real numeric dtype, byte order or layout; they are converted to
    little-endian C-contiguous float64, without a copy when already so (the frame is then a
    memoryview of the caller's array). Raises WireError when `msg` would not decode (the header is
    checked by the receiver's own decoder; a non-finite array value included), so the sender fails
    loudly instead of the receiver dropping it.
    """
    cls = type(msg)
    if _REGISTRY.get(getattr(cls, "SCHEMA", None)) is not cls:
        raise WireError(f"encode: {cls.__name__} is not a wire message")
    header: dict[str, Any] = {"schema": cls.SCHEMA, "version": cls.VERSION}
    defaults = _DEFAULTS[cls]
    for name in _SCALARS[cls]:
        value = getattr(msg, name)
        if name not in defaults or value != defaults[name]:
            header[name] = value
    metas, flat = [], []
    for name in _ARRAYS[cls]:
        a = getattr(msg, name)
        if a is None and name not in cls.ARRAYS:
            break  # the optional arrays present are a prefix of them
        a = np.asarray(a)
        if a.dtype.kind not in "fiu":
            raise WireError(f"{cls.SCHEMA}: array {name!r}: dtype {a.dtype.str!r} is not real numeric")
        a = np.ascontiguousarray(a, dtype=_DTYPE)
        if not _all_finite(a):  # the receiver would reject it: fail here
            raise WireError(f"{cls.SCHEMA}: array {name!r}: non-finite value", "nonfinite")
        metas.append({"name": name, "dtype": _DTYPE, "shape": list(a.shape)})
        # ravel + uint8 view keeps the memoryview 1-D bytes even for H=0, where memoryview.cast fails.
        flat.append(memoryview(a.reshape(-1).view(np.uint8)))
    header["arrays"] = metas
    try:
        packed = _ENCODER.encode(header)
    except (TypeError, OverflowError) as e:  # a value msgpack cannot carry (an int over 64 bits, an object)
        bad = next(n for n in _SCALARS[cls] if n in header and not _encodes(header[n]))
        raise WireError(f"{cls.SCHEMA}: field {bad!r}: cannot encode {type(header[bad]).__name__} ({e})") from None
    if len(packed) > MAX_HEADER_BYTES:
        raise WireError(f"{cls.SCHEMA}: header is {len(packed)} bytes, limit {MAX_HEADER_BYTES}")
    _header(memoryview(packed))  # what the receiver checks, checked here
    return [packed, *flat]


def _encodes(value: Any) -> bool:
    """True when msgpack can carry `value` (the error path of encode: which field it could not)."""
    try:
        _ENCODER.encode(value)
    except (TypeError, OverflowError):
        return False
    return True


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
    dtype other than "<f8", shape of wrong rank or outside D 1..MAX_JOINTS / H 0..256 / E 1..MAX_EXTRA or
    disagreeing on D, an array frame whose length is not prod(shape) * 8, a NaN or inf array value, and an
    Observation whose extra_layout does not describe its extra array (parse_layout; both or neither). Any other
    input, however malformed (nested without end, declaring 2^32 elements), raises WireError too, never another
    error: sizes are checked before anything is copied or allocated.
    """
    try:
        n_frames = len(frames)
    except TypeError:
        raise WireError(f"frames: {type(frames).__name__} is not a sequence of frames", "garbage") from None
    if not 1 <= n_frames <= MAX_FRAMES:
        raise WireError(f"frames: got {n_frames}, expected 1..{MAX_FRAMES}", "frames")
    bufs = [f if type(f) is bytes else _as_bytes(f, i) for i, f in enumerate(frames)]  # len() = bytes
    if len(bufs[0]) > MAX_HEADER_BYTES:
        raise WireError(f"header: {len(bufs[0])} bytes, limit {MAX_HEADER_BYTES}", "oversize")
    cls, header, shapes = _header(bufs[0])
    if len(bufs) - 1 != len(shapes):
        raise WireError(f"{cls.SCHEMA}: frames: {len(bufs) - 1} array frame(s) for {len(shapes)} array(s)",
                        "frames")
    values = {name: getattr(header, name) for name in _SCALARS[cls]}
    sizes = [math.prod(shape) for shape in shapes]  # bounded by _DIM_BOUNDS: small and safe to compute
    for name, shape, n, buf in zip(_ARRAYS[cls], shapes, sizes, bufs[1:]):
        if len(buf) != n * 8:
            short = len(buf) < n * 8
            raise WireError(f"{cls.SCHEMA}: array {name!r}: {'truncated' if short else 'oversized'} frame, "
                            f"{len(buf)} bytes, expected {n * 8} for shape {list(shape)}",
                            "truncated" if short else "oversize")
    # one copy of all arrays, one finite check, a writeable view per array
    flat = np.frombuffer(b"".join(bufs[1:]), dtype=_DTYPE).copy() if shapes else None
    if flat is not None and not _all_finite(flat):  # a NaN joint target must never reach a robot
        bad = next(name for name, b in zip(_ARRAYS[cls], bufs[1:]) if not _all_finite(np.frombuffer(b, _DTYPE)))
        raise WireError(f"{cls.SCHEMA}: array {bad!r}: non-finite value", "nonfinite")
    offset = 0
    for name, shape, n in zip(_ARRAYS[cls], shapes, sizes):
        values[name] = flat[offset: offset + n].reshape(shape)
        offset += n
    return cls(**values)


# (array, axis) holding D in each message with joints: the first array that has D
_JOINT_AXIS = {cls: next((name, symbols.index("D")) for name, symbols in arrays.items() if "D" in symbols)
               for cls, arrays in _ARRAYS.items() if any("D" in symbols for symbols in arrays.values())}


def check_joints(msg: Message, n_joints: int) -> None:
    """Raise WireError (kind "joints") when `msg` carries joint arrays (Observation, ActionChunk, JointCommand) of
    another joint count D than `n_joints`, naming the array and both counts; messages without joints pass. The check
    every receiver makes where a message enters (transport.Receiver(joints=...)): decode accepts any D in
    1..MAX_JOINTS, and numpy would broadcast a (1,) array over six joints."""
    if (where := _JOINT_AXIS.get(type(msg))) is None:
        return
    name, axis = where
    if (d := getattr(msg, name).shape[axis]) != n_joints:
        raise WireError(f"{msg.SCHEMA}: array {name!r}: {d} joint(s), this receiver expects {n_joints}", "joints")
