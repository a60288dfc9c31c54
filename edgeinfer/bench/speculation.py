"""`edgeinfer bench spec`: speculative decoding side by side on held-out real Schunk observations.

Rows, all decoded in one run by the same target engine (torch fp32 on CPU unless told otherwise):
    target-only                 greedy, one target pass per token: the baseline
    <drafter> k=K               each drafter at its best fixed k (best tokens/s in hindsight over `ks`)
    <drafter> adaptive          k chosen per chunk by the scheduler (edgeinfer.core.adaptive), per drafter
    adaptive (drafter, k)       drafter and k chosen per chunk among every drafter (`--drafter auto`)
    slow / useless / collapsing adaptive
                                stress rows, adaptive with a drafter that loses (edgeinfer/bench/stress_drafters.py):
                                kinematic with 12 ms per proposal, random tokens, kinematic then random from
                                halfway through the held-out chunks (`--no-stress` skips them)
    <best> relaxed +/-1 bin     LOSSY: drafts within one bin of the target's choice are kept
    <best> sampling T=1         Leviathan speculative sampling (exact in distribution: tests/test_sampling.py)
plus, when `transformers` is installed, the peer: Hugging Face assisted generation against edgeinfer on
the same llama-style target/draft pair (engines/peers/hf_peer.py).

Per row: tokens_per_s (action tokens per second of decode wall time; the observation windows are the same
for every row), target_passes_per_chunk, acceptance_rate, action_rmse_rad (decoded chunk against the
recorded future), exact (token-identical to target-only greedy on every chunk; sampling rows: the chi-square
test). The adaptive checks: adaptive tokens/s over the best fixed configuration's in hindsight, and over
target-only tokens/s on each held-out run separately; the worst adaptive row over target-only (stress rows
included), the collapsing row's over the chunks after the collapse, and the probes each adaptive row ran.
Every row's time includes choosing the drafter and k, and resetting the drafter (a model drafter's own
prefill), and is the fastest of --repeats identical decodes of the chunk (default 3): identical work
measured 0.91-1.05x itself per held-out run with one.
"""
from __future__ import annotations

import copy
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from edgeinfer.bench.stress_drafters import stress_drafters
from edgeinfer.bench.suite_report import check_output
from edgeinfer.core.acceptance import Greedy, Relaxed, Sampling
from edgeinfer.core.extras import require
from edgeinfer.core.progress import Progress, say
from edgeinfer.core.scheduler import SchedulerConfig, TickPlanner
from edgeinfer.core.speculative import speculative_decode
from edgeinfer.engines.backends.calibration import resolve_data_dir, sample_windows
from edgeinfer.engines.models.drafters import make_drafter
from edgeinfer.engines.models.policy import Policy, feature_increment, load_policy
from edgeinfer.engines.models.tokenizer import action_rmse_rad
from edgeinfer.engines.training.dataset import chunk_windows
from edgeinfer.logs.arm_log import list_schunk_runs, read_schunk, split_of

KS = (1, 2, 3, 4, 6, 8, 12, 16)
WARMUP_CHUNKS = 24  # > the adaptive planner's exploration of 3 drafters x 5 k
STRESS_BASE = "kinematic"  # the real drafter the slow and collapsing stress drafters wrap
AUTO = "auto"  # the adaptive row that chooses the drafter too, named as RuntimeConfig.drafter names it


def held_out_chunks(policy: Policy, data_dir: Path, per_run: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{run name: (features (n, 3D), offsets (n, H, D) rad)}: up to per_run consecutive chunk starts (one per
    chunk step, as the runtime replans) from the middle of each held-out run. Raises FileNotFoundError."""
    runs = {n: p for n, p in list_schunk_runs(data_dir).items() if split_of(n) == "held_out"}
    if not runs:
        raise FileNotFoundError(f"no held-out Schunk runs (measurement_N folders) under {data_dir}")
    out = {}
    stride = policy.cfg.stride_ticks
    for n, path in sorted(runs.items()):
        log = read_schunk(path)
        feats, offsets, _ = chunk_windows(log.q_rad, log.qd_rad_s, policy.cfg.horizon, stride, log.t_s)
        idx = np.arange(0, len(feats), stride)
        mid = max(0, (len(idx) - per_run) // 2)
        idx = idx[mid:mid + per_run]
        out[path.name] = (feats[idx], offsets[idx])
    return out


class _Row:
    """Accumulates one configuration's decodes."""

    def __init__(self, name: str, lossy: bool = False):
        self.name, self.lossy = name, lossy
        self.ns = self.tokens = self.passes = self.drafted = self.accepted = self.chunks = 0
        self.identical = 0
        self.decoded: list[list[int]] = []

    def add(self, res, ns: int, reference: list[int] | None = None) -> None:
        self.ns += ns
        self.tokens += len(res.tokens)
        self.passes += res.target_passes
        self.drafted += res.drafted
        self.accepted += res.accepted
        self.chunks += 1
        self.identical += reference is not None and res.tokens == reference
        self.decoded.append(res.tokens)

    def tokens_per_s(self) -> float:
        return self.tokens / (self.ns / 1e9)

    def summary(self, policy: Policy, feats: np.ndarray, offsets: np.ndarray, exact_by: str | None = None) -> dict:
        """This row's figures; feats (N, 3D) raw and offsets (N, H, D) rad: the windows decoded, in order."""
        rmse = action_rmse_rad(policy.tokenizer, np.array(self.decoded), feature_increment(feats), offsets)
        exact = exact_by is not None or self.identical == self.chunks
        return {"name": self.name, "tokens_per_s": round(self.tokens_per_s(), 1),
                "target_passes_per_chunk": round(self.passes / self.chunks, 2),
                "acceptance_rate": round(self.accepted / self.drafted, 4) if self.drafted else None,
                "action_rmse_rad": rmse, "exact": bool(exact and not self.lossy),
                "exact_by": exact_by or ("lossy" if self.lossy else "token-identical to target-only greedy"),
                "chunks": self.chunks}


def _decode(rows, engine, policy, feat, drafters: dict, planner, rule, reference, repeats: int = 1):
    """Decode one chunk from raw features feat (3D,) with the drafter the planner chooses among `drafters`
    (by name) and add it to every row in `rows`; returns it. Timed as _side_by_side times."""
    return _side_by_side([(rows, drafters, planner)], engine, policy, feat, rule, repeats, reference)[0]


def _side_by_side(jobs, engine, policy, feat, rule, repeats: int, reference: list[int] | None = None):
    """Decode one chunk (raw features feat (3D,)) once per job (rows, drafters by name, planner), `repeats`
    rounds of every job in turn, and add each job's result to its rows; returns the results. A job's time is
    its fastest round (timeit's min: on a shared VM noise only ever adds time), and rounds interleave the
    jobs so that a slow second of the machine falls on all of them alike. Later rounds run on copies of the
    planners as they were before the chunk, so they make the same choices and bookkeeping, and a planner
    learns from the first round only. reference: the tokens a row counts as identical (default: the first
    job's). A deterministic rule only (greedy, relaxed): every round must decode the same tokens."""
    copies = [[copy.deepcopy(planner) for _ in range(repeats - 1)] for _, _, planner in jobs]
    results, best_ns = [None] * len(jobs), [float("inf")] * len(jobs)
    for r in range(repeats):
        for i, (_, drafters, planner) in enumerate(jobs):
            res, ns = _timed_decode(engine, policy, feat, drafters, copies[i][r - 1] if r else planner, rule)
            if r and res.tokens != results[i].tokens:
                raise RuntimeError("bench spec: a repeated decode gave other tokens; --repeats needs a "
                                   "deterministic acceptance rule")
            results[i] = results[i] or res
            best_ns[i] = min(best_ns[i], ns)
    reference = reference if reference is not None else results[0].tokens
    for i, (rows, _, _) in enumerate(jobs):
        for row in rows:
            row.add(results[i], int(best_ns[i]), reference)
    return results


def _timed_decode(engine, policy, feat, drafters: dict, planner, rule):
    """(DecodeResult, ns): one decode, timed from the planner's choice to the last verified token."""
    d = policy.cfg.n_joints
    q, qd, inc = feat[:d], feat[d:2 * d], feat[2 * d:]
    t0 = time.perf_counter_ns()
    drafter = drafters.get(planner.choose())
    if drafter is not None:
        drafter.reset(q, qd, q - inc)
    res = speculative_decode(engine, policy.features(q, qd, q - inc), policy.cfg.n_tokens, drafter, planner, rule)
    return res, time.perf_counter_ns() - t0


def _fixed(k: int) -> TickPlanner:
    p = TickPlanner(SchedulerConfig(k_max=k, adaptive=False))
    p.unlimited()
    return p


@dataclass
class _Lineup:
    """What every row of bench_spec decodes with: the target engine, the held-out chunks, the drafters and the
    adaptive planners (one per choice: each drafter alone, AUTO over all of them, each stress drafter)."""

    policy: Policy
    engine: object
    runs: dict[str, tuple[np.ndarray, np.ndarray]]
    feats: np.ndarray
    offsets: np.ndarray
    drafters: tuple[str, ...]
    models: dict
    stressed: dict
    choices: dict[str, list[str]]
    adaptive: dict[str, TickPlanner]


@dataclass
class _HeldOut:
    """The rows bench_spec times on the held-out chunks, overall and per run."""

    base: _Row
    fixed: dict[tuple[str, int], _Row]
    adapt: dict[str, _Row]
    late_base: _Row
    late_collapsing: _Row
    per_run_rates: dict
    per_run_passes: dict
    same_work: dict


def bench_spec(policy: Policy | None = None, data_dir: Path | None = None, per_run: int = 12,
               drafters: tuple[str, ...] | None = None, ks: tuple[int, ...] = KS, backend: str = "torch",
               peer: bool = True, console: Console | None = None, repeats: int = 3, stress: bool = True,
               slow_ms: float = 12.0, drafter_options: dict[str, dict] | None = None) -> dict:
    """Run every row (see the module docstring) and return {"rows", "adaptive_per_run", "same_work_per_run",
    "adaptive_worst", "after_collapse_vs_target_only", "config"}; same_work_per_run: target-only decoded twice,
    per held-out run, the second over the first (the spread that identical work shows: the noise floor of the
    per-run figures). repeats: each greedy and relaxed decode is timed this many times, the fastest kept (the
    sampling row once). stress: add the stress rows, the slow drafter's proposals slow_ms slower.
    drafter_options: {drafter name: make_drafter's options}, e.g. {"learned": {"path": ...}} for another target's
    distilled drafter."""
    console = console or Console(stderr=True)
    if peer:  # before any work: the peer rows come last, minutes in
        require("hf", "bench spec's Hugging Face peer rows (--no-peer skips them)")
    policy = policy or load_policy()
    data_dir = resolve_data_dir(data_dir)
    lineup = _lineup(policy, data_dir, per_run, drafters, ks, backend, console, repeats, stress, slow_ms,
                     drafter_options)
    probes = _warm_up(lineup, data_dir, console)
    held = _held_out(lineup, ks, repeats, console)
    rows, best = _summary_rows(lineup, held, ks, probes)
    rows += _relaxed_and_sampled(lineup, held.base, best[AUTO], repeats, console)
    for r in rows:
        r["speedup"] = round(r["tokens_per_s"] / rows[0]["tokens_per_s"], 3)
    worst = min((r for r in rows if "per_run_vs_target_only" in r), key=lambda r: r["speedup"])
    after = (round(held.late_collapsing.tokens_per_s() / held.late_base.tokens_per_s(), 3)
             if held.late_collapsing.chunks else None)
    if peer:
        rows += _peer_rows(console)
    return {"rows": rows, "adaptive_per_run": held.per_run_rates, "same_work_per_run": held.same_work,
            "adaptive_worst": {"name": worst["name"], "speedup": worst["speedup"]},
            "after_collapse_vs_target_only": after,
            "config": {"backend": backend, "data_dir": str(data_dir), "per_run": per_run, "ks": list(ks),
                       "repeats": repeats, "chunks": len(lineup.feats), "drafters": list(lineup.drafters),
                       "stress": list(lineup.stressed), "slow_drafter_ms": slow_ms}}


def _lineup(policy: Policy, data_dir: Path, per_run: int, drafters: tuple[str, ...] | None, ks: tuple[int, ...],
            backend: str, console: Console, repeats: int, stress: bool, slow_ms: float,
            drafter_options: dict[str, dict] | None) -> _Lineup:
    """Load the held-out chunks, the target engine and the drafters; one adaptive planner per choice, unlimited."""
    from edgeinfer.engines.backends.build import load_engine

    runs = held_out_chunks(policy, data_dir, per_run)
    say(console, f"bench spec: {len(drafters or policy.drafters)} drafter(s) x {len(ks)} k side by side on "
                 f"{sum(len(f) for f, _ in runs.values())} held-out chunks, {repeats} repeat(s) each")
    feats = np.concatenate([f for f, _ in runs.values()])
    offsets = np.concatenate([o for _, o in runs.values()])
    engine = load_engine(policy, backend)
    drafters = drafters or tuple(policy.drafters)
    models = {name: make_drafter(name, policy, **(drafter_options or {}).get(name, {})) for name in drafters}
    stressed = stress_drafters(lambda: make_drafter(STRESS_BASE, policy), policy.cfg.n_bins, slow_ms) if stress else {}
    models |= stressed
    choices = {name: [name] for name in drafters} | {AUTO: list(drafters)} | {name: [name] for name in stressed}
    adaptive = {name: TickPlanner(SchedulerConfig(k_max=max(ks)), names) for name, names in choices.items()}
    for p in adaptive.values():
        p.unlimited()
    return _Lineup(policy, engine, runs, feats, offsets, drafters, models, stressed, choices, adaptive)


def _warm_up(lineup: _Lineup, data_dir: Path, console: Console) -> dict[str, int]:
    """Warm-up, as the runtime's before its start: first calls pay one-off costs, and the adaptive planners
    explore (edgeinfer.core.adaptive) on chunks of the training runs, never on the measured ones. Returns each
    planner's probes so far (the warm-up's, not counted)."""
    engine, policy, adaptive = lineup.engine, lineup.policy, lineup.adaptive
    warm_feats, _, _ = sample_windows(policy, WARMUP_CHUNKS, seed=0, data_dir=data_dir, split="train")
    with Progress("bench spec: warming up (training runs, not measured)", len(warm_feats), console) as bar:
        for f in warm_feats:
            _decode([], engine, policy, f, {}, _fixed(0), Greedy(), None)
            for name in lineup.choices:
                _decode([], engine, policy, f, lineup.models, adaptive[name], Greedy(), None)
            bar.advance()
    return {name: p.chooser.probes for name, p in adaptive.items()}


def _held_out(lineup: _Lineup, ks: tuple[int, ...], repeats: int, console: Console) -> _HeldOut:
    """Every greedy row side by side on each held-out chunk: target-only, the adaptive rows, target-only again,
    every fixed (drafter, k); the per-run figures; the collapsing stress drafter's second half apart."""
    choices, stressed, feats = lineup.choices, lineup.stressed, lineup.feats
    held = _HeldOut(base=_Row("target-only"), fixed={(name, k): _Row(f"{name} k={k}") for name in lineup.drafters
                                                       for k in ks},
                    adapt={name: _Row("adaptive (drafter, k)" if name == AUTO
                                      else f"{getattr(lineup.models[name], 'label', name)} adaptive")
                           for name in choices},
                    late_base=_Row("after the collapse"), late_collapsing=_Row("after the collapse"),  # the second half
                    per_run_rates={}, per_run_passes={}, same_work={})
    with Progress("bench spec: held-out chunks, every row side by side", len(feats), console) as bar:
        done = 0
        for run, (run_feats, _) in lineup.runs.items():
            run_base, run_again, run_adapt = _Row(run), _Row(run), {name: _Row(run) for name in choices}
            for f in run_feats:
                rows_of = {None: [held.base, run_base]} | {name: [held.adapt[name], run_adapt[name]]
                                                           for name in choices}
                if "collapsing" in stressed:  # the good drafter for the first half of the chunks, useless after
                    stressed["collapsing"].collapsed = done >= len(feats) // 2
                    if stressed["collapsing"].collapsed:
                        rows_of[None].append(held.late_base)
                        rows_of["collapsing"].append(held.late_collapsing)
                done += 1
                _side_by_side(_jobs(lineup, held, rows_of, run_again, ks), lineup.engine, lineup.policy, f, Greedy(),
                              repeats)
                bar.advance()
            held.per_run_rates[run] = {name: round(run_adapt[name].tokens_per_s() / run_base.tokens_per_s(), 3)
                                       for name in choices}
            held.per_run_passes[run] = {name: round(run_adapt[name].passes / run_adapt[name].chunks, 2)
                                        for name in choices}
            held.same_work[run] = round(run_again.tokens_per_s() / run_base.tokens_per_s(), 3)
    return held


def _jobs(lineup: _Lineup, held: _HeldOut, rows_of: dict, run_again: _Row, ks: tuple[int, ...]) -> list:
    """One chunk's decodes, in order: target-only first (the reference), then the adaptive rows, then
    target-only again (what identical work measures), then every fixed (drafter, k)."""
    jobs = [(rows_of[None], {}, _fixed(0))]
    jobs += [(rows_of[name], lineup.models, lineup.adaptive[name]) for name in lineup.choices]
    jobs += [([run_again], {}, _fixed(0))]
    jobs += [([held.fixed[(name, k)]], {"drafter": lineup.models[name]}, _fixed(k))
             for name in lineup.drafters for k in ks]
    return jobs


def _summary_rows(lineup: _Lineup, held: _HeldOut, ks: tuple[int, ...], probes: dict[str, int]) -> tuple[list, dict]:
    """(target-only's row, then per choice its best fixed k's row (not for AUTO and the stress drafters) and its
    adaptive row; best: drafter -> its fastest k, AUTO -> the fastest (drafter, k))."""
    policy, feats, offsets, fixed, adapt = lineup.policy, lineup.feats, lineup.offsets, held.fixed, held.adapt
    held.base.identical = held.base.chunks  # the reference itself
    rows = [held.base.summary(policy, feats, offsets) | {"same_work_per_run": held.same_work}]
    best = {name: max(ks, key=lambda k: fixed[(name, k)].tokens_per_s()) for name in lineup.drafters}
    best[AUTO] = max(best.items(), key=lambda nk: fixed[nk].tokens_per_s())
    for name in lineup.choices:
        row = fixed[best[name]] if name == AUTO else fixed.get((name, best.get(name)))
        if name not in (AUTO, *lineup.stressed):
            rows.append(row.summary(policy, feats, offsets) | {"k": best[name]})
        rows.append(adapt[name].summary(policy, feats, offsets) | {
            "vs_best_fixed": round(adapt[name].tokens_per_s() / row.tokens_per_s(), 3) if row else None,
            "probes": lineup.adaptive[name].chooser.probes - probes[name],  # a few passes each (core.adaptive)
            "drafted_per_chunk": round(adapt[name].drafted / adapt[name].chunks, 2),
            "per_run_vs_target_only": {run: r[name] for run, r in held.per_run_rates.items()},
            # what the adaptive row did on each run (48 = target-only's): tells speculation from timing noise
            "per_run_target_passes_per_chunk": {run: r[name] for run, r in held.per_run_passes.items()}})
    return rows, best


def _relaxed_and_sampled(lineup: _Lineup, base: _Row, best: tuple[str, int], repeats: int,
                         console: Console) -> list[dict]:
    """The fastest fixed (drafter, k) again, with relaxed acceptance (+/-1 bin, against target-only's tokens)
    and with sampling at T=1: their two rows."""
    name, k = best
    policy, feats, offsets, engine = lineup.policy, lineup.feats, lineup.offsets, lineup.engine
    relaxed, sampled = _Row(f"{name} k={k} relaxed +/-1 bin", lossy=True), _Row(f"{name} k={k} sampling T=1")
    rule = Sampling(temperature=1.0, seed=0)
    drafter = {"drafter": lineup.models[name]}
    with Progress("bench spec: relaxed and sampling rows", len(feats), console) as bar:
        for f, ref in zip(feats, base.decoded):
            _decode([relaxed], engine, policy, f, drafter, _fixed(k), Relaxed(1), ref, repeats)
            _decode([sampled], engine, policy, f, drafter, _fixed(k), rule, None)
            bar.advance()
    return [relaxed.summary(policy, feats, offsets) | {"k": k},
            sampled.summary(policy, feats, offsets, exact_by="chi-square test (tests/test_sampling.py)")
            | {"k": k}]


def _peer_rows(console: Console) -> list[dict]:
    from edgeinfer.engines.peers.hf_peer import compare_with_hf_assisted  # transformers: checked by bench_spec's start

    say(console, "bench spec: Hugging Face assisted generation on the llama-style pair")
    return [r | {"peer": True} for r in compare_with_hf_assisted()["rows"]]


def print_table(result: dict, console: Console | None = None) -> None:
    console = console or Console(width=150)
    t = Table(title=f"edgeinfer bench spec ({result['config']['chunks']} held-out chunks, "
                    f"{result['config']['backend']} target)")
    for col in ("name", "tokens/s", "x target-only", "passes/chunk", "acceptance", "action RMSE mrad", "exact"):
        t.add_column(col, justify="left" if col == "name" else "right")
    for r in result["rows"]:
        rmse = r.get("action_rmse_rad")
        t.add_row(r["name"], f"{r['tokens_per_s']:.0f}", f"{r['speedup']:.2f}" if "speedup" in r else "-",
                  f"{r['target_passes_per_chunk']:.2f}" if r.get("target_passes_per_chunk") else "-",
                  f"{r['acceptance_rate']:.3f}" if r.get("acceptance_rate") is not None else "-",
                  f"{rmse * 1e3:.4f}" if rmse is not None else "-",
                  ("in distribution" if "chi-square" in r.get("exact_by", "") else "yes" if r["exact"] else "NO")
                  + (" (lossy)" if r.get("exact_by") == "lossy" else ""))
    console.print(t)
    for r in result["rows"]:
        if "per_run_vs_target_only" in r:
            runs = r["per_run_vs_target_only"]
            worst = min(runs, key=runs.get)
            passes = r["per_run_target_passes_per_chunk"][worst]
            fixed = f"{r['vs_best_fixed']:.3f}x the best fixed (drafter, k); " if r["vs_best_fixed"] else ""
            console.print(f"{r['name']}: {fixed}{r['probes']} probes; worst held-out run {worst} at "
                          f"{runs[worst]:.2f}x target-only ({passes:.1f} target passes per chunk there)")
    worst = result["adaptive_worst"]
    console.print(f"worst adaptive row: {worst['name']} at {worst['speedup']:.2f}x target-only")
    if result["after_collapse_vs_target_only"] is not None:
        console.print(f"collapsing drafter, the chunks after the collapse: "
                      f"{result['after_collapse_vs_target_only']:.2f}x target-only")
    same = result.get("same_work_per_run")
    if same:
        console.print(f"identical work (target-only decoded twice), the noise floor of the figures above: held-out "
                      f"runs {min(same.values()):.2f}-{max(same.values()):.2f}x")


@dataclass
class SpecBenchConfig:
    """`edgeinfer bench spec`: which held-out chunks, targets, drafters and speculation lengths."""

    json: Path | None = None  # write the rows here
    data_dir: Path | None = None  # Schunk runs (None: $EDGEINFER_DATA_DIR or ../shared/data/schunk_lwa4p)
    per_run: int = 12  # consecutive chunks per held-out run (20 runs)
    # Target engine backends, each a full set of rows (torch: the reference; packed: the engine backend auto picks
    # on a CPU, skipped where numba is not).
    backend: tuple[str, ...] = ("torch", "packed")
    drafters: tuple[str, ...] | None = None  # the drafters of the rows (None: every registered drafter)
    ks: tuple[int, ...] = KS  # speculation lengths of the fixed-k rows; the adaptive rows choose up to the largest
    repeats: int = 3  # time each decode this many times and keep the fastest (1 is 3x quicker)
    no_peer: bool = False  # skip the Hugging Face assisted-generation peer
    no_stress: bool = False  # skip the stress rows (adaptive with a slow, a useless and a collapsing drafter)
    slow_drafter_ms: float = 12.0  # the slow stress drafter's extra cost per proposal, ms

    def __post_init__(self):
        from edgeinfer.engines.backends.engine import BACKENDS

        if self.per_run < 1 or self.repeats < 1:
            raise ValueError(f"SpecBenchConfig.per_run and repeats must be >= 1, got {self.per_run}, {self.repeats}")
        if not self.slow_drafter_ms > 0:
            raise ValueError(f"SpecBenchConfig.slow_drafter_ms must be > 0, got {self.slow_drafter_ms}")
        if not self.ks or min(self.ks) < 1:
            raise ValueError(f"SpecBenchConfig.ks must all be >= 1, got {self.ks}")
        if not self.backend or set(self.backend) - set(BACKENDS):
            unknown = sorted(set(self.backend) - set(BACKENDS)) or "none given"
            raise ValueError(f"SpecBenchConfig.backend: unknown {unknown}; known: {sorted(BACKENDS)}")


def main(argv: list[str] | None = None) -> int:
    """`edgeinfer bench spec` as a program of its own: parse SpecBenchConfig options, then run_command."""
    from edgeinfer.bench.suite_cli import parse_suite

    return run_command(parse_suite("spec", SpecBenchConfig, argv, __doc__.split("\n")[0])[0])


def run_command(cfg: SpecBenchConfig) -> int:
    """`edgeinfer bench spec`: every row set on each --backend, printed (and written to --json after each); 0.
    Raises ValueError for a --json that cannot be written (before the run)."""
    from edgeinfer.engines.backends.engine import unavailable_reason

    check_output(cfg.json)
    rows = []
    for i, backend in enumerate(cfg.backend):
        if backend == "packed" and unavailable_reason(backend) is not None:
            print(f"bench spec: skipping packed: {unavailable_reason(backend)}", file=sys.stderr)
            continue
        result = bench_spec(data_dir=cfg.data_dir, per_run=cfg.per_run, drafters=cfg.drafters, ks=cfg.ks,
                            backend=backend, peer=not cfg.no_peer and i == 0, repeats=cfg.repeats,
                            stress=not cfg.no_stress, slow_ms=cfg.slow_drafter_ms)  # the peer once: its own models
        print_table(result)
        rows += [{**r, "backend": backend} for r in result["rows"]]
        if cfg.json:
            cfg.json.parent.mkdir(parents=True, exist_ok=True)
            cfg.json.write_text(json.dumps(rows, indent=2) + "\n")  # one entry per row, after each backend
    return 0
