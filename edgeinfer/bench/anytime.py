"""`edgeinfer bench anytime`: step action tokens against DCT (frequency-ordered) action tokens, in one run on the
held-out Schunk runs (measurement numbers n % 5 == 1, the split of both policies' manifests).

    curve     action RMSE against the recorded future vs the number of verified tokens (D, 2D, ..., H*D: whole
              rows), for each policy: its target-only greedy tokens cut to the prefix ("greedy"), and the
              encoded recorded future cut to the prefix ("tokenizer": quantisation alone, no model)
    spec      speculative decoding per drafter (kinematic, learned), reusing `edgeinfer bench spec`'s rows:
              speedup over target-only, acceptance rate, tokens per target pass, exactness
    replays   each policy replayed through the real processes (edgeinfer/bench/anytime_replays.py) under cut
              scheduler budgets and with the engine slowed: misses, held ticks, rungs, commanded action RMSE
    verdict   the bench's pass criterion, computed: wherever the step policy sends partial chunks, the DCT policy
              holds fewer ticks and commands a lower action RMSE; its full-chunk RMSE is within 10 % of the step's

A prefix of n tokens decodes to the whole horizon H for DCT tokens (a departure from the constant-velocity chunk of
the window's last increment q - q_prev, the missing coefficients filled as the runtime does:
engines/models/dct_tokenizer.py)
and to n / D steps for step tokens; past its last step, the step chunk is held at that step (what the control
loop commands once a chunk ends and no other chunk covers the tick: its last target; control/command.py). The RMSE
is then over every (window, step, joint) of the horizon, for both tokenizers alike, and at the first step alone.
docs/anytime.md.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from rich.console import Console

from edgeinfer.bench.anytime_replays import conditions, pooled, replay_once
from edgeinfer.bench.suite_report import check_output
from edgeinfer.core.progress import Progress
from edgeinfer.engines.models.drafters import DEFAULT_DRAFT, make_drafter
from edgeinfer.engines.models.paths import DCT_DRAFT, DCT_POLICY, DEFAULT_POLICY
from edgeinfer.engines.models.tokenizer import decode_chunk, encode_chunk

SCHEMA = "edgeinfer.bench.anytime/1"
POLICIES = ("step", "dct")
DRAFTERS = ("kinematic", "learned")
FULL_RMSE_TOLERANCE = 0.10  # the DCT policy's full-chunk RMSE may exceed the step policy's by this fraction


@dataclass
class AnytimeConfig:
    """The anytime bench: step vs DCT action tokens on the held-out Schunk runs."""

    json: Path | None = None  # write the result here, and the plot (anytime.png) next to it
    # Replay artefacts (reports, ticks.csv, node logs), and the plot without --json.
    out: Path = Path("out/bench/anytime")
    # Schunk runs (None: $EDGEINFER_DATA_DIR or ../shared/data/schunk_lwa4p).
    data_dir: Path | None = None
    step_policy: Path = DEFAULT_POLICY  # the step-token policy's manifest
    dct_policy: Path = DCT_POLICY  # the DCT-token policy's manifest
    # The engine of every decode and replay, both policies alike (the spec section's target-only cost per pass is
    # what the slowdowns multiply, so the replays run the same engine).
    backend: Literal["torch", "onnxruntime", "tensorrt", "fused"] = "torch"
    step_draft: Path = DEFAULT_DRAFT  # the step policy's learned drafter (engines/training/distill.py)
    dct_draft: Path = DCT_DRAFT  # the DCT policy's learned drafter
    # Held-out measurement numbers replayed (n % 5 == 1; the default: the two longest, 4.4 s each).
    runs: list[int] = field(default_factory=lambda: [81, 86])
    seconds: float | None = None  # replay only each run's first seconds (None: the whole run)
    budgets_ms: list[float] = field(default_factory=lambda: [2.0, 5.0, 10.0, 20.0])  # cut scheduler budgets, ms
    # Engine slowdowns replayed at the default budget: every target pass lasts this many times its measured cost.
    slowdowns: list[float] = field(default_factory=lambda: [2.0, 4.0])
    curve_windows: int | None = None  # held-out windows of the curve, evenly spaced (None: every one)
    spec_per_run: int = 2  # consecutive chunks per held-out run decoded by the spec section (20 runs)
    spec_ks: list[int] = field(default_factory=lambda: [2, 4, 8])  # fixed speculation lengths tried (best kept)
    spec_repeats: int = 1  # spec section: time each decode this many times, the fastest kept

    def __post_init__(self):
        from edgeinfer.logs.arm_log import split_of

        self.out = Path(self.out)
        if not self.runs:
            raise ValueError("AnytimeConfig.runs must name at least one held-out run")
        for n in self.runs:
            if split_of(n) != "held_out":  # raises ValueError for a run that cannot exist
                raise ValueError(f"AnytimeConfig.runs: measurement {n} is a training run (held out: n % 5 == 1)")
        if self.seconds is not None and not self.seconds > 0:
            raise ValueError(f"AnytimeConfig.seconds must be > 0, got {self.seconds}")
        if any(not b > 0 for b in self.budgets_ms):
            raise ValueError(f"AnytimeConfig.budgets_ms must all be > 0, got {self.budgets_ms}")
        if any(not s > 1 for s in self.slowdowns):
            raise ValueError(f"AnytimeConfig.slowdowns must all be > 1, got {self.slowdowns}")
        if self.curve_windows is not None and self.curve_windows < 1:
            raise ValueError(f"AnytimeConfig.curve_windows must be >= 1, got {self.curve_windows}")
        if self.spec_per_run < 1 or self.spec_repeats < 1 or not self.spec_ks or min(self.spec_ks) < 1:
            raise ValueError("AnytimeConfig: spec_per_run, spec_repeats and every spec_ks must be >= 1, got "
                             f"{self.spec_per_run}, {self.spec_repeats}, {self.spec_ks}")


def whole_horizon(tokenizer, tokens: np.ndarray, horizon: int, increment_rad: np.ndarray) -> np.ndarray:
    """Offsets (N, H, D) rad of token prefixes (N, n), n a multiple of D, for windows whose last chunk-step
    increment q - q_prev is increment_rad (N, D): the runtime's decode (engines/tokenizer.decode_chunk), and a
    shorter (step) decode held at its last step up to `horizon` (the control loop's hold; module docstring)."""
    traj = decode_chunk(tokenizer, tokens, increment_rad)
    short = horizon - traj.shape[-2]
    return np.concatenate([traj, np.repeat(traj[..., -1:, :], short, axis=-2)], axis=-2) if short > 0 else traj


def anytime_curve(tokenizer, tokens: np.ndarray, offsets: np.ndarray, increment_rad: np.ndarray) -> list[dict]:
    """[{tokens: n, action_rmse_rad, first_step_rmse_rad}] for n = D, 2D, ..., H*D: prefixes of tokens (N, H*D)
    against the recorded offsets (N, H, D) rad over the whole horizon (whole_horizon), and at its first step alone
    (where the arm acts next)."""
    _, horizon, d = offsets.shape
    errors = [whole_horizon(tokenizer, tokens[:, :n], horizon, increment_rad) - offsets
              for n in range(d, horizon * d + 1, d)]
    return [{"tokens": (i + 1) * d, "action_rmse_rad": _rmse(e), "first_step_rmse_rad": _rmse(e[:, 0])}
            for i, e in enumerate(errors)]


def _rmse(err: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(err))))


def curve_windows(policy, data_dir: Path | None, n: int | None) -> tuple[np.ndarray, np.ndarray, str]:
    """(raw features (N, 3D), recorded offsets (N, H, D) rad, source) of the held-out windows, n evenly spaced
    ones (None: all)."""
    from edgeinfer.engines.backends.calibration import held_out_windows

    feats, offsets, source = held_out_windows(policy, data_dir)
    if n is not None and n < len(feats):
        idx = np.linspace(0, len(feats) - 1, n).round().astype(int)
        feats, offsets = feats[idx], offsets[idx]
    return feats, offsets, source


def curve_section(policy, feats: np.ndarray, offsets: np.ndarray) -> dict:
    """The anytime curves of one policy: greedy (decoding and quantisation) and tokenizer (quantisation alone)."""
    from edgeinfer.engines.models.policy import feature_increment
    from edgeinfer.engines.training.evaluate import greedy_tokens  # torch: imported by the run, not by --help

    tok = policy.tokenizer
    increment = feature_increment(feats)
    return {"greedy": anytime_curve(tok, greedy_tokens(policy, feats), offsets, increment),
            "tokenizer": anytime_curve(tok, encode_chunk(tok, offsets, increment), offsets, increment)}


def spec_section(policy, draft: Path, cfg: AnytimeConfig, console: Console) -> dict:
    """Speculative decoding of `policy` per drafter (learned: the one at `draft`), from edgeinfer.bench.speculation's
    rows (no stress rows, no peer): target-only, and per drafter its best fixed k and its adaptive row. pass_ms:
    target-only's ms per token (one target pass each), the cost the replays' slowdowns multiply. A drafter that
    cannot be built for the policy (its file missing, distilled for other tokens) is skipped, with the reason."""
    from edgeinfer.bench.speculation import bench_spec

    options = {"learned": {"path": draft}}
    skipped = {}
    for d in DRAFTERS:
        try:
            make_drafter(d, policy, **options.get(d, {}))
        except (ValueError, FileNotFoundError) as e:
            skipped[d] = str(e)
    drafters = tuple(d for d in DRAFTERS if d not in skipped)
    res = bench_spec(policy, cfg.data_dir, cfg.spec_per_run, drafters, tuple(cfg.spec_ks), cfg.backend, peer=False,
                     console=console, repeats=cfg.spec_repeats, stress=False, drafter_options=options)
    rows = res["rows"]
    n_tokens = policy.cfg.n_tokens
    pick = lambda r: {"k": r.get("k"), "speedup": r["speedup"], "tokens_per_s": r["tokens_per_s"],  # noqa: E731
                      "acceptance_rate": r["acceptance_rate"],
                      "tokens_per_target_pass": round(n_tokens / r["target_passes_per_chunk"], 3),
                      "exact": r["exact"], "action_rmse_rad": r["action_rmse_rad"]}
    fixed = [r for r in rows if "k" in r and "per_run_vs_target_only" not in r and not r.get("peer")
             and r["exact_by"].startswith("token-identical")]
    adaptive = [r for r in rows if "per_run_vs_target_only" in r][:len(drafters)]  # then "auto"'s
    return {"pass_ms": 1e3 / rows[0]["tokens_per_s"], "chunks": res["config"]["chunks"],
            "target_only": pick(rows[0]),
            "drafters": {d: {"best_fixed": pick(f), "adaptive": pick(a)} for d, f, a in zip(drafters, fixed, adaptive)},
            "drafters_skipped": skipped}


def verdict(result: dict) -> dict:
    """The bench's pass criterion, from the result's replays and curves: at every condition where the step policy
    sent partial chunks, the DCT policy held fewer ticks (none, where the step policy held none either) and
    commanded a lower action RMSE (holds included); and the DCT policy's full-chunk greedy RMSE (an unlimited
    budget) is within FULL_RMSE_TOLERANCE of the step's."""
    by = {(r["policy"], r["condition"]): r for r in result["replays"]}
    rows = []
    for (pol, cond), step in by.items():
        if pol != "step" or not step["chunk_rungs"].get("partial") or ("dct", cond) not in by:
            continue
        dct = by[("dct", cond)]
        fewer = dct["held_ticks"] < step["held_ticks"] or dct["held_ticks"] == step["held_ticks"] == 0
        lower = None not in (dct["action_rmse_rad"], step["action_rmse_rad"]) and \
            dct["action_rmse_rad"] < step["action_rmse_rad"]
        rows.append({"condition": cond, "fewer_held_ticks": fewer, "lower_action_rmse": lower,
                     "held_ticks": {"step": step["held_ticks"], "dct": dct["held_ticks"]},
                     "action_rmse_rad": {"step": step["action_rmse_rad"], "dct": dct["action_rmse_rad"]}})
    full = {p: result["curve"][p]["greedy"][-1]["action_rmse_rad"] for p in POLICIES}
    within = full["dct"] <= (1 + FULL_RMSE_TOLERANCE) * full["step"]
    partial_ok = all(r["fewer_held_ticks"] and r["lower_action_rmse"] for r in rows)
    return {"conditions_with_step_partial": rows, "dct_better_wherever_step_partial": partial_ok,
            "full_chunk_rmse_rad": full, "full_chunk_ratio": full["dct"] / full["step"],
            "full_chunk_within_10pct": within, "passed": partial_ok and within}


def run_anytime(cfg: AnytimeConfig, console: Console | None = None, command: list[str] | None = None) -> dict:
    """Every section (module docstring); returns the result (schema SCHEMA) and writes it to cfg.json and the
    plot next to it when set. Raises FileNotFoundError for a missing policy or run, ValueError for a policy that
    is not a built-in action-token policy, and what a replay raises."""
    from edgeinfer.bench.anytime_report import write_plot
    from edgeinfer.bench.engines import machine_info
    from edgeinfer.engines.backends.calibration import resolve_data_dir
    from edgeinfer.engines.models.policy import load_policy
    from edgeinfer.logs.arm_log import list_schunk_runs
    from edgeinfer.procs import forkserver

    console = console or Console(stderr=True)
    t0 = time.perf_counter()
    data_dir = resolve_data_dir(cfg.data_dir)
    run_dirs = list_schunk_runs(data_dir) if data_dir.is_dir() else {}
    missing = [n for n in cfg.runs if n not in run_dirs]
    if missing:
        raise FileNotFoundError(f"AnytimeConfig.runs: no measurement_{missing[0]} under {data_dir}")
    paths = {"step": cfg.step_policy, "dct": cfg.dct_policy}
    drafts = {"step": cfg.step_draft, "dct": cfg.dct_draft}
    for p, path in paths.items():
        if not Path(path).is_file():
            raise FileNotFoundError(f"AnytimeConfig.{p}_policy: no such policy manifest: {path}")
    policies = {p: load_policy(path) for p, path in paths.items()}
    for p, pol in policies.items():
        if pol.tokenizer.kind != p:
            raise ValueError(f"AnytimeConfig.{p}_policy {paths[p]}: its tokenizer is {pol.tokenizer.kind!r}, not {p!r}")
    forkserver.start(wait=False)  # the replays' nodes fork from it; it imports while we decode
    conds = conditions(cfg.budgets_ms, cfg.slowdowns)
    result: dict = {"schema": SCHEMA, "command": command if command is not None else sys.argv,
                    "config": json.loads(json.dumps(asdict(cfg), default=str)), "started_unix_s": time.time(),
                    "machine": machine_info(),
                    "load_average_1min": {"start": os.getloadavg()[0], "end": None},
                    "policies": {p: {"manifest": str(paths[p]), "tokenizer": pol.tokenizer.kind,
                                     "n_tokens": pol.cfg.n_tokens, "horizon": pol.cfg.horizon,
                                     "n_joints": pol.cfg.n_joints, "sha256": pol.manifest.get("sha256")}
                                 for p, pol in policies.items()},
                    "curve": {}, "spec": {}, "replays": []}
    total = 2 * len(POLICIES) + len(POLICIES) * len(conds) * len(cfg.runs)
    with Progress("bench anytime: curves", total, console) as progress:
        for p, pol in policies.items():
            progress.update(label=f"bench anytime: anytime curve, {p} policy")
            feats, offsets, source = curve_windows(pol, cfg.data_dir, cfg.curve_windows)
            result["curve"][p] = curve_section(pol, feats, offsets) | {"windows": len(feats), "source": source}
            progress.advance()
        seconds = {"setup_and_curve": time.perf_counter()}  # section -> its end
        for p, pol in policies.items():
            progress.update(label=f"bench anytime: speculative decoding, {p} policy")
            result["spec"][p] = spec_section(pol, drafts[p], cfg, console)
            progress.advance()
        seconds["spec"] = time.perf_counter()
        for p in POLICIES:
            for cond in conds:
                reports = []
                for n in cfg.runs:
                    progress.update(label=f"bench anytime: replay, {p} policy, {cond.name}, measurement_{n}")
                    out = cfg.out / p / cond.name.replace(" ", "_") / f"measurement_{n}"
                    reports.append(replay_once(paths[p], run_dirs[n], cond, result["spec"][p]["pass_ms"], out,
                                               cfg.backend, cfg.seconds))
                    progress.advance()
                result["replays"].append({"policy": p} | pooled(reports, cond, result["spec"][p]["pass_ms"]))
    result["verdict"] = verdict(result)
    seconds["replays"] = time.perf_counter()
    ends = list(seconds.values())
    result["section_seconds"] = {k: round(t - s, 1) for k, t, s in zip(seconds, ends, [t0, *ends])}
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["load_average_1min"]["end"] = os.getloadavg()[0]
    plot = (Path(cfg.json).parent if cfg.json else cfg.out) / "anytime.png"
    result["plot"] = str(write_plot(result, plot))
    if cfg.json:
        Path(cfg.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    """`edgeinfer bench anytime` as a program of its own: parse AnytimeConfig options, then run_command."""
    from edgeinfer.bench.suite_cli import parse_suite

    return run_command(*parse_suite("anytime", AnytimeConfig, argv, __doc__.split("\n\n")[0]))


def run_command(cfg: AnytimeConfig, command: list[str]) -> int:
    """`edgeinfer bench anytime`: run, print the tables; 0, or 1 when the verdict fails. command: the command line
    as typed, recorded in the result. Raises ValueError for a --json that cannot be written (before the run)."""
    from edgeinfer.bench.anytime_report import print_result

    check_output(cfg.json)
    result = run_anytime(cfg, Console(stderr=True), command=command)
    print_result(result, Console(width=max(Console().width, 150)))
    return 0 if result["verdict"]["passed"] else 1
