"""Fuzz the live nodes: a runtime node serving the null policy (RuntimeConfig(null_policy=True): a chunk holding
the observed position, at once, through the real node loop; no model, so what is fuzzed is the message path, not
inference) and a control loop without real-time priority, both started by edgeinfer.procs as a replay starts them,
get --frames mutated observation messages over their real ZeroMQ observation SUBs, as fast as --window lets them
go, with a valid observation between them whenever 4 ms (250 Hz, the control loop's rate) have passed (at most
250 Hz: after a wait, the next is not made up), and must keep running, count every frame by kind, and keep their
memory flat.

    .venv/bin/python scripts/fuzz_nodes.py                     # 10**6 frames; writes out/fuzz/fuzz.json
    .venv/bin/python scripts/fuzz_nodes.py --frames 100000 --seed 3

Mutations of a valid Observation's frames (header + three array frames), one kind per frame, round robin:
bitflip (1-4 bits anywhere), truncate (one frame cut short), extra_frames (1-3 random frames inserted),
missing_frames (1-3 frames removed), garbage (1-4 frames of random bytes), reorder (the frames permuted). Each
mutated message is decoded here first (edgeinfer.core.wire.decode): the WireError kind it must be counted as,
or "valid" (a flipped bit in an array value, two array frames swapped: an Observation the nodes count as one).

Sending is paced by the nodes' own counts (their Stats, every 50 ms): at most --window messages in flight, so that
no bounded queue drops one and each node's count must equal what was sent, kind by kind. Reports: frames sent by
mutation and by the kind they decode to; each node's counts per kind; RSS of each node at the start, after the
first tenth (warm) and at the end; chunks and commands the nodes sent while fuzzed; whether both were alive at the
end; their exit codes after a Stop. Exit status 1 when a node died or its exit code after the Stop is not 0, a
count differs, or RSS grew more than --rss-goal-mb after warm-up. Not run in CI: it sent 3,900 frames/s on a loaded
2-core machine (--frames 20000: 5.2 s of sending, 8.6 s in all), so the default 10**6 takes about 5 minutes.
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

import numpy as np
import psutil
import zmq

from edgeinfer.control.loop import ControlConfig
from edgeinfer.core import transport, wire
from edgeinfer.core.clock import now_ns
from edgeinfer.node.runtime import RuntimeConfig
from edgeinfer.procs.nodes import NodeGroup
from edgeinfer.procs.spec import NodeSpec

MUTATIONS = ("bitflip", "truncate", "extra_frames", "missing_frames", "garbage", "reorder")
PERIOD_NS = 4_000_000  # valid observations at 250 Hz, the control loop's rate
D = 6
STATS_MS = 50.0


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


def classify(frames: list[bytes]) -> str:
    """What a receiver counts this message as: a wire.ERROR_KINDS kind, or "valid"."""
    try:
        wire.decode(frames)
    except wire.WireError as e:
        return e.kind
    return "valid"


def counted(stats: wire.Stats | None) -> Counter:
    """A node's counts of observation-stream messages from its Stats: valid Observations and malformed per kind."""
    c = Counter()
    if stats is not None:
        c["valid"] = stats.counters.get("observations", 0)
        for kind in wire.ERROR_KINDS:
            c[kind] = stats.counters.get(f"malformed.{kind}", 0)
    return c


class Harness:
    """The replayer's side: observation PUB, ready PULL, chunk and status SUBs, command PULL."""

    def __init__(self, ctx: zmq.Context, ep: transport.Endpoints):
        self.obs = transport.pub(ctx, ep.obs, hwm=transport.LATEST_HWM)  # this side never drops: the nodes count
        self.ready = transport.Receiver(transport.pull(ctx, ep.ready, bind=True))
        self.chunks = transport.Receiver(transport.sub(ctx, ep.chunks, hwm=10_000))
        self.status = transport.Receiver(transport.sub(ctx, ep.status, hwm=10_000))
        self.commands = transport.Receiver(transport.pull(ctx, ep.commands, bind=True, hwm=10_000))
        self.stats: dict[str, wire.Stats] = {}
        self.n_chunks = self.n_commands = 0

    def take(self) -> None:
        """Everything the nodes sent: their newest Stats, chunks and commands counted."""
        for rx in (self.chunks, self.status, self.commands):
            for msg in rx.drain(limit=100_000):
                if isinstance(msg, wire.Stats):
                    self.stats[msg.sender] = msg
                self.n_chunks += isinstance(msg, wire.ActionChunk)
                self.n_commands += isinstance(msg, wire.JointCommand)

    def in_step(self) -> int:
        """Messages counted by both nodes (the slower one's count)."""
        return min(sum(counted(self.stats.get(n)).values()) for n in ("runtime", "control"))


def rss_mb(nodes) -> dict[str, float]:
    out = {}
    for node in nodes:
        try:
            out[node.name] = psutil.Process(node.pid).memory_info().rss / 2**20
        except psutil.Error:
            out[node.name] = float("nan")
    return out


def fuzz(args) -> dict:
    rng = random.Random(args.seed)
    ep = transport.Endpoints.free_loopback()
    args.out.mkdir(parents=True, exist_ok=True)
    runtime = RuntimeConfig(null_policy=True, runtime_stats_ms=STATS_MS, idle_timeout_s=600.0)
    control = ControlConfig(control_stats_ms=STATS_MS, realtime_priority=0)  # a neighbour on a shared machine
    specs = [NodeSpec("serve", (runtime, ep), "runtime", args.out / "runtime.log"),
             NodeSpec("control", (control, ep), "control", args.out / "control.log")]
    ctx = zmq.Context()
    sent_by_mutation = {m: Counter() for m in MUTATIONS}
    sent = Counter()  # by the kind each message decodes to
    rss: dict[str, dict] = {}
    with NodeGroup(grace_s=5.0) as group:
        procs = [group.start(spec) for spec in specs]
        try:
            h = Harness(ctx, ep)
            transport.wait_until_subscribed(h.obs, "replayer", h.ready, {"runtime", "control"}, 300.0,
                                            check=lambda: group.check_started(procs))
            transport.wait_for_hello([h.chunks], 60.0)
            t0 = now_ns() + 100_000_000
            transport.send(h.obs, wire.Start(t0, PERIOD_NS, 10**12))
            rss["start"] = rss_mb(procs)
            seq, next_obs_ns, t_start = 0, t0, time.monotonic()
            frames = wire.encode(wire.Observation(0, t0, np.zeros(D), np.zeros(D), np.zeros(D)))
            for i in range(args.frames):
                if now_ns() >= next_obs_ns:  # a valid observation on the schedule, and the next template
                    q = np.array([rng.uniform(-1, 1) for _ in range(D)])
                    frames = [bytes(f) for f in wire.encode(wire.Observation(seq, now_ns(), q, np.zeros(D), q))]
                    h.obs.send_multipart(frames)
                    sent["valid"] += 1
                    seq, next_obs_ns = seq + 1, max(next_obs_ns + PERIOD_NS, now_ns())
                kind = MUTATIONS[i % len(MUTATIONS)]
                bad = mutate(kind, frames, rng)
                decoded_as = classify(bad)
                h.obs.send_multipart(bad)
                sent[decoded_as] += 1
                sent_by_mutation[kind][decoded_as] += 1
                if i % 64 == 0:
                    while True:  # at most args.window messages in flight: no bounded queue drops one
                        h.take()
                        if sum(sent.values()) - h.in_step() < args.window:
                            break
                        time.sleep(0.002)
                        group.check_started(procs)  # a node that died ends the run here
                if i == args.frames // 10:
                    rss["warm"] = rss_mb(procs)
                if i % 100_000 == 0 and i:
                    rate = i / (time.monotonic() - t_start)
                    print(f"fuzz: {i} frames, {rate:.0f}/s, rss {rss_mb(procs)}", flush=True)
            send_s = time.monotonic() - t_start
            deadline = time.monotonic() + 60.0
            while h.in_step() < sum(sent.values()) and time.monotonic() < deadline:
                h.take()
                time.sleep(0.05)
            time.sleep(3 * STATS_MS / 1000)
            h.take()
            alive = {n.name: n.poll() is None for n in procs}
            rss["end"] = rss_mb(procs)
            n_chunks, n_commands = h.n_chunks, h.n_commands
            stop = wire.Stop("end of fuzz")
            transport.send(h.obs, stop)
            exit_codes = group.finish(procs, poke=lambda: transport.send(h.obs, stop))
            h.take()  # the final Stats
        finally:
            ctx.destroy(linger=0)
    nodes = {name: {"counted": dict(counted(h.stats.get(name))),
                    "counters": dict(sorted(h.stats[name].counters.items())) if name in h.stats else {}}
             for name in ("runtime", "control")}
    return {"frames": args.frames, "seed": args.seed, "send_s": send_s, "frames_per_s": args.frames / send_s,
            "sent": dict(sent), "sent_by_mutation": {m: dict(c) for m, c in sent_by_mutation.items()},
            "observations_sent": seq, "nodes": nodes, "rss_mb": rss, "alive_at_end": alive, "exit_codes": exit_codes,
            "chunks_received": n_chunks, "commands_received": n_commands}


def table(r: dict, goal_mb: float) -> tuple[str, bool]:
    kinds = ["valid", *wire.ERROR_KINDS]
    lines = [f"fuzz: {r['frames']} mutated frames + {r['observations_sent']} valid observations in "
             f"{r['send_s']:.1f} s ({r['frames_per_s']:.0f} frames/s), seed {r['seed']}", "",
             "frames sent, by mutation (rows) and the kind they decode to (columns)",
             f"{'mutation':<15}" + "".join(f"{k:>10}" for k in kinds) + f"{'total':>10}"]
    for m, c in r["sent_by_mutation"].items():
        lines.append(f"{m:<15}" + "".join(f"{c.get(k, 0):>10}" for k in kinds) + f"{sum(c.values()):>10}")
    lines.append(f"{'all (+valid)':<15}" + "".join(f"{r['sent'].get(k, 0):>10}" for k in kinds)
                 + f"{sum(r['sent'].values()):>10}")
    ok = True
    lines += ["", "counted by the nodes (Stats counters observations and malformed.<kind>)"]
    for name, node in r["nodes"].items():
        c = node["counted"]
        match = all(c.get(k, 0) == r["sent"].get(k, 0) for k in kinds)
        ok &= match
        lines.append(f"{name:<15}" + "".join(f"{c.get(k, 0):>10}" for k in kinds) + f"{sum(c.values()):>10}"
                     + ("   = sent" if match else "   DIFFERS from sent"))
    lines += ["", f"{'RSS MB':<15}{'start':>10}{'warm':>10}{'end':>10}{'growth':>10}{'alive':>8}{'exit':>6}"]
    for name in r["nodes"]:
        s, w, e = (r["rss_mb"].get(p, {}).get(name, float("nan")) for p in ("start", "warm", "end"))
        ok &= r["alive_at_end"][name] and r["exit_codes"][name] == 0 and e - w <= goal_mb
        lines.append(f"{name:<15}{s:>10.1f}{w:>10.1f}{e:>10.1f}{e - w:>+10.1f}{str(r['alive_at_end'][name]):>8}"
                     f"{r['exit_codes'][name]!s:>6}")
    lines += ["", f"while fuzzed: {r['chunks_received']} chunks from the runtime, {r['commands_received']} commands "
                  "from the control loop", "verdict: " + ("PASS" if ok else "FAIL")]
    return "\n".join(lines), ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=10**6, help="mutated frames to send (default 10**6)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the mutations (default 0)")
    ap.add_argument("--window", type=int, default=4000,
                    help="messages in flight at most, below every queue's HWM (default 4000)")
    ap.add_argument("--rss-goal-mb", type=float, default=5.0,
                    help="RSS growth allowed from warm (a tenth in) to the end, MB (default 5)")
    ap.add_argument("--out", type=Path, default=Path("out/fuzz"), help="output folder (default out/fuzz)")
    args = ap.parse_args()
    if args.frames < 1 or not 0 < args.window < transport.LATEST_HWM:
        ap.error(f"need --frames >= 1 and 0 < --window < {transport.LATEST_HWM}")
    report = fuzz(args)
    text, ok = table(report, args.rss_goal_mb)
    print(text)
    (args.out / "fuzz.json").write_text(json.dumps({**report, "pass": ok}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
