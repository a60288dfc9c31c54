"""Ultrafast rows of `edgeinfer bench engines`: the speed-up of each layer of the stack over torch-eager
target-only decoding, per policy, in one run.

Per policy (`--policy`, repeatable; default the shipped target, plus the large one when it is shipped):
    baseline     torch fp32 eager, target-only greedy: the 1.0x every ratio of the run divides by, and the
                 tokens every row's agreement is measured against (each row decodes on its own)
    stack rows   engine (torch [CUDA graphs on cuda], onnxruntime fp32, fused, onnxruntime int8) x decode
                 (target-only; speculative kinematic k = 4, 8; learned drafter k = 4 with the draft model on
                 the same engine, for the policy it was distilled from; on cuda, the whole greedy chunk as
                 one CUDA graph), plus a LOSSY relaxed-acceptance row (+/- 1 bin, kinematic k = 8) per engine
    ultrafast    the engine `backend="auto"` picks (engines/backends/auto.py), decoded as the runtime's preset does
                 (kinematic drafter, the adaptive planner unbudgeted, greedy acceptance)
    drift        the baseline timed again after the policy's rows (policies.<name>.baseline_drift, end / start):
                 rows run one after another, so a machine whose load changes mid-run skews their ratios; the
                 headline warns past x1.25
Per row: chunk_us_p50/p99 (prefill + every pass of one complete H*D-token chunk, drafter reset and drafting
included; warm-up chunks excluded), vs_baseline (baseline p50 / row p50), target_passes_per_chunk,
tokens_per_pass, acceptance_rate (drafts kept / drafted), drafter_us_per_token (time in the drafter's reset
and propose calls / drafted tokens, timed by wrapping the drafter), draft_passes_per_chunk (model drafters),
token_agreement (with the baseline's greedy tokens), action_rmse_rad (decoded chunks against the recorded
future), exact (agreement 1.0 under an exact acceptance rule) and label "exact" | "lossy". A row whose engine
cannot be opened here carries `error` ("unavailable: ...") and None figures; nothing raises for one row.
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from edgeinfer.bench.suite_report import percentile_us as _us
from edgeinfer.core.acceptance import Greedy, Relaxed
from edgeinfer.core.scheduler import SchedulerConfig, TickPlanner
from edgeinfer.core.speculative import DecodeResult, FixedK, speculative_decode
from edgeinfer.engines.backends.calibration import sample_windows
from edgeinfer.engines.backends.engine import BUILDS, PRECISIONS, unavailable_reason
from edgeinfer.engines.models.drafters import draft_path, kinematic_drafter, make_drafter
from edgeinfer.engines.models.paths import DEFAULT_POLICY, LARGE_POLICY, serve_defaults
from edgeinfer.engines.models.policy import feature_increment, load_policy
from edgeinfer.engines.models.tokenizer import action_rmse_rad

GOAL_RATIO = 14.0  # an exact full chunk >= 14x faster than torch-eager target-only (the default policy)
# per policy (manifest stem): the exact full chunk's ratio to torch eager target-only, and speculation's ratio to
# the same engine's target-only (the large policy: where weights, not dispatch, set a pass's cost)
GOALS = {"schunk_large_target": {"vs_baseline": 24.0, "spec_vs_target_only": 2.0}}
PARITY_SEED = 1  # the observations of engines.py's rows
DRIFT_LIMIT = 1.25  # the baseline re-measured after a policy's rows: beyond x1.25 (or 1/1.25) the headline warns
FIGURES = ("chunk_us_p50", "chunk_us_p99", "vs_baseline", "target_passes_per_chunk", "tokens_per_pass",
           "acceptance_rate", "drafter_us_per_token", "draft_passes_per_chunk", "token_agreement",
           "action_rmse_rad", "exact")


@dataclass
class UltrafastConfig:
    """The ultrafast rows of one run: device, observations, and the stack's parts to measure."""

    device: str = "cpu"  # cpu or cuda[:i]; on cuda the torch rows run with CUDA graphs (baseline: eager)
    n_obs: int = 50  # held-out observations, one timed chunk each, per row
    threads: int = 1  # CPU threads per engine (1, as the runtime)
    warmup_chunks: int = 5  # untimed chunks before each row's timed ones
    preset_warmup_chunks: int = 30  # the ultrafast row's, as RuntimeConfig.warmup_chunks (costs forgotten at 1/3)
    # (backend, precision) of the target's engine, in run order; one that cannot run here gives error rows
    # (backend, precision, threads) of the target's engine, in run order (threads None: `threads`)
    engines: tuple[tuple[str, str, int | None], ...] = (
        ("torch", "fp32", None), ("onnxruntime", "fp32", None), ("fused", "fp32", None), ("packed", "fp32", 1),
        ("packed", "fp32", 2), ("onnxruntime", "int8", None))
    kinematic_ks: tuple[int, ...] = (4, 8)  # drafts per target pass of the kinematic drafter's rows
    learned_ks: tuple[int, ...] = (2, 4, 8)  # the learned drafter's rows (for the target it was distilled from)
    relaxed_bins: int | None = 1  # the lossy row per engine: Relaxed(bins) on the kinematic drafter; None: none
    relaxed_k: int = 8
    preset: bool = True  # the ultrafast row (backend auto measures every exact engine first: seconds)

    def __post_init__(self):
        if self.n_obs < 1 or self.threads < 1:
            raise ValueError(f"UltrafastConfig: n_obs and threads must be >= 1, got {self.n_obs}, {self.threads}")
        if self.warmup_chunks < 0 or self.preset_warmup_chunks < 0:
            raise ValueError("UltrafastConfig: warmup_chunks and preset_warmup_chunks must be >= 0")
        if any(k < 1 for k in (*self.kinematic_ks, *self.learned_ks, self.relaxed_k)):
            raise ValueError(f"UltrafastConfig: every k must be >= 1, got kinematic_ks={self.kinematic_ks}, "
                             f"learned_ks={self.learned_ks}, relaxed_k={self.relaxed_k}")


@dataclass(frozen=True)
class Stack:
    """One configuration: the target's engine (backend, precision, CUDA graphs) and how a chunk is decoded.
    decode: "target-only" | "kinematic" | "learned" | "one-graph" (torch CUDA greedy_chunk) | "preset";
    relax_bins: None for greedy acceptance (exact), else Relaxed(relax_bins) (lossy)."""

    backend: str
    precision: str
    decode: str
    k: int = 0
    relax_bins: int | None = None
    graphs: bool = False
    baseline: bool = False
    threads: int | None = None  # the engine's CPU threads (None: the run's)

    def rule(self) -> Greedy | Relaxed:
        return Relaxed(self.relax_bins) if self.relax_bins is not None else Greedy()

    @property
    def name(self) -> str:
        engine = f"{self.backend}{'+graphs' if self.graphs else ''} {self.precision}" + (
            f" x{self.threads} threads" if (self.threads or 1) > 1 else "")
        decode = self.decode + (f" k={self.k}" if self.k else "")
        return f"{engine} {decode}" + (f" relaxed+/-{self.relax_bins}" if self.relax_bins is not None else "")


def stacks(cfg: UltrafastConfig, learned: bool) -> list[Stack]:
    """The rows of one policy in run order: the baseline first (it defines every ratio), then each engine's
    decodes, then the auto-picked preset. On CPU the torch target-only row is the baseline itself.
    learned: the draft model beside the policy (engines/drafters.draft_path) was distilled from it."""
    cuda = cfg.device.startswith("cuda")
    rows = [Stack("torch", "fp32", "target-only", baseline=True)]
    for backend, precision, threads in cfg.engines:
        graphs = cuda and backend == "torch"
        decodes = [("kinematic", k) for k in cfg.kinematic_ks]
        if learned:
            decodes += [("learned", k) for k in cfg.learned_ks]
        if graphs or (backend, precision) != ("torch", "fp32"):
            decodes.insert(0, ("target-only", 0))
        if graphs:
            decodes.append(("one-graph", 0))
        rows += [Stack(backend, precision, d, k, graphs=graphs, threads=threads) for d, k in decodes]
        if cfg.relaxed_bins is not None:
            rows.append(Stack(backend, precision, "kinematic", cfg.relaxed_k, cfg.relaxed_bins, graphs=graphs,
                              threads=threads))
    return rows + [Stack("auto", "fp32", "preset")] * cfg.preset


class TimedDrafter:
    """A drafter's proposals, timed: ns spent in reset and propose (propose_dist), and tokens drafted."""

    def __init__(self, inner, clock: Callable[[], int] = time.perf_counter_ns):
        self.inner, self.clock, self.name = inner, clock, inner.name
        self.ns = self.drafted = 0

    def reset(self, q_rad, qd_rad_s, q_prev_rad) -> None:
        t0 = self.clock()
        self.inner.reset(q_rad, qd_rad_s, q_prev_rad)
        self.ns += self.clock() - t0

    def propose(self, tokens, k: int) -> list[int]:
        t0 = self.clock()
        out = self.inner.propose(tokens, k)
        self.ns += self.clock() - t0
        self.drafted += len(out)
        return out

    def propose_dist(self, tokens, k, warp, rng):
        t0 = self.clock()
        out, q = self.inner.propose_dist(tokens, k, warp, rng)
        self.ns += self.clock() - t0
        self.drafted += len(out)
        return out, q


def measure_stack(engine, policy, feats: np.ndarray, stack: Stack, drafter=None,
                  warmup: int = 5) -> tuple[dict, np.ndarray]:
    """Decode one complete chunk per raw feature row feats (N, 3D) on `engine` as `stack` says; returns the
    row's figures (module docstring; agreement, RMSE and ratio are filled by the caller) and its tokens
    (N, n_tokens) int64. The first `warmup` chunks (cycling through feats) are decoded untimed."""
    n, d, perf = policy.cfg.n_tokens, policy.cfg.n_joints, time.perf_counter_ns
    obs = policy.normalise(feats)
    rule = stack.rule()
    timed = TimedDrafter(drafter) if drafter is not None else None
    planner = None
    if stack.decode == "preset":  # what the runtime's ultrafast preset runs: adaptive k, no deadline
        planner = TickPlanner(SchedulerConfig(), (timed.name,), row_tokens=d)  # as the runtime builds it
        planner.unlimited()
    elif stack.decode != "one-graph":
        planner = FixedK(stack.k if timed else 0)
    chunk_ns, tokens, passes, drafted, accepted, draft_passes = [], [], 0, 0, 0, 0
    for i in range(-warmup, len(feats)):
        f, o = feats[i % len(feats)], obs[i % len(feats)]
        if i == -warmup * 2 // 3 and stack.decode == "preset":
            planner.forget_costs()  # as the runtime's warm-up: drop the one-off costs of first calls
        if i == 0 and timed is not None:
            timed.ns = timed.drafted = 0
            draft_passes = -getattr(drafter, "passes", 0)
        t0 = perf()
        if stack.decode == "one-graph":
            res = DecodeResult(engine.greedy_chunk(o), target_passes=n, complete=True)
        else:
            use = timed
            if isinstance(planner, TickPlanner) and planner.choose() is None:
                use = None
            if use is not None:
                use.reset(f[:d], f[d:2 * d], f[:d] - f[2 * d:3 * d])
            res = speculative_decode(engine, o, n, use, planner, rule)
        t1 = perf()
        if i >= 0:
            chunk_ns.append(t1 - t0)
            tokens.append(res.tokens)
            passes += res.target_passes
            drafted += res.drafted
            accepted += res.accepted
    m = len(feats)
    out = {"chunk_us_p50": _us(chunk_ns, 50), "chunk_us_p99": _us(chunk_ns, 99),
           "target_passes_per_chunk": round(passes / m, 3), "tokens_per_pass": round(m * n / passes, 3),
           "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
           "drafter_us_per_token": round(timed.ns / timed.drafted / 1e3, 3) if timed and timed.drafted else None,
           "draft_passes_per_chunk": round((draft_passes + drafter.passes) / m, 3) if hasattr(drafter, "passes")
           else None}
    return out, np.asarray(tokens, np.int64)


class _Engines:
    """The engine of the rows being measured (one open at a time, by key) and its learned drafter; an engine
    that cannot be opened gives the same error to each of its rows."""

    def __init__(self, policy, device: str, threads: int):
        self.policy, self.device, self.threads = policy, device, threads
        self.key, self.engine, self.error, self.info, self._learned = None, None, None, None, None

    def open(self, stack: Stack) -> None:
        key = (stack.backend, stack.precision, stack.graphs, stack.threads)
        if key == self.key:
            return
        if hasattr(self.engine, "close"):
            self.engine.close()  # the packed engine's worker thread: not left spinning beside the next rows
        self.key, self.engine, self.error, self.info, self._learned = key, None, None, None, None
        try:
            if stack.backend == "auto":
                self.engine, self.info = _open_auto(self.policy, self.device, self.threads)
            else:
                self.engine = _open(self.policy, stack, self.device, stack.threads or self.threads)
        except _Unavailable as e:
            self.error = f"unavailable: {e}"
        except Exception as e:  # one engine that fails is an error row, not the end of the bench
            self.error = f"{type(e).__name__}: {e}"

    def drafter(self, stack: Stack):
        if stack.decode in ("target-only", "one-graph"):
            return None
        if stack.decode == "preset":
            serve = serve_defaults(self.policy.path) if getattr(self.policy, "path", None) else {}
            return make_drafter(serve.get("drafter", _preset_drafter()), self.policy)
        if stack.decode != "learned":
            return kinematic_drafter(self.policy.tokenizer)
        if self._learned is None:  # the draft model on the target's own engine kind
            options = {"cuda_graphs": stack.graphs} if stack.backend == "torch" and self.device.startswith("cuda") \
                else {}
            self._learned = make_drafter("learned", self.policy, backend=stack.backend, precision=stack.precision,
                                         device=self.device, threads=1, **options)
        return self._learned


class _Unavailable(RuntimeError):
    """This engine cannot be opened here (library, device, or a precision the backend does not build)."""


def _open(policy, stack: Stack, device: str, threads: int):
    """load_engine for a stack row. Raises _Unavailable when the backend cannot run here or does not build
    the precision, RuntimeError when CUDA graphs were asked for and capture failed."""
    from edgeinfer.engines.backends.build import load_engine

    reason = unavailable_reason(stack.backend, device)
    if reason:
        raise _Unavailable(reason)
    if stack.precision not in BUILDS.get(stack.backend, PRECISIONS):
        raise _Unavailable(f"{stack.backend} does not build {stack.precision} (engines.engine.BUILDS)")
    options = {"cuda_graphs": stack.graphs} if stack.backend == "torch" and device.startswith("cuda") else {}
    engine = load_engine(policy, stack.backend, stack.precision, device, threads, **options)
    if stack.graphs and not engine.cuda_graphs:
        raise RuntimeError(f"CUDA graphs requested but not in use: {engine.graph_error}")
    return engine


def _open_auto(policy, device: str, threads: int):
    """(engine, choice dict) from engines/backends/auto.py, as the runtime's ultrafast preset opens it
    (node/runtime.py): measured with the preset's drafter (or the one the policy's manifest recommends) at min(k_max,
    PROBE_K), on the threads the manifest recommends when the run's are the default 1; measured afresh (never the cached
    choice)."""
    from edgeinfer.engines.backends.auto import PROBE_K, open_auto

    serve = serve_defaults(policy.path) if getattr(policy, "path", None) else {}
    return open_auto(policy, device, serve.get("threads", threads) if threads == 1 else threads,
                     serve.get("drafter", _preset_drafter()), min(SchedulerConfig().k_max, PROBE_K), cache=False)


def _preset_drafter() -> str:
    """The ultrafast preset's drafter (edgeinfer.node.runtime.ULTRAFAST; imported here: it imports msgpack, which
    the bench's GPU machines may lack, and only this row needs it)."""
    from edgeinfer.node.runtime import ULTRAFAST

    return ULTRAFAST["drafter"]


def default_policies() -> list[Path]:
    """The shipped target, and the large one when it is shipped."""
    return [DEFAULT_POLICY] + ([LARGE_POLICY] if LARGE_POLICY.exists() else [])


def _distilled_from(path: Path) -> str | None:
    try:
        return json.loads(Path(path).read_text()).get("distilled_from")
    except (OSError, ValueError):
        return None


def bench_ultrafast(policies: list, cfg: UltrafastConfig | None = None, data_dir=None,
                    save: Callable[[dict], None] = lambda section: None, quiet: bool = False) -> dict:
    """Measure every stack row (module docstring) of each policy: manifest paths or loaded Policies, labelled
    by manifest (weights) stem. Returns {"config", "policies", "rows", "headline"}; save(section) is called
    after every row (a run cut short keeps what it measured). Raises nothing for a row that fails."""
    cfg = cfg or UltrafastConfig()
    section = {"device": cfg.device, "n_obs": cfg.n_obs, "config": dataclasses.asdict(cfg), "goal_ratio": GOAL_RATIO,
               "policies": {}, "rows": [], "headline": []}
    plans = []
    for p in policies:
        path, policy = (Path(p), load_policy(p)) if isinstance(p, (str, Path)) else (None, p)
        name = Path(path or policy.manifest.get("weights", "policy")).stem
        name += f"#{len(plans) + 1}" if any(name == n for n, _, _ in plans) else ""  # two files of one name
        learned = _distilled_from(draft_path(policy)) == policy.manifest.get("sha256")  # its own draft
        plans.append((name, policy, stacks(cfg, learned)))
    console = Console(stderr=True, quiet=quiet)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("ultrafast rows", total=sum(len(s) for _, _, s in plans))
        for name, policy, rows in plans:
            feats, offsets, source = sample_windows(policy, cfg.n_obs, PARITY_SEED, data_dir)
            params = sum(p.numel() for p in policy.model.parameters())
            section["policies"][name] = {"params": params, "n_tokens": policy.cfg.n_tokens, "data": source,
                                         "sha256": policy.manifest.get("sha256")}
            engines, ref = _Engines(policy, cfg.device, cfg.threads), None
            for stack in rows:
                progress.update(task, description=f"{name}: {stack.name}")
                warmup = cfg.preset_warmup_chunks if stack.decode == "preset" else cfg.warmup_chunks
                row, tokens = _row(engines, policy, feats, offsets, stack, ref, warmup)
                row["policy"] = name
                if stack.baseline:
                    ref = (tokens, row["chunk_us_p50"]) if tokens is not None else None
                section["rows"].append(row)
                section["headline"] = headline(section)
                save(section)
                progress.advance(task)
                console.print(f"{name}: {stack.name}: " + (row["error"] or (
                    f"chunk p50 {row['chunk_us_p50']:.0f} us, x{row['vs_baseline']:.2f}, {row['label']}")),
                    markup=False, highlight=False, soft_wrap=True)
            if ref is not None:  # the baseline again: a machine whose load changed during the rows shows here
                progress.update(task, description=f"{name}: the baseline again")
                end, _ = _row(engines, policy, feats, offsets, rows[0], None, cfg.warmup_chunks)
                if end["error"] is None:
                    section["policies"][name]["baseline_end_us_p50"] = end["chunk_us_p50"]
                    section["policies"][name]["baseline_drift"] = round(end["chunk_us_p50"] / ref[1], 3)
                    section["headline"] = headline(section)
                    save(section)
    return section


def _row(engines: _Engines, policy, feats, offsets, stack: Stack, ref, warmup: int) -> tuple[dict, np.ndarray | None]:
    """One row's dict and its tokens (None for an error row). ref: the baseline's (tokens, chunk p50 us)."""
    row = {"backend": stack.backend, "precision": stack.precision, "cuda_graphs": stack.graphs,
           "threads": stack.threads, "decode": stack.decode, "k": stack.k or None,
           "acceptance": "greedy" if stack.relax_bins is None else f"relaxed+/-{stack.relax_bins}",
           "baseline": stack.baseline, "name": stack.name,
           **dict.fromkeys(FIGURES), "label": None, "picked": None, "choice": None, "error": None}
    t0, tokens = time.perf_counter(), None
    engines.open(stack)
    if stack.backend == "auto" and engines.info is not None:
        row["picked"], row["choice"] = engines.info["chosen"], engines.info
        row["name"] = f"auto ({row['picked']}) fp32 ultrafast preset"
    if engines.error:
        row["error"] = engines.error
    elif ref is None and not stack.baseline:
        row["error"] = "no baseline: torch fp32 eager target-only failed in this run"
    else:
        try:
            drafter = engines.drafter(stack)
            figures, tokens = measure_stack(engines.engine, policy, feats, stack, drafter, warmup)
            row.update(figures)
            ref_tokens, ref_p50 = (tokens, figures["chunk_us_p50"]) if stack.baseline else ref
            row["vs_baseline"] = round(ref_p50 / row["chunk_us_p50"], 3)
            row["token_agreement"] = float(np.mean(tokens == ref_tokens))
            row["action_rmse_rad"] = action_rmse_rad(policy.tokenizer, tokens, feature_increment(feats), offsets)
            row["exact"] = row["token_agreement"] == 1.0 and not stack.rule().lossy  # relaxed: lossy by its rule
            row["label"] = "exact" if row["exact"] else "lossy"
        except Exception as e:  # one failing row is a row, not the end of the bench
            row["error"], tokens = f"{type(e).__name__}: {e}", None
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row, tokens


def headline(section: dict) -> list[str]:
    """Per policy: the fastest EXACT row and its ratio against torch-eager target-only, against the goal; the
    ultrafast (auto) row's; a warning when the baseline drifted during the run; and the fastest lossy row when
    it beats the fastest exact one."""
    lines = []
    for name in section["policies"]:
        rows = [r for r in section["rows"] if r["policy"] == name and not r["error"]]
        base = next((r for r in rows if r["baseline"]), None)
        if base is None:
            lines.append(f"{name}: no baseline (torch fp32 eager target-only) measured")
            continue
        exact = min((r for r in rows if r["exact"]), key=lambda r: r["chunk_us_p50"])
        goal = GOALS.get(name.split("#")[0], {}).get("vs_baseline", GOAL_RATIO)
        met = "MET" if exact["vs_baseline"] >= goal else "NOT met"
        lines.append(f"{name}: fastest exact: {exact['name']}, full chunk p50 {exact['chunk_us_p50'] / 1e3:.3f} ms "
                     f"(p99 {exact['chunk_us_p99'] / 1e3:.3f} ms) = x{exact['vs_baseline']:.2f} torch eager "
                     f"target-only ({base['chunk_us_p50'] / 1e3:.3f} ms); goal x{goal:g}: {met}")
        engine = ("backend", "precision", "cuda_graphs", "threads")
        own = next((r for r in rows if r["decode"] == "target-only" and r["acceptance"] == "greedy"
                    and all(r.get(f) == exact.get(f) for f in engine)), None)
        if own is not None and exact["decode"] not in ("target-only", "one-graph"):
            spec_goal = GOALS.get(name.split("#")[0], {}).get("spec_vs_target_only")
            ratio = own["chunk_us_p50"] / exact["chunk_us_p50"]
            lines.append(f"{name}: speculation on that engine: x{ratio:.2f} its own target-only "
                         f"({own['chunk_us_p50'] / 1e3:.3f} ms), {exact['tokens_per_pass']:.2f} tokens per target "
                         f"pass, acceptance {exact['acceptance_rate']:.3f}, tokens identical: "
                         f"{'yes' if exact['exact'] else 'NO'}"
                         + (f"; goal x{spec_goal:g}: {'MET' if ratio >= spec_goal else 'NOT met'}" if spec_goal
                            else ""))
        for r in rows:
            if r["decode"] == "preset":
                lines.append(f"{name}: ultrafast preset (auto picked {r['picked']}): full chunk p50 "
                             f"{r['chunk_us_p50'] / 1e3:.3f} ms = x{r['vs_baseline']:.2f}, {r['label']}")
        drift = section["policies"][name].get("baseline_drift")
        if drift is not None and not 1 / DRIFT_LIMIT <= drift <= DRIFT_LIMIT:
            lines.append(f"{name}: WARNING: the baseline measured x{drift:.2f} its first time after the rows: the "
                         "machine's load changed during the run, ratios are unreliable")
        lossy = min((r for r in rows if not r["exact"]), key=lambda r: r["chunk_us_p50"], default=None)
        if lossy and lossy["chunk_us_p50"] < exact["chunk_us_p50"]:
            lines.append(f"{name}: fastest LOSSY (not a candidate): {lossy['name']} x{lossy['vs_baseline']:.2f}, "
                         f"token agreement {lossy['token_agreement']:.4f}")
    return lines


def _fmt(v, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def print_ultrafast(section: dict, console: Console | None = None) -> None:
    """The rows as a table (one per run), then the headline."""
    table = Table(title=f"ultrafast rows on {section['device']} ({section['n_obs']} observations per row)")
    head = ["policy", "configuration", "chunk p50 us", "chunk p99 us", "vs torch eager", "passes/chunk", "tok/pass",
            "accept", "drafter us/tok", "agree", "rmse rad", "label", "error"]
    cells = [[r["policy"], r["name"], _fmt(r["chunk_us_p50"], 0), _fmt(r["chunk_us_p99"], 0),
              _fmt(r["vs_baseline"], 2), _fmt(r["target_passes_per_chunk"], 1), _fmt(r["tokens_per_pass"], 2),
              _fmt(r["acceptance_rate"], 3), _fmt(r["drafter_us_per_token"], 2), _fmt(r["token_agreement"], 4),
              _fmt(r["action_rmse_rad"], 6), r["label"] or "", (r["error"] or "")[:60]] for r in section["rows"]]
    for h in head:
        left = h in ("policy", "configuration", "label", "error")
        table.add_column(h, justify="left" if left else "right", no_wrap=True)
    for c in cells:
        table.add_row(*c)
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(head)]
    console = console or Console(width=max(120, sum(w + 3 for w in widths) + 1))  # never squeeze a column
    console.print(table)
    console.print("\n".join(f"error: {r['policy']}: {r['name']}: {r['error']}" for r in section["rows"]
                            if r["error"]), markup=False, highlight=False)
    sizes = ", ".join(f"{n}: {p['params'] / 1e6:.2f} M parameters" for n, p in section["policies"].items())
    console.print(f"policies: {sizes}\n" + "\n".join(section["headline"]), markup=False, highlight=False)
