"""edgeinfer.core.wire: round trips and one clear WireError per kind of malformed frame list."""

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from edgeinfer.core.wire import (
    MAX_HEADER_BYTES,
    ActionChunk,
    Hello,
    JointCommand,
    Observation,
    Start,
    Stats,
    Stop,
    WireError,
    decode,
    encode,
)

pytestmark = pytest.mark.background  # CPU-bound, no real-time bound (tests/conftest.py)

D = 7


def _obs(**kw):
    base = dict(seq=3, t_ns=123_456_789, q_rad=np.linspace(-1, 1, D), qd_rad_s=np.arange(D, dtype=float),
                q_prev_rad=np.full(D, 0.5))
    return Observation(**{**base, **kw})


def _chunk(**kw):
    base = dict(seq=9, obs_seq=3, t_obs_ns=10, t_ready_ns=20, step_ns=33_000_000,
                steps_rad=np.arange(16 * D, dtype=float).reshape(16, D), rung="partial",
                tokens=112, target_passes=4, drafted=120, accepted=100)
    return ActionChunk(**{**base, **kw})


def _cmd(**kw):
    base = dict(seq=5, obs_seq=-1, chunk_obs_seq=-1, t_ns=7, q_rad=np.zeros(D), rung="hold")
    return JointCommand(**{**base, **kw})


def _assert_same(a, b):
    assert type(a) is type(b)
    for name, va in vars(a).items():
        vb = getattr(b, name)
        if isinstance(va, np.ndarray):
            assert vb.dtype == np.float64 and vb.shape == va.shape
            np.testing.assert_array_equal(vb, va)
        else:
            assert type(vb) is type(va) and vb == va


def _header(frames):
    return msgpack.unpackb(frames[0])


def _with_header(frames, **changes):
    header = {**_header(frames), **changes}
    return [msgpack.packb(header), *frames[1:]]


@pytest.mark.parametrize("msg", [_obs(), _chunk(), _chunk(steps_rad=np.zeros((0, D))), _cmd(),
                                 Hello("control", 1, 2), Start(10, 20, 30), Stop("done")])
def test_round_trip(msg):
    frames = encode(msg)
    assert len(frames) == 1 + len(type(msg).ARRAYS)
    _assert_same(msg, decode(frames))
    _assert_same(msg, decode([bytes(f) for f in frames]))


def test_arrays_are_zero_copy_when_already_little_endian():
    obs = _obs()
    frames = encode(obs)
    assert np.shares_memory(np.frombuffer(frames[1], dtype="<f8"), obs.q_rad)


def test_big_endian_and_strided_inputs_are_converted():
    q = np.linspace(0, 1, D).astype(">f8")
    steps = np.asfortranarray(np.arange(4 * D, dtype=">f8").reshape(4, D))
    frames = encode(_chunk(steps_rad=steps))
    assert _header(frames)["arrays"][0]["dtype"] == "<f8"
    out = decode(frames)
    np.testing.assert_array_equal(out.steps_rad, steps)
    assert out.steps_rad.dtype == np.float64
    np.testing.assert_array_equal(decode(encode(_obs(q_rad=q))).q_rad, q)


def test_decoded_arrays_are_independent_and_writeable():
    buf = [bytes(f) for f in encode(_obs())]
    out = decode(buf)
    out.q_rad[0] = 42.0  # must not raise on a read-only frame buffer
    assert decode(buf).q_rad[0] != 42.0


def _raises(frames, *words):
    with pytest.raises(WireError) as info:
        decode(frames)
    for w in words:
        assert w in str(info.value), str(info.value)
    return info.value


def test_wrong_version():
    _raises(_with_header(encode(_obs()), version=2), "edgeinfer.Observation", "version")


def test_unknown_schema():
    _raises(_with_header(encode(_obs()), schema="edgeinfer.Nope"), "schema", "edgeinfer.Nope")


def test_truncated_and_oversized_array_frames():
    frames = encode(_obs())
    _raises([frames[0], frames[1], bytes(frames[2])[:-1], frames[3]], "qd_rad_s", "truncated")
    _raises([*frames[:3], bytes(frames[3]) + b"\0"], "q_prev_rad", "oversized")


@pytest.mark.parametrize("dtype", ["<f4", "|O", ">f8", "<i8"])
def test_wrong_dtype(dtype):
    frames = encode(_cmd())
    arrays = [{**_header(frames)["arrays"][0], "dtype": dtype}]
    _raises(_with_header(frames, arrays=arrays), "edgeinfer.JointCommand", "q_rad", "dtype", dtype)


def test_oversize_header_rejected_before_unpacking():
    _raises([b"\x80" + b"\0" * MAX_HEADER_BYTES], "header", "limit")


@pytest.mark.parametrize("head", [b"\xc1", b"\x92\x01", b"\x81\xa1a\x01trailing"])
def test_non_msgpack_header(head):
    _raises([head], "header", "msgpack")


def test_header_not_a_map():
    _raises([msgpack.packb([1, 2, 3])], "header", "map")


def test_missing_and_extra_field():
    header = _header(encode(_chunk()))
    del header["accepted"]
    _raises([msgpack.packb(header), *encode(_chunk())[1:]], "ActionChunk", "missing", "accepted")
    _raises(_with_header(encode(_chunk()), surprise=1), "ActionChunk", "extra", "surprise")


def test_bool_in_int_field():
    _raises(_with_header(encode(_obs()), seq=True), "Observation", "'seq'", "bool")


def test_str_field_type():
    _raises(_with_header(encode(Stop("x")), reason=3), "Stop", "'reason'", "expected str")


def test_bad_rung():
    _raises(_with_header(encode(_chunk()), rung="turbo"), "ActionChunk", "rung", "turbo")
    with pytest.raises(WireError, match="rung"):
        encode(_cmd(rung="turbo"))


def test_wrong_frame_count():
    frames = encode(_obs())
    _raises(frames[:-1], "Observation", "frames")
    _raises([*frames, b""], "Observation", "frames")
    _raises([], "frames")
    _raises([frames[0]] + [b""] * 16, "frames")


def test_shape_too_large_fails_before_allocating():
    frames = encode(_cmd())
    arrays = [{"name": "q_rad", "dtype": "<f8", "shape": [10**9]}]
    _raises(_with_header(frames, arrays=arrays), "q_rad", "D=1000000000")


@pytest.mark.parametrize("shape", [[D, 1], [], [0], [65], ["7"], [True]])
def test_bad_shapes(shape):
    arrays = [{"name": "q_rad", "dtype": "<f8", "shape": shape}]
    _raises(_with_header(encode(_cmd()), arrays=arrays), "JointCommand", "q_rad", "shape")


def test_horizon_bounds_and_d_agreement():
    arrays = [{"name": "steps_rad", "dtype": "<f8", "shape": [257, D]}]
    _raises(_with_header(encode(_chunk()), arrays=arrays), "steps_rad", "H=257")
    with pytest.raises(WireError, match="disagrees"):
        encode(_obs(q_prev_rad=np.zeros(D + 1)))


def test_array_names_must_match():
    frames = encode(_cmd())
    arrays = [{"name": "qq", "dtype": "<f8", "shape": [D]}]
    _raises(_with_header(frames, arrays=arrays), "JointCommand", "arrays", "qq")


def test_encode_rejects_non_numeric_and_foreign_types():
    with pytest.raises(WireError, match="q_rad"):
        encode(_cmd(q_rad=np.array(["a"] * D)))
    with pytest.raises(WireError, match="field 'seq': cannot encode object"):
        encode(_cmd(seq=object()))
    with pytest.raises(WireError, match="field 'counters': cannot encode dict"):
        encode(Stats("runtime", 1, 2, 3, {"a": object()}, {}))
    with pytest.raises(WireError):
        encode({"schema": "edgeinfer.Stop"})


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64])
def test_numpy_scalars_encode_as_the_numbers_they_hold(dtype):
    out = decode(encode(_cmd(seq=dtype(5), obs_seq=np.int64(-1), rung=np.str_("hold"))))
    assert (out.seq, type(out.seq), out.rung) == (5, int, "hold")
    stats = Stats(np.str_("control"), np.int64(7), dtype(1), np.int64(2), {"ticks": dtype(9), np.str_("holds"): 0},
                  {"lat": list(np.array([1, 2, 3], dtype=dtype))})
    back = decode(encode(stats))
    assert (back.instance, back.counters, back.histograms) == (7, {"ticks": 9, "holds": 0}, {"lat": [1, 2, 3]})


def test_a_longdouble_is_a_float_to_the_field_checks_not_a_recursion():
    with pytest.raises(WireError, match=r"histograms.*expected int, got float"):  # longdouble.item() is a longdouble
        encode(Stats("control", 1, 2, 3, {}, {"lat": [np.longdouble(1.5)]}))


@pytest.mark.parametrize("numpy_value, python_value", [
    (np.uint64(2**63), 2**63),  # over int64: the receiver's range check
    (np.uint64(2**64 - 1), 2**64 - 1),
    (np.float32(1.0), 1.0),  # a float where an int is due
    (np.float64(2.5), 2.5),
    (np.bool_(True), True),  # bool is not int, on the wire as in Python
])
def test_numpy_scalars_out_of_range_or_of_the_wrong_type_get_the_python_error(numpy_value, python_value):
    with pytest.raises(WireError) as python_error:
        encode(_cmd(seq=python_value))
    with pytest.raises(WireError) as numpy_error:
        encode(_cmd(seq=numpy_value))
    assert str(numpy_error.value) == str(python_error.value) and "field 'seq'" in str(numpy_error.value)


finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


@settings(max_examples=50, deadline=None)
@given(d=st.integers(1, 64), h=st.integers(0, 24), data=st.data())
def test_round_trip_property(d, h, data):
    steps = data.draw(hnp.arrays(np.float64, (h, d), elements=finite))
    chunk = _chunk(steps_rad=steps, seq=data.draw(st.integers(-(2**63), 2**63 - 1)))
    _assert_same(chunk, decode(encode(chunk)))
    q = data.draw(hnp.arrays(hnp.floating_dtypes(endianness="?", sizes=(32, 64)), d,
                                elements={"allow_nan": False, "allow_infinity": False}))
    out = decode([bytes(f) for f in encode(_cmd(q_rad=q))])
    np.testing.assert_array_equal(out.q_rad, q.astype(np.float64))


def test_non_finite_joint_values_are_rejected():
    from edgeinfer.core.wire import Observation, WireError, decode, encode

    frames = encode(Observation(1, 2, np.zeros(6), np.zeros(6), np.zeros(6)))
    bad = np.zeros(6)
    bad[3] = np.nan
    frames[2] = bad.tobytes()
    with pytest.raises(WireError, match="qd_rad_s.*non-finite"):
        decode(frames)
