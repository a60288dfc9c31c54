"""The structure-aware generators of scripts/fuzz_nodes.py against the wire (decode raises only WireError, of the
kind each generator promises) and, in a short run of the script itself, against a live runtime and control loop:
no node exits, every frame is counted by kind, and every command the control loop sends is inside the limits."""
import importlib.util
import json
import random
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeinfer.control.safety import SafetyLimits
from edgeinfer.core import wire

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("fuzz_nodes", ROOT / "scripts" / "fuzz_nodes.py")
fuzz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz)

TEMPLATE = fuzz.observation(7, 10**12, np.full(6, 0.1), np.zeros(6), np.full(6, 0.1))
ERRORS = set(wire.ERROR_KINDS) - {"joints", "nonfinite"}  # what a malformed header can be counted as
# the kinds each generator's messages must be counted as
PROMISED = {"deep_nesting": ERRORS, "huge_declared": ERRORS, "bad_fields": {"field", "version", "schema"},
            "oversize": {"oversize"}, "many_frames": {"frames"}, "wrong_joints": {"joints"},
            "extreme_values": {"valid"}}


@pytest.mark.parametrize("where", ["header", "x", *msgpack.unpackb(TEMPLATE[0])])
@pytest.mark.parametrize("as_map", [False, True])
@pytest.mark.parametrize("depth", fuzz.DEPTHS + (900, 950, 999))
def test_deep_nesting_anywhere_is_a_wire_error(depth, as_map, where):
    # every depth and place, the band where Python's recursion limit is reached (900-1000) included: a receiver
    # catches WireError only, anything else stops the node
    inner = fuzz.nested(depth, as_map)
    header = inner if where == "header" else fuzz.header_with(TEMPLATE, where, inner)
    with pytest.raises(wire.WireError) as e:
        wire.decode([header, *TEMPLATE[1:]])
    assert e.value.kind in ERRORS


@pytest.mark.parametrize("where", ["header", *msgpack.unpackb(TEMPLATE[0])])
@pytest.mark.parametrize("declared", fuzz.HUGE)
def test_huge_declared_sizes_are_refused_without_allocating(declared, where):
    frames = [declared if where == "header" else fuzz.header_with(TEMPLATE, where, declared + b"\x00" * 8),
              *TEMPLATE[1:]]
    assert fuzz.classify(frames) in {"garbage", "truncated", "field"}


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), kind=st.sampled_from(fuzz.STRUCTURED), big=st.booleans())
def test_every_structured_frame_decodes_to_its_promised_kind(seed, kind, big):
    frames = fuzz.structured(kind, TEMPLATE, random.Random(seed), 8, 10**12, 2**20, big=big)
    assert fuzz.classify(frames) in PROMISED[kind]


def test_the_command_check_finds_each_violation():
    limits = SafetyLimits(q_min_rad=[-1.0] * 6, q_max_rad=[1.0] * 6, qd_max_rad_s=2.0)
    check = fuzz.CommandCheck(limits, 4_000_000)  # 2 rad/s over 4 ms: 8 mrad a tick

    def cmd(seq, q):
        return wire.JointCommand(seq, seq, seq, 0, np.asarray(q, dtype=np.float64), "full")

    check(cmd(0, [0.0] * 6))
    check(cmd(1, [0.008] * 6))  # the most one tick allows
    check(cmd(3, [0.024] * 6))  # two ticks later: twice that
    assert check.violations == {}
    check(cmd(4, [0.0330] * 6))  # 9 mrad in one tick
    check(cmd(5, [1.5] + [0.033] * 5))  # outside the box (and a jump)
    check(cmd(6, [0.0] * 3))  # three joints
    assert check.violations == {"velocity": 2, "position": 1, "joints": 1}
    assert check.checked == 6 and len(check.examples) == 4


@pytest.mark.slow
def test_a_short_fuzz_run_keeps_both_nodes_up_counting_and_inside_the_limits(tmp_path):
    # 13 generators x 200 rounds; RSS is not judged over so short a run (warm-up is most of it)
    frames = 200 * len(fuzz.GENERATORS)
    code = fuzz.main(["--frames", str(frames), "--seed", "5", "--rss-goal-mb", "1000", "--out", str(tmp_path)])
    r = json.loads((tmp_path / "fuzz.json").read_text())
    assert r["died"] == {} and r["stalled"] is None
    assert r["exit_codes"] == {"runtime": 0, "control": 0}
    assert r["frames"] == frames and all(sum(c.values()) == 200 for c in r["sent_by_generator"].values())
    assert not any(kind.startswith("crash:") for kind in r["sent"])
    for name, node in r["nodes"].items():
        assert node["counted"] == {**node["counted"], **node["expected"]} and node["match"], name
    assert r["nodes"]["control"]["joints"] == "checked"  # a wrong joint count never reaches the limit gate
    cmds = r["commands"]
    assert cmds["checked"] == r["commands_received"] > 0
    assert cmds["violations"] == {}, cmds["examples"]
    assert code == 0
