"""Soak test: replay real Schunk runs chained into one long log (30 minutes at 250 Hz by default) through the
real runtime and control processes, and report what drifts over a long run.

    .venv/bin/python scripts/soak.py                      # 30 min; writes out/soak/soak.json
    .venv/bin/python scripts/soak.py --minutes 2 -- --deadline-ms 6     # options after -- go to `edgeinfer replay`

Reports:
- RSS of every process of the run (replayer, runtime, control loop), sampled every --sample-s; the growth of
  each from the first sample after warm-up to the last taken while every process ran (goal: < 5 MB for every
  process; the replayer's recording is sized at the start, sim/received.py, so its growth is also given per tick);
- miss rate and latency p50/p99/p999 in the first and in the last --window-min minutes (goal: no drift: the
  last window's miss rate within the first's 95% interval and p99 within 1.2x);
- every counter of every node at the end of the run (report.json's node_stats).
Not run in CI: it takes as long as the log. Exit status 1 when a goal is missed.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
from scipy.stats import binomtest

RSS_GROWTH_GOAL_MB = 5.0
P99_DRIFT_GOAL = 1.2


def chain_runs(data: Path, minutes: float, out: Path) -> int:
    """Write a Schunk measurement folder (time.csv, trajectory.csv) at `out` chaining the runs under `data`, in
    name order and again from the first, until `minutes` of recorded time. Each run keeps its own sample spacing;
    the next starts one period after the previous ends (a jump in position, as after a restart of the arm's
    program). Returns the row count. Raises FileNotFoundError when `data` has no measurement folder."""
    runs = sorted(p for p in data.iterdir() if (p / "trajectory.csv").is_file())
    if not runs:
        raise FileNotFoundError(f"no measurement folder (time.csv + trajectory.csv) under {data}")
    times, trajs, end, i = [], [], 0.0, 0
    while end < minutes * 60:
        run = runs[i % len(runs)]
        t = np.loadtxt(run / "time.csv", delimiter=",", ndmin=1)
        times.append(t - t[0] + end)
        trajs.append(np.loadtxt(run / "trajectory.csv", delimiter=",", ndmin=2))
        end = times[-1][-1] + float(np.median(np.diff(t)))
        i += 1
    t, traj = np.concatenate(times), np.concatenate(trajs)
    keep = t < minutes * 60
    out.mkdir(parents=True, exist_ok=True)
    np.savetxt(out / "time.csv", t[keep], fmt="%.6f")
    np.savetxt(out / "trajectory.csv", traj[keep], delimiter=",", fmt="%.8g")
    return int(keep.sum())


def role(proc: psutil.Process) -> str:
    """A process's part in the run, from its command line: 'edgeinfer replay', 'edgeinfer serve', ..."""
    try:
        args = proc.cmdline()
    except psutil.Error:
        return "?"
    words = [a for a in args if not a.startswith("-") and "python" not in Path(a).name]
    return " ".join(words[:2]) or proc.name()


def sample_rss(root: psutil.Process) -> dict[str, float]:
    """RSS in MB of root and all its descendants, keyed 'role pid'."""
    rss = {}
    for p in [root, *root.children(recursive=True)]:
        try:
            rss[f"{role(p)} {p.pid}"] = p.memory_info().rss / 2**20
        except psutil.Error:
            pass
    return rss


def window_figures(ticks: Path, rate_hz: float, window_min: float) -> dict:
    """Miss rate (with its 95% Clopper-Pearson interval) and latency percentiles of the first and the last
    window_min minutes of ticks.csv (one row per observation; a miss is any outcome but on_time)."""
    outcome = np.loadtxt(ticks, delimiter=",", skiprows=1, usecols=5, dtype=str)
    latency = np.genfromtxt(ticks, delimiter=",", skip_header=1, usecols=2)
    n = int(window_min * 60 * rate_hz)
    out = {}
    for name, sl in (("first", slice(0, n)), ("last", slice(-n, None))):
        miss = int((outcome[sl] != "on_time").sum())
        lat = latency[sl][np.isfinite(latency[sl])]
        ci = binomtest(miss, len(outcome[sl])).proportion_ci(0.95)
        out[name] = {"ticks": len(outcome[sl]), "misses": miss, "miss_rate": miss / len(outcome[sl]),
                     "miss_rate_ci95": [ci.low, ci.high],
                     "latency_ms": {q: float(np.percentile(lat, p)) for q, p in
                                    (("p50", 50), ("p99", 99), ("p999", 99.9))}}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0, help="recorded time replayed, minutes (default 30)")
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1] / "../shared/data/schunk_lwa4p",
                    help="folder of Schunk measurement folders to chain (default ../shared/data/schunk_lwa4p)")
    ap.add_argument("--out", type=Path, default=Path("out/soak"), help="output folder (default out/soak)")
    ap.add_argument("--sample-s", type=float, default=60.0, help="RSS sampling period, s (default 60)")
    ap.add_argument("--warmup-s", type=float, default=60.0,
                    help="RSS growth is measured from the first sample at or after this, s (default 60)")
    ap.add_argument("--window-min", type=float, default=5.0,
                    help="length of the first and last windows compared, minutes (default 5)")
    ap.add_argument("replay_args", nargs="*", help="after --: options passed to `edgeinfer replay`")
    args = ap.parse_args()
    if args.minutes * 60 < args.warmup_s + 2 * args.sample_s or args.minutes < 2 * args.window_min:
        ap.error(f"--minutes {args.minutes:g} is too short to judge: it needs --warmup-s ({args.warmup_s:g} s) plus "
                 f"two --sample-s ({args.sample_s:g} s) samples, and two --window-min ({args.window_min:g} min) "
                 "windows that do not overlap; lower those for a short trial")

    rows = chain_runs(args.data.resolve(), args.minutes, args.out / "log")
    print(f"soak: {rows} rows chained from {args.data} into {args.out / 'log'}", flush=True)
    cmd = [sys.executable, "-m", "edgeinfer", "replay", "--log", str(args.out / "log"), "--out",
           str(args.out / "replay"), *args.replay_args]
    print("soak:", " ".join(cmd), flush=True)
    t0 = time.monotonic()
    with (args.out / "replay.log").open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        root, samples = psutil.Process(proc.pid), []
        while proc.poll() is None:
            samples.append({"t_s": round(time.monotonic() - t0, 1), "rss_mb": sample_rss(root)})
            print(f"soak: t={samples[-1]['t_s']:7.1f} s  " + "  ".join(
                f"{k} {v:.1f} MB" for k, v in sorted(samples[-1]["rss_mb"].items())), flush=True)
            deadline = time.monotonic() + args.sample_s
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
    if proc.returncode != 0:
        print(f"soak: replay exited {proc.returncode}; see {args.out / 'replay.log'}")
        return 1

    report = json.loads((args.out / "replay" / "report.json").read_text())
    # while every process runs: a sample taken after the nodes exited sees the replayer writing its report
    every = max(len(s["rss_mb"]) for s in samples)
    steady = [s for s in samples if s["t_s"] >= args.warmup_s and len(s["rss_mb"]) == every] or samples
    growth = {k: steady[-1]["rss_mb"][k] - v for k, v in steady[0]["rss_mb"].items() if k in steady[-1]["rss_mb"]}
    windows = window_figures(args.out / "replay" / "ticks.csv", report["rate_hz"], args.window_min)
    first, last = windows["first"], windows["last"]
    goals = {
        "rss_growth_below_5mb": all(g < RSS_GROWTH_GOAL_MB for g in growth.values()),
        "miss_rate_no_drift": last["miss_rate"] <= first["miss_rate_ci95"][1],
        "p99_no_drift": last["latency_ms"]["p99"] <= P99_DRIFT_GOAL * first["latency_ms"]["p99"],
    }
    steady_ticks = (steady[-1]["t_s"] - steady[0]["t_s"]) * report["rate_hz"]
    replayer_growth = sum(g for k, g in growth.items() if "replay" in k)
    result = {"minutes": args.minutes, "rows": rows, "wall_s": round(time.monotonic() - t0, 1),
              "rss_samples": samples, "rss_growth_mb": growth, "windows": windows,
              "replayer_growth_bytes_per_tick": round(replayer_growth * 2**20 / max(steady_ticks, 1)),
              "miss_rate": report["miss_rate"], "deadline_misses": report["deadline_misses"],
              "counters": {node: s.get("counters", {}) for node, s in report.get("node_stats", {}).items()},
              "outcomes": report["outcomes"], "fallbacks": report["fallbacks"], "goals": goals}
    (args.out / "soak.json").write_text(json.dumps(result, indent=1))
    shown = ("rss_growth_mb", "replayer_growth_bytes_per_tick", "windows", "counters", "outcomes", "goals")
    print(json.dumps({k: result[k] for k in shown}, indent=1))
    print(f"soak: wrote {args.out / 'soak.json'}")
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
