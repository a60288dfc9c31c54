"""Fuzz the live nodes: a runtime node serving the null policy (RuntimeConfig(null_policy=True): a chunk holding
the observed position, at once, through the real node loop; no model, so what is fuzzed is the message path, not
inference) and a control loop without real-time priority, both started by edgeinfer.procs as a replay starts them,
get --frames hostile observation messages over their real ZeroMQ observation SUBs, as fast as --window lets them
go, with a valid observation between them whenever 4 ms (250 Hz, the control loop's rate) have passed (at most
250 Hz: after a wait, the next is not made up), and must keep running, count every frame by kind, keep their
memory flat, and command the arm only inside its limits.

    .venv/bin/python scripts/fuzz_nodes.py                     # 10**6 frames; writes out/fuzz/fuzz.json
    .venv/bin/python scripts/fuzz_nodes.py --frames 100000 --seed 3

One generator per frame, round robin over GENERATORS. Mutations of a valid Observation's frames (header + three
array frames): bitflip (1-4 bits anywhere), truncate (one frame cut short), extra_frames (1-3 random frames
inserted), missing_frames (1-3 frames removed), garbage (1-4 frames of random bytes), reorder (the frames
permuted). Structure-aware frames (raw msgpack, so that no generator recurses): deep_nesting (lists or maps 1 to
5,000 levels deep, as the header or inside a field), huge_declared (array32 / map32 / str32 / bin32 / ext32 headers
declaring 2**32-1 elements in a few bytes, a shape of 2**32-1), bad_fields (a field of the wrong type, out of
int64, a 5,000-character schema, unknown or missing fields, another dtype or version), oversize (a header over
wire.MAX_HEADER_BYTES, an array frame too long, and every OVERSIZE_BIG_EVERY-th one an array frame of
--oversize-mb, above the 4 MiB that used to cut a subscriber's link), many_frames (17 to 300 frames),
wrong_joints (valid Observations of 1, 3 or 7 joints for the 6-joint arm) and extreme_values (valid 6-joint
Observations holding 1e6, 1e39, 5 rad, -0.0, subnormals, the largest float, t_ns at either end of int64 or
10**15 ns away, seq near 2**63). The fresh Observations are stamped now, so that the runtime serves them and the
control loop gets their chunks.

Each message is decoded here first (edgeinfer.core.wire.decode, then wire.check_joints for the arm's 6 joints
when the wire has it): the wire.ERROR_KINDS kind it must be counted as, or "valid". A receiver without a joint
check counts a wrong_joints Observation as valid, and the runtime then plans from it: the control loop's count
of malformed "joints" includes those chunks (counted here on the chunk SUB).

Sending is paced by the nodes' own counts (their Stats, every 50 ms): at most --window messages in flight, so that
no bounded queue drops one and each node's count must equal what was sent, kind by kind. Every JointCommand the
control loop sends is received here (the commands PULL) and checked: 6 joints, finite, inside the position box,
and a step from the previous command within qd_max * the ticks between them (at most max(dt_max_s, period): the
limit gate's own rule, control/command.py); every miss is a violation. Reports: frames sent by generator and by
the kind they decode to; each node's counts per kind; RSS of each node at the start, after the first tenth (warm)
and at the end; chunks and commands the nodes sent while fuzzed; commands checked and violations by kind; whether
both were alive at the end (a node that dies, or counts that stop moving for --stall-s, ends the sending);
their exit codes after a Stop. Exit status 1 when a node died or its exit code after the Stop is not 0, a count
differs, a command violated the limits, or RSS grew more than --rss-goal-mb after warm-up. Not run in CI (a short
run of the same generators is, tests/test_fuzz_structured.py): on a loaded 2-core machine the mutations alone went
at 3,900 frames/s (--frames 20000: 5.2 s of sending, 8.6 s in all), so the default 10**6 takes several minutes.
"""
from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

import msgpack
import numpy as np
import psutil
import zmq

from edgeinfer.control.limits import resolve_limits
from edgeinfer.control.loop import ControlConfig
from edgeinfer.control.safety import SafetyLimits
from edgeinfer.core import transport, wire
from edgeinfer.core.clock import now_ns
from edgeinfer.node.runtime import RuntimeConfig
from edgeinfer.procs.node_spec import NodeSpec
from edgeinfer.procs.nodes import NodeGroup

MUTATIONS = ("bitflip", "truncate", "extra_frames", "missing_frames", "garbage", "reorder")
STRUCTURED = ("deep_nesting", "huge_declared", "bad_fields", "oversize", "many_frames", "wrong_joints",
              "extreme_values")
GENERATORS = MUTATIONS + STRUCTURED
PERIOD_NS = 4_000_000  # valid observations at 250 Hz, the control loop's rate
D = 6
STATS_MS = 50.0
OVERSIZE_BIG_EVERY = 64  # one oversize frame in this many is --oversize-mb: a 10**6 run sends about 1,200 of them
# Nesting depths. Python's recursion limit (1000) is reached by the decoder's error path somewhere between about
# 900 and 1000 levels, depending on how deep the caller's own stack is, so a header of that depth may be counted as
# another kind by a node than here: the depths stay clear of that band on both sides.
DEPTHS = (1, 2, 16, 100, 500, 1000, 1024, 1025, 2000, 5000)
# 2**32-1 elements declared in a few bytes: array32, map32, str32, bin32, ext32 (type 1)
HUGE = (b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff",
        b"\xc9\xff\xff\xff\xff\x01")
EXTREMES = (1e6, -1e6, 1e39, -1e39, 5.0, -5.0, -0.0, 0.0, 5e-324, -5e-324, 2.2250738585072014e-308,
            1.7976931348623157e308, -1.7976931348623157e308)


def mutate(kind: str, frames: list[bytes], rng: random.Random) -> list[bytes]:
    """A mutated copy of a message's frames (never zero frames: ZMQ cannot send an empty multipart)."""
    f = list(frames)
    if kind == "bitflip":
        flat, ends = bytearray(b"".join(f)), list(itertools.accumulate(len(x) for x in f))
        for _ in range(rng.randint(1, 4)):
            bit = rng.randrange(8 * len(flat))
            flat[bit // 8] ^= 1 << (bit % 8)
        f = [bytes(flat[a:b]) for a, b in zip([0, *ends[:-1]], ends)]
    elif kind == "truncate":
        i = rng.randrange(len(f))
        f[i] = f[i][: rng.randrange(len(f[i]))] if f[i] else f[i]
    elif kind == "extra_frames":
        for _ in range(rng.randint(1, 3)):
            f.insert(rng.randint(0, len(f)), rng.randbytes(rng.randint(0, 64)))
    elif kind == "missing_frames":
        for _ in range(min(rng.randint(1, 3), len(f) - 1)):
            del f[rng.randrange(len(f))]
    elif kind == "garbage":
        f = [rng.randbytes(rng.randint(0, 199)) for _ in range(rng.randint(1, 4))]
    elif kind == "reorder":
        order = list(range(len(f)))
        while order == sorted(order):
            rng.shuffle(order)
        f = [f[i] for i in order]
    return f


def raw_map(items: list[tuple[str, bytes]]) -> bytes:
    """A msgpack map (map16) of already-packed values: lets a generator place raw bytes inside a header."""
    return b"\xde" + len(items).to_bytes(2, "big") + b"".join(msgpack.packb(k) + v for k, v in items)


def nested(depth: int, as_map: bool) -> bytes:
    """`depth` lists of one element ([[[...nil]]]) or maps of one entry ({"a": {"a": ...nil}}), without recursing."""
    return (b"\x81\xa1a" if as_map else b"\x91") * depth + b"\xc0"


def header_with(frames: list[bytes], field: str, value: bytes) -> bytes:
    """The header of `frames` (an Observation's) with `field` set to the packed `value` (added when absent)."""
    header = {k: msgpack.packb(v) for k, v in msgpack.unpackb(frames[0]).items()}
    return raw_map(list({**header, field: value}.items()))


def observation(seq: int, t_ns: int, q: np.ndarray, qd: np.ndarray, q_prev: np.ndarray) -> list[bytes]:
    return [bytes(f) for f in wire.encode(wire.Observation(seq, t_ns, q, qd, q_prev))]


def structured(kind: str, frames: list[bytes], rng: random.Random, seq: int, t_ns: int,
               oversize_bytes: int, big: bool) -> list[bytes]:
    """One structure-aware message of generator `kind`, built from `frames` (a valid Observation's) or, for
    wrong_joints and extreme_values, a fresh Observation at `seq`, `t_ns` (ns). `big`: the oversize frame is
    `oversize_bytes` long. Raises ValueError for an unknown kind."""
    fields = list(msgpack.unpackb(frames[0]))
    arrays = frames[1:]
    if kind == "deep_nesting":
        inner = nested(rng.choice(DEPTHS), rng.random() < 0.5)
        where = rng.choice(["header", "x", *fields])
        return [inner if where == "header" else header_with(frames, where, inner), *arrays]
    if kind == "huge_declared":
        declared = rng.choice(HUGE) + rng.randbytes(rng.randint(0, 16))
        where = rng.choice(["header", "key", "shape", *fields])
        if where == "header":
            return [declared, *arrays]
        if where == "key":  # a map whose next key declares 2**32-1 bytes
            return [b"\x83" + msgpack.packb("schema") + msgpack.packb("edgeinfer.Observation") + declared, *arrays]
        if where == "shape":
            meta = {"name": "q_rad", "dtype": "<f8", "shape": [rng.choice([2**32 - 1, 2**63 - 1])]}
            return [header_with(frames, "arrays", msgpack.packb([meta] * 3)), *arrays]
        return [header_with(frames, where, declared), *arrays]
    if kind == "bad_fields":
        field, value = rng.choice([
            ("seq", True), ("seq", 1.5), ("seq", "0"), ("seq", None), ("seq", 2**64 - 1), ("t_ns", 2**64 - 1),
            ("t_ns", [1, 2]), ("version", 2), ("version", -1), ("schema", "edgeinfer.Observation" + "x" * 5000),
            ("schema", "edgeinfer.Unknown"), ("schema", 7), ("x", 1), ("arrays", {}), ("arrays", [])])
        if rng.random() < 0.2:  # a required field missing
            header = msgpack.unpackb(frames[0])
            del header[rng.choice(["seq", "t_ns", "version", "arrays"])]
            return [msgpack.packb(header), *arrays]
        return [header_with(frames, field, msgpack.packb(value)), *arrays]
    if kind == "oversize":
        if big:
            return [frames[0], rng.randbytes(64) * (oversize_bytes // 64 + 1), *arrays[1:]]
        if rng.random() < 0.5:  # a header over MAX_HEADER_BYTES: a long unknown field
            return [header_with(frames, "x", msgpack.packb("x" * (wire.MAX_HEADER_BYTES + rng.randint(0, 4096)))),
                    *arrays]
        i = rng.randrange(len(arrays))
        return [frames[0], *arrays[:i], arrays[i] + rng.randbytes(8 * rng.randint(1, 512)), *arrays[i + 1:]]
    if kind == "many_frames":
        n = rng.randint(wire.MAX_FRAMES + 1, 300)
        filler = [rng.randbytes(rng.randint(0, 64)) for _ in range(n - len(frames))]
        return frames + filler if rng.random() < 0.5 else [rng.randbytes(48) for _ in range(n)]
    if kind == "wrong_joints":
        n = rng.choice([1, 3, 7])
        q = np.array([rng.uniform(-1, 1) for _ in range(n)])
        return observation(seq, t_ns, q, np.zeros(n), q)
    if kind == "extreme_values":
        q, qd, q_prev = (np.array([rng.choice(EXTREMES) for _ in range(D)]) for _ in range(3))
        t = rng.choice([t_ns] * 6 + [2**63 - 1, -2**63, 0, t_ns + 10**15, t_ns - 10**15])
        s = rng.choice([seq] * 6 + [2**63 - 1 - rng.randrange(1000), -2**63])
        return observation(s, t, q, qd, q_prev)
    raise ValueError(f"generator {kind!r}: expected one of {GENERATORS}")


def classify(frames: list[bytes], joints: int | None = D) -> str:
    """What a receiver checking `joints` (None: none) counts this message as: a wire.ERROR_KINDS kind, or "valid";
    "crash:<error>" when decoding raised anything but WireError (what no receiver catches: the node would exit)."""
    check = getattr(wire, "check_joints", None)  # the entry check, where the wire has it
    try:
        msg = wire.decode(frames)
        if check is not None and joints is not None:
            check(msg, joints)
    except wire.WireError as e:
        return e.kind
    except Exception as e:  # noqa: BLE001 - any other error is the finding: name it, the node counts nothing
        return f"crash:{type(e).__name__}"
    return "valid"


def counted(stats: wire.Stats | None) -> Counter:
    """A node's counts of observation-stream messages from its Stats: valid Observations and malformed per kind."""
    c = Counter()
    if stats is not None:
        c["valid"] = stats.counters.get("observations", 0)
        for kind in wire.ERROR_KINDS:
            c[kind] = stats.counters.get(f"malformed.{kind}", 0)
    return c


class CommandCheck:
    """Every JointCommand against the limits the control loop was given (SafetyLimits, resolved): D joints, finite,
    inside [q_min, q_max], and |q - q_prev| <= qd_max * min(ticks between them * period, max(dt_max_s, period))
    (1e-9 rad of rounding allowed). Violations counted by kind; the first few kept as examples."""

    def __init__(self, limits: SafetyLimits, period_ns: int):
        self.lo, self.hi = np.asarray(limits.q_min_rad), np.asarray(limits.q_max_rad)
        self.qd_max = np.broadcast_to(np.asarray(limits.qd_max_rad_s, dtype=np.float64), self.lo.shape)
        self.period_s, self.dt_max_s = period_ns / 1e9, max(limits.dt_max_s, period_ns / 1e9)
        self.checked, self.violations, self.examples = 0, Counter(), []
        self.last: wire.JointCommand | None = None

    def __call__(self, cmd: wire.JointCommand) -> None:
        self.checked += 1
        q = cmd.q_rad
        if q.shape != self.lo.shape:
            self._violation("joints", cmd, f"{q.shape[0]} joints")
            return
        if not np.all(np.isfinite(q)):
            self._violation("nonfinite", cmd, "non-finite")
        elif np.any((q < self.lo - 1e-9) | (q > self.hi + 1e-9)):
            self._violation("position", cmd, f"q {q.tolist()} outside the box")
        if self.last is not None:
            ticks = cmd.seq - self.last.seq
            dt_s = min(ticks * self.period_s, self.dt_max_s) if ticks > 0 else 0.0
            step = np.abs(q - self.last.q_rad)
            if np.any(step > self.qd_max * dt_s + 1e-9) or not np.all(np.isfinite(step)):
                self._violation("velocity", cmd, f"step {step.max():.3g} rad over {ticks} tick(s)")
        self.last = cmd

    def _violation(self, kind: str, cmd: wire.JointCommand, what: str) -> None:
        self.violations[kind] += 1
        if len(self.examples) < 10:
            self.examples.append(f"command {cmd.seq} (obs {cmd.obs_seq}, rung {cmd.rung}): {what}")

    def report(self) -> dict:
        return {"checked": self.checked, "violations": dict(self.violations), "examples": self.examples}


class Harness:
    """The replayer's side: observation PUB, ready PULL, chunk and status SUBs, command PULL."""

    def __init__(self, ctx: zmq.Context, ep: transport.Endpoints, check: CommandCheck):
        self.obs = transport.pub(ctx, ep.obs, hwm=transport.LATEST_HWM)  # this side never drops: the nodes count
        self.ready = transport.Receiver(transport.pull(ctx, ep.ready, bind=True))
        self.chunks = transport.Receiver(transport.sub(ctx, ep.chunks, hwm=10_000))
        self.status = transport.Receiver(transport.sub(ctx, ep.status, hwm=10_000))
        self.commands = transport.Receiver(transport.pull(ctx, ep.commands, bind=True, hwm=10_000))
        self.check = check
        self.stats: dict[str, wire.Stats] = {}
        self.n_chunks = self.n_commands = self.wrong_joint_chunks = 0

    def take(self) -> None:
        """Everything the nodes sent: their newest Stats, chunks counted, commands counted and checked."""
        for rx in (self.chunks, self.status, self.commands):
            for msg in rx.drain(limit=100_000):
                if isinstance(msg, wire.Stats):
                    self.stats[msg.sender] = msg
                elif isinstance(msg, wire.ActionChunk):
                    self.n_chunks += 1
                    self.wrong_joint_chunks += msg.steps_rad.shape[1] != D
                elif isinstance(msg, wire.JointCommand):
                    self.n_commands += 1
                    self.check(msg)

    def in_step(self) -> int:
        """Observation messages counted by both nodes (the slower one's count). The control loop's count includes
        the wrong-joint chunks it refused (not sent here): left out, or its queue could pass its HWM unseen."""
        runtime, control = (sum(counted(self.stats.get(n)).values()) for n in ("runtime", "control"))
        return min(runtime, control - self.wrong_joint_chunks)


def expected_counts(sent: Counter, node: str, got: Counter, wrong_joint_chunks: int) -> tuple[Counter, str]:
    """What `node` must have counted, kind by kind, and how it treats a wrong joint count: "checked" (malformed
    "joints"), "unchecked" (a valid Observation: the runtime without a policy joint count) or "no joints kind"
    (a wire without the check). The control loop must check them; its "joints" count includes the wrong-D chunks."""
    want = Counter(sent)
    if "joints" not in wire.ERROR_KINDS:
        return want, "no joints kind"
    if node == "runtime" and got["joints"] == 0 and sent["joints"]:
        want["valid"] += want.pop("joints")
        return want, "unchecked"
    if node == "control":
        want["joints"] += wrong_joint_chunks
    return want, "checked"


def rss_mb(nodes) -> dict[str, float]:
    out = {}
    for node in nodes:
        try:
            out[node.name] = psutil.Process(node.pid).memory_info().rss / 2**20
        except psutil.Error:
            out[node.name] = float("nan")
    return out


class Sending:
    """What fuzz's send loop sent (by the kind each message decodes to, overall and per generator) and saw: the
    nodes that died, or what they had counted when their counts stalled (wait_for_window). A plain class, not a
    dataclass: the tests load this script without registering it as a module."""

    def __init__(self, generators: tuple[str, ...]):
        self.sent = Counter()
        self.by_generator = {g: Counter() for g in generators}
        self.n_valid = 0  # valid observations on the schedule
        self.frames = 0  # hostile frames sent
        self.send_s = 0.0
        self.died: dict = {}
        self.stalled: dict | None = None


def fuzz(args) -> dict:
    rng = random.Random(args.seed)
    ep = transport.Endpoints.free_loopback()
    args.out.mkdir(parents=True, exist_ok=True)
    # replan at every observation: as many of the hostile ones as possible become chunks for the control loop
    runtime = RuntimeConfig(null_policy=True, runtime_stats_ms=STATS_MS, idle_timeout_s=600.0, replan_every_ticks=1)
    limits = resolve_limits(SafetyLimits()).limits  # the control loop's defaults, given explicitly: one source
    control = ControlConfig(control_stats_ms=STATS_MS, realtime_priority=0, limits=limits)  # a shared machine
    specs = [NodeSpec("serve", (runtime, ep), "runtime", args.out / "runtime.log"),
             NodeSpec("control", (control, ep), "control", args.out / "control.log")]
    ctx = zmq.Context()
    check = CommandCheck(limits, PERIOD_NS)
    rss: dict[str, dict] = {}
    with NodeGroup(grace_s=5.0) as group:
        procs = [group.start(spec) for spec in specs]
        try:
            h = Harness(ctx, ep, check)
            transport.wait_until_subscribed(h.obs, "replayer", h.ready, {"runtime", "control"}, 300.0,
                                            check=lambda: group.check_started(procs))
            transport.wait_for_hello([h.chunks], 60.0)
            t0 = now_ns() + 100_000_000
            transport.send(h.obs, wire.Start(t0, PERIOD_NS, 10**12))
            rss["start"] = rss_mb(procs)
            sending = send_frames(args, h, procs, rng, t0, rss)
            end = settle(h, group, procs, sending, rss)
        finally:
            ctx.destroy(linger=0)
    sent = sending.sent
    return {"frames": sending.frames, "frames_asked": args.frames, "seed": args.seed, "send_s": sending.send_s,
            "frames_per_s": sending.frames / sending.send_s, "sent": dict(sent),
            "sent_by_generator": {g: dict(c) for g, c in sending.by_generator.items()},
            "observations_sent": sending.n_valid, "nodes": node_reports(h, sent), "rss_mb": rss, **end,
            "stalled": sending.stalled, "chunks_received": h.n_chunks, "wrong_joint_chunks": h.wrong_joint_chunks,
            "commands_received": h.n_commands, "commands": check.report(),
            "limits": {k: getattr(limits, k) for k in ("q_min_rad", "q_max_rad", "qd_max_rad_s", "dt_max_s")}}


def send_frames(args, h: Harness, procs, rng: random.Random, t0: int, rss: dict) -> Sending:
    """Send args.frames hostile frames, one generator after another, with a valid observation whenever one is due
    (every PERIOD_NS from t0), never more than args.window in flight; stop early when a node dies or stalls."""
    sending = Sending(args.generators)
    sent, n_oversize, oversize_bytes = sending.sent, 0, int(args.oversize_mb * 2**20)
    seq, next_obs_ns, t_start = 0, t0, time.monotonic()
    frames = observation(0, t0, np.zeros(D), np.zeros(D), np.zeros(D))
    i = 0
    for i in range(args.frames):
        if now_ns() >= next_obs_ns:  # a valid observation on the schedule, and the next template
            q = np.array([rng.uniform(-1, 1) for _ in range(D)])
            frames = observation(seq, now_ns(), q, np.zeros(D), q)
            h.obs.send_multipart(frames)
            sent["valid"] += 1
            sending.n_valid += 1
            seq, next_obs_ns = seq + 1, max(next_obs_ns + PERIOD_NS, now_ns())
        kind = args.generators[i % len(args.generators)]
        if kind in MUTATIONS:
            bad = mutate(kind, frames, rng)
        else:
            n_oversize += kind == "oversize"
            bad = structured(kind, frames, rng, seq, now_ns(), oversize_bytes,
                             big=kind == "oversize" and n_oversize % OVERSIZE_BIG_EVERY == 1)
            seq += kind in ("wrong_joints", "extreme_values")  # fresh observations take a seq of their own
        decoded_as = classify(bad)
        h.obs.send_multipart(bad)
        sent[decoded_as] += 1
        sending.by_generator[kind][decoded_as] += 1
        if i % 64 == 0:
            sending.stalled = wait_for_window(h, procs, sum(sent.values()), args)
            sending.died = {n.name: n.poll() for n in procs if n.poll() is not None}
            if sending.died or sending.stalled:
                break
        if i == args.frames // 10:
            rss["warm"] = rss_mb(procs)
        if i % 100_000 == 0 and i:
            rate = i / (time.monotonic() - t_start)
            print(f"fuzz: {i} frames, {rate:.0f}/s, rss {rss_mb(procs)}", flush=True)
    sending.frames = i + 1
    sending.send_s = time.monotonic() - t_start
    return sending


def settle(h: Harness, group: NodeGroup, procs, sending: Sending, rss: dict) -> dict:
    """Wait (60 s, 5 s after a death or stall) for the nodes to count what was sent, take their final Stats, and
    stop them. Returns the report's alive_at_end, exit_codes, died and died_log_tail."""
    deadline = time.monotonic() + (5.0 if sending.died or sending.stalled else 60.0)
    while h.in_step() < sum(sending.sent.values()) and time.monotonic() < deadline:
        h.take()
        time.sleep(0.05)
    time.sleep(3 * STATS_MS / 1000)
    h.take()
    alive = {n.name: n.poll() is None for n in procs}
    died = {n.name: n.poll() for n in procs if n.poll() is not None}
    rss["end"] = rss_mb(procs)
    stop = wire.Stop("end of fuzz")
    transport.send(h.obs, stop)
    exit_codes = group.finish(procs, poke=lambda: transport.send(h.obs, stop))
    h.take()  # the final Stats, the last commands
    tails = {n.name: n.exit_report()[1][-2000:] for n in procs if n.name in died}
    return {"alive_at_end": alive, "exit_codes": exit_codes, "died": died, "died_log_tail": tails}


def node_reports(h: Harness, sent: Counter) -> dict:
    """Per node: what it counted against what it must have counted (expected_counts), and its counters."""
    nodes = {}
    for name in ("runtime", "control"):
        got = counted(h.stats.get(name))
        want, joints = expected_counts(sent, name, got, h.wrong_joint_chunks)
        nodes[name] = {"counted": dict(got), "expected": dict(want), "joints": joints,
                       "match": all(got[k] == want[k] for k in set(got) | set(want)),
                       "counters": dict(sorted(h.stats[name].counters.items())) if name in h.stats else {}}
    return nodes


def wait_for_window(h: Harness, procs, n_sent: int, args) -> dict | None:
    """Wait until fewer than args.window messages are in flight (no bounded queue drops one). Returns None, or
    what the nodes had counted when their counts stopped moving for args.stall_s (a lost link, a wedged node) or
    a node exited."""
    last, t_moved = -1, time.monotonic()
    while True:
        h.take()
        done = h.in_step()
        if n_sent - done < args.window or any(n.poll() is not None for n in procs):
            return None
        if done != last:
            last, t_moved = done, time.monotonic()
        elif time.monotonic() - t_moved > args.stall_s:
            return {"sent": n_sent,
                    "counted": {n: sum(counted(h.stats.get(n)).values()) for n in ("runtime", "control")}}
        time.sleep(0.002)


def table(r: dict, goal_mb: float) -> tuple[str, bool]:
    kinds = ["valid", *wire.ERROR_KINDS, *sorted(k for k in r["sent"] if k.startswith("crash:"))]
    lines = [f"fuzz: {r['frames']} of {r['frames_asked']} hostile frames + {r['observations_sent']} valid "
             f"observations in {r['send_s']:.1f} s ({r['frames_per_s']:.0f} frames/s), seed {r['seed']}", "",
             "frames sent, by generator (rows) and the kind they decode to (columns)",
             f"{'generator':<15}" + "".join(f"{k:>10}" for k in kinds) + f"{'total':>10}"]
    for g, c in r["sent_by_generator"].items():
        lines.append(f"{g:<15}" + "".join(f"{c.get(k, 0):>10}" for k in kinds) + f"{sum(c.values()):>10}")
    lines.append(f"{'all (+valid)':<15}" + "".join(f"{r['sent'].get(k, 0):>10}" for k in kinds)
                 + f"{sum(r['sent'].values()):>10}")
    ok = not r["died"] and not r["stalled"]
    lines += ["", "counted by the nodes (Stats counters observations and malformed.<kind>)"]
    for name, node in r["nodes"].items():
        c, want = node["counted"], node["expected"]
        ok &= node["match"]
        lines.append(f"{name:<15}" + "".join(f"{c.get(k, 0):>10}" for k in kinds) + f"{sum(c.values()):>10}"
                     + ("   = expected" if node["match"] else "   DIFFERS from expected")
                     + f" (wrong joint counts: {node['joints']})")
        if not node["match"]:
            lines.append(f"{'  expected':<15}" + "".join(f"{want.get(k, 0):>10}" for k in kinds))
    if r["wrong_joint_chunks"]:
        lines.append(f"(the control loop's joints include {r['wrong_joint_chunks']} chunks of another joint count)")
    lines += ["", f"{'RSS MB':<15}{'start':>10}{'warm':>10}{'end':>10}{'growth':>10}{'alive':>8}{'exit':>6}"]
    for name in r["nodes"]:
        s, w, e = (r["rss_mb"].get(p, {}).get(name, float("nan")) for p in ("start", "warm", "end"))
        ok &= r["alive_at_end"][name] and r["exit_codes"][name] == 0 and e - w <= goal_mb
        lines.append(f"{name:<15}{s:>10.1f}{w:>10.1f}{e:>10.1f}{e - w:>+10.1f}{str(r['alive_at_end'][name]):>8}"
                     f"{r['exit_codes'][name]!s:>6}")
    for name, code in r["died"].items():
        lines.append(f"{name} DIED (exit {code}); its log ends:\n{r['died_log_tail'].get(name, '')}")
    if r["stalled"]:
        lines.append(f"STALLED: counts stopped moving: {r['stalled']}")
    cmds = r["commands"]
    ok &= not cmds["violations"]
    lines += ["", f"while fuzzed: {r['chunks_received']} chunks from the runtime, {r['commands_received']} commands "
                  f"from the control loop; {cmds['checked']} commands checked against the limits, violations: "
                  f"{cmds['violations'] or 'none'}", *cmds["examples"], "verdict: " + ("PASS" if ok else "FAIL")]
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=10**6, help="hostile frames to send (default 10**6)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the generators (default 0)")
    ap.add_argument("--window", type=int, default=4000,
                    help="messages in flight at most, below every queue's HWM (default 4000)")
    ap.add_argument("--rss-goal-mb", type=float, default=5.0,
                    help="RSS growth allowed from warm (a tenth in) to the end, MB (default 5)")
    ap.add_argument("--oversize-mb", type=float, default=5.0,
                    help="the big oversize frame, MiB (default 5: over the old 4 MiB link cap)")
    ap.add_argument("--stall-s", type=float, default=20.0,
                    help="counts that do not move for this long end the sending as a failure, s (default 20)")
    ap.add_argument("--generators", type=lambda text: tuple(text.split(",")), default=GENERATORS,
                    help=f"comma-separated generators, round robin (default all: {','.join(GENERATORS)})")
    ap.add_argument("--out", type=Path, default=Path("out/fuzz"), help="output folder (default out/fuzz)")
    args = ap.parse_args(argv)
    if args.frames < 1 or not 0 < args.window < transport.LATEST_HWM:
        ap.error(f"need --frames >= 1 and 0 < --window < {transport.LATEST_HWM}")
    if unknown := set(args.generators) - set(GENERATORS):
        ap.error(f"--generators: unknown {sorted(unknown)}, expected some of {','.join(GENERATORS)}")
    report = fuzz(args)
    text, ok = table(report, args.rss_goal_mb)
    print(text)
    (args.out / "fuzz.json").write_text(json.dumps({**report, "pass": ok}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
