"""wire.decode against hostile frames: whatever arrives, it returns a message or raises WireError, never another error.

The generator is structure-aware: it starts from valid headers and replaces a field's value with raw msgpack bytes
(nested up to 5000 levels, a container or string declaring 2^32-1 elements over a few bytes, ints at and past the
64-bit bounds, other types), drops or adds fields, and sends any number of array frames. Every hostile value is
built as flat bytes, so the generator itself never recurses.
"""

import struct

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgeinfer.core.wire import (
    ERROR_KINDS,
    MAX_FRAMES,
    ActionChunk,
    JointCommand,
    Observation,
    Stats,
    WireError,
    check_joints,
    decode,
    encode,
)

pytestmark = pytest.mark.background  # CPU-bound, no real-time bound (tests/conftest.py)

_VALID = [
    Observation(3, 10, np.zeros(6), np.ones(6), np.zeros(6), np.ones(2), "imu:2"),
    ActionChunk(1, 3, 10, 20, 5, np.zeros((4, 6)), "full", 8, 2, 4, 3),
    JointCommand(7, 3, 3, 30, np.zeros(6), "hold"),
    Stats("control", 1, 2, 3, {"ticks": 4}, {"tick_us": [1, 2, 3]}),
]
_HEADERS = [msgpack.unpackb(encode(m)[0]) for m in _VALID]


def _nested(depth: int, opener: bytes) -> bytes:
    """`depth` levels of one-element lists (b"\\x91") or one-key maps (b"\\x81\\xa1k") around a nil, as flat bytes."""
    return opener * depth + b"\xc0"


# containers, strings, bins and exts declaring 2^32-1 (or 2^16-1) elements, followed by a few bytes only
_HUGE_DECLARED = [b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff",
                  b"\xc9\xff\xff\xff\xff\x01", b"\xdc\xff\xff", b"\xde\xff\xff", b"\xda\xff\xff", b"\xc5\xff\xff"]

raw_values = st.one_of(
    # depths over all of 1..5000, and often in 900..1024, where Python's recursion limit is reached
    st.builds(_nested, st.one_of(st.integers(1, 5000), st.integers(900, 1024)),
              st.sampled_from([b"\x91", b"\x81\xa1k", b"\x81\x01"])),
    st.builds(bytes.__add__, st.sampled_from(_HUGE_DECLARED), st.binary(max_size=8)),
    st.integers(-(2**63) - 1, 2**64 - 1).map(lambda i: msgpack.packb(i) if -(2**63) <= i < 2**64 else
                                             b"\xd3" + struct.pack(">q", -(2**63))),
    st.sampled_from([b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff", b"\xd3\x80\x00\x00\x00\x00\x00\x00\x00",
                     b"\xd6\xff\x00\x00\x00\x00", b"\xd7\xff\xff\xff\xff\xff\xff\xff\xff\xff", b"\xc1", b""]),
    st.one_of(st.floats(), st.text(max_size=8), st.binary(max_size=8), st.booleans(), st.none(),
              st.lists(st.integers(-3, 2**64 - 1), max_size=4)).map(msgpack.packb),
    st.binary(max_size=16),  # anything
)


def _map(items: list[tuple[bytes, bytes]]) -> bytes:
    """A msgpack map32 of already-packed (key, value) pairs."""
    return b"\xdf" + struct.pack(">I", len(items)) + b"".join(k + v for k, v in items)


@st.composite
def hostile_headers(draw) -> bytes:
    header = draw(st.sampled_from(_HEADERS))
    items = [(msgpack.packb(k), msgpack.packb(v)) for k, v in header.items()]
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(items) - 1))
        action = draw(st.sampled_from(["value", "value", "drop", "add", "shape"]))
        if action == "value":  # a field's value replaced by hostile bytes
            items[i] = (items[i][0], draw(raw_values))
        elif action == "drop":
            del items[i]
            if not items:
                break
        elif action == "add":  # an extra field, its key possibly not a string
            items.append((draw(st.one_of(raw_values, st.text(max_size=6).map(msgpack.packb))), draw(raw_values)))
        else:  # array metadata with hostile shapes, dtypes and names
            meta = [{"name": draw(st.sampled_from(["q_rad", "steps_rad", "extra", "x"])),
                     "dtype": draw(st.sampled_from(["<f8", ">f8", "<f4", "|O"])),
                     "shape": draw(st.lists(st.integers(-(2**63), 2**64 - 1), max_size=5))}
                    for _ in range(draw(st.integers(0, MAX_FRAMES + 2)))]
            items = [it for it in items if it[0] != msgpack.packb("arrays")] + [(msgpack.packb("arrays"),
                                                                                msgpack.packb(meta))]
    return _map(items) if items else draw(raw_values)


@st.composite
def hostile_frames(draw) -> list[bytes]:
    head = draw(st.one_of(hostile_headers(), raw_values))
    array_frames = draw(st.lists(st.one_of(
        st.binary(max_size=64),
        st.sampled_from([np.zeros(6), np.full(6, np.nan), np.full(24, np.inf), np.zeros(2)]).map(
            lambda a: a.astype("<f8").tobytes())), max_size=2 * MAX_FRAMES))
    return [head, *array_frames]


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_frames())
def test_decode_raises_only_wire_error_for_any_frames(frames):
    try:
        msg = decode(frames)
    except WireError as e:
        assert e.kind in ERROR_KINDS, e.kind
        assert str(e)
    else:  # a mutation that happens to be valid must be a real message
        assert type(msg).SCHEMA.startswith("edgeinfer.")


@pytest.mark.parametrize("opener", [b"\x81\xa1k", b"\x91"])
@pytest.mark.parametrize("depth", [999, 1000, 5000])
def test_deeply_nested_header_is_a_wire_error(opener, depth):
    """The red team's frame: ~1 KB of maps in maps made decode raise RecursionError, which killed every node."""
    with pytest.raises(WireError) as e:
        decode([_nested(depth, opener)])
    assert e.value.kind == "garbage"
    inside = _map([(msgpack.packb("schema"), msgpack.packb(Observation.SCHEMA)),
                   (msgpack.packb("seq"), _nested(depth, opener))])  # deep inside a known schema's field
    with pytest.raises(WireError):
        decode([inside])


@pytest.mark.parametrize("field", ["schema", "version", "seq", "arrays", "extra_layout", "x"])
@pytest.mark.parametrize("depth", [900, 950, 999, 1000, 1023])
def test_nesting_inside_any_field_is_a_wire_error(field, depth):
    """Inside the schema field, the error path once quoted the value: repr of a 999-deep list is a RecursionError."""
    for opener in (b"\x91", b"\x81\xa1k"):
        items = [(msgpack.packb(k), msgpack.packb(v)) for k, v in _HEADERS[0].items() if k != field]
        with pytest.raises(WireError) as e:
            decode([_map([*items, (msgpack.packb(field), _nested(depth, opener))]), *encode(_VALID[0])[1:]])
        assert e.value.kind in ("garbage", "schema", "field", "version")


@pytest.mark.parametrize("declared", _HUGE_DECLARED)
def test_declared_huge_sizes_are_refused_without_allocating(declared):
    with pytest.raises(WireError) as e:
        decode([declared + b"\x01\x02"])
    assert e.value.kind in ("garbage", "truncated")


def test_decode_of_something_that_is_not_frames_is_a_wire_error():
    for frames in (None, 5, iter([b"x"])):
        with pytest.raises(WireError) as e:
            decode(frames)
        assert e.value.kind == "garbage"


@pytest.mark.parametrize("msg, array", [(_VALID[0], "q_rad"), (_VALID[1], "steps_rad"), (_VALID[2], "q_rad")])
def test_check_joints_names_the_array_and_both_counts(msg, array):
    check_joints(msg, 6)  # its own count passes
    with pytest.raises(WireError, match=rf"{msg.SCHEMA}: array '{array}': 6 joint\(s\), this receiver expects 3") as e:
        check_joints(msg, 3)
    assert e.value.kind == "joints"


def test_check_joints_lets_messages_without_joints_through():
    check_joints(_VALID[3], 6)


def test_a_one_joint_observation_is_not_broadcast_over_six():
    one = decode(encode(Observation(0, 0, np.zeros(1), np.zeros(1), np.zeros(1))))
    with pytest.raises(WireError, match="1 joint"):
        check_joints(one, 6)


def test_the_finite_check_of_the_largest_chunk_finds_a_nan_in_every_slice():
    """The largest ActionChunk (256 x 64 = 16,384 numbers) is checked in BLAS-thread-free slices: a NaN or inf at
    either end of any slice is found."""
    steps = np.zeros((256, 64))
    frames = [bytes(f) for f in encode(ActionChunk(1, 1, 0, 0, 1, steps, "full", 1, 1, 0, 0))]
    assert decode(frames).steps_rad.shape == (256, 64)
    for i in (0, 8191, 8192, 16383):
        for bad in (np.nan, np.inf, -np.inf):
            flat = steps.reshape(-1).copy()
            flat[i] = bad
            with pytest.raises(WireError, match="'steps_rad': non-finite") as e:
                decode([frames[0], flat.tobytes()])
            assert e.value.kind == "nonfinite"
