"""Engine bench: every (backend, precision[, CUDA graphs]) side by side, latency and parity, in one run.

    python -m edgeinfer.bench.engines --device cuda --json out/bench_cuda.json
    python -m edgeinfer.bench.engines --summary out/bench_*.json     # merge and print saved runs

Per row, on real held-out observations (engines/backends/calibration.py; synthetic with a warning when absent):
    per_token_us     one single-token decode pass (p50, p99)
    verify_us_p50    one verify pass of k drafts + the last committed token, k in 1, 2, 4, 8, 16
    pass_cost_us_p50 one pass over t tokens, t = 1..9: the cost curve of verification (its ratio to t = 1 is the
                     price of verifying t - 1 drafts; an engine that reads its weights once per pass keeps it flat)
    chunk_us         prefill + target-only greedy decoding of the whole H*D-token chunk (p50, p99)
    spec_chunk_us    the same chunk decoded speculatively with the kinematic drafter, k = 4 (p50)
    max_abs_logit_diff, teacher_forced_agreement
                     against the fp32 torch CPU reference, both fed the reference's greedy tokens
    token_agreement  fraction of tokens equal to the reference's when each decodes greedily on its own
    action_rmse_rad  decoded chunks against the recorded future of the arm (tokenizer decode)
    spec_equals_greedy   fraction of speculative chunks identical to the engine's own greedy ones (1.0)
    graphs_equal_eager   CUDA graph rows: the same for the same engine without graphs (1.0)
Then the ultrafast rows of every --policy (edgeinfer/bench/ultrafast.py): each layer of the stack against
torch-eager target-only in the same run (`--rows engines|ultrafast` runs one part; engine rows: the first policy).
Timing: time.perf_counter_ns around each call, warm-up excluded; every engine returns numpy, which waits
for the device. Imports no zmq (the GPU machines have no pyzmq).
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from rich.console import Console
from rich.table import Table

from edgeinfer.bench.suite_report import percentile_us as _us
from edgeinfer.core.config import refuse_bad
from edgeinfer.core.speculative import FixedK, speculative_decode
from edgeinfer.engines.backends.calibration import sample_windows
from edgeinfer.engines.backends.engine import BUILDS, PRECISIONS, unavailable_reason
from edgeinfer.engines.models.drafters import kinematic_drafter
from edgeinfer.engines.models.policy import feature_increment, load_policy
from edgeinfer.engines.models.tokenizer import action_rmse_rad

VERIFY_KS = (1, 2, 4, 8, 16)
PASS_TOKENS = tuple(range(1, 10))  # the pass-cost curve
SPEC_K = 4
WARMUP = 5
PARITY_SEED = 1  # observations for timing and parity; calibration draws with seed 0
METRICS = ("per_token_us_p50", "per_token_us_p99", "verify_us_p50", "pass_cost_us_p50", "chunk_us_p50", "chunk_us_p99",
           "spec_chunk_us_p50", "spec_tokens_per_pass", "spec_equals_greedy", "max_abs_logit_diff",
           "teacher_forced_agreement", "token_agreement", "action_rmse_rad")



def _teacher_forced(engine, obs: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Logits (n_tokens, n_bins) float32: prefill, then one single-token pass per reference token."""
    rows = [engine.forward(obs, (), 0)[-1]]
    for p in range(1, len(tokens)):
        rows.append(engine.forward(None, (int(tokens[p - 1]),), p)[-1])
    return np.stack(rows).astype(np.float32)


def reference(policy, obs: np.ndarray, threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The fp32 torch CPU engine's greedy decoding of obs (N, obs_dim): tokens (N, n_tokens) int64 and the
    logits behind them (N, n_tokens, n_bins) float32, one single-token pass per token."""
    engine = _open(policy, "torch", "fp32", "cpu", threads, graphs=False)
    n = policy.cfg.n_tokens
    tokens, logits = np.zeros((len(obs), n), np.int64), []
    for i, o in enumerate(obs):
        tokens[i] = speculative_decode(engine, o, n, None, FixedK(0)).tokens
        logits.append(_teacher_forced(engine, o, tokens[i]))
    return tokens, np.stack(logits)


def measure(engine, policy, obs: np.ndarray, feats: np.ndarray, offsets: np.ndarray, ref_tokens: np.ndarray,
            ref_logits: np.ndarray, n_iters: int) -> tuple[dict, np.ndarray]:
    """Latency and parity of one engine (see the module docstring), and its own greedy tokens (N, n_tokens).
    obs (N, obs_dim) normalised, feats the raw features behind them, offsets (N, H, D) rad the recorded
    future, ref_* from `reference`."""
    n, perf = policy.cfg.n_tokens, time.perf_counter_ns
    out: dict = {}

    # single-token decode passes at positions 1..n-1 after a prefill
    engine.forward(obs[0], (), 0)
    samples = []
    for i in range(WARMUP + n_iters):
        p = 1 + i % (n - 1)
        t0 = perf()
        engine.forward(None, (int(ref_tokens[0, p - 1]),), p)
        samples.append(perf() - t0)
    out["per_token_us_p50"], out["per_token_us_p99"] = _us(samples[WARMUP:], 50), _us(samples[WARMUP:], 99)

    out["pass_cost_us_p50"] = {}
    for t in sorted({*PASS_TOKENS, *(k + 1 for k in VERIFY_KS)}):
        toks = tuple(int(x) for x in ref_tokens[0, :t])
        samples = []
        for _ in range(WARMUP + n_iters):
            t0 = perf()
            engine.forward(None, toks, 1)
            samples.append(perf() - t0)
        out["pass_cost_us_p50"][str(t)] = _us(samples[WARMUP:], 50)
    out["verify_us_p50"] = {str(k): out["pass_cost_us_p50"][str(k + 1)] for k in VERIFY_KS}
    out["pass_cost_us_p50"] = {str(t): out["pass_cost_us_p50"][str(t)] for t in PASS_TOKENS}

    # full chunks, target-only and speculative, one per observation (the first WARMUP decodes untimed)
    drafter, d = kinematic_drafter(policy.tokenizer), policy.cfg.n_joints
    greedy, chunk_ns, spec_ns, spec_passes, spec_equal = [], [], [], 0, 0
    for i in range(-min(WARMUP, len(obs)), len(obs)):
        o = obs[max(i, 0)]
        t0 = perf()
        res = speculative_decode(engine, o, n, None, FixedK(0))
        t1 = perf()
        f = feats[max(i, 0)]
        drafter.reset(np.zeros(d), f[d:2 * d], -f[2 * d:3 * d])  # the drafter only reads q - q_prev
        spec = speculative_decode(engine, o, n, drafter, FixedK(SPEC_K))
        t2 = perf()
        if i >= 0:
            greedy.append(res.tokens)
            chunk_ns.append(t1 - t0)
            spec_ns.append(t2 - t1)
            spec_passes += spec.target_passes
            spec_equal += spec.tokens == res.tokens
    out["chunk_us_p50"], out["chunk_us_p99"] = _us(chunk_ns, 50), _us(chunk_ns, 99)
    out["spec_chunk_us_p50"] = _us(spec_ns, 50)
    out["spec_tokens_per_pass"] = round(len(obs) * n / spec_passes, 3)
    out["spec_equals_greedy"] = spec_equal / len(obs)  # must be 1.0: speculative decoding is exact

    # the whole greedy chunk as one CUDA graph replay (torch on CUDA with graphs only)
    if getattr(engine, "cuda_graphs", False):
        one_ns, one_equal = [], 0
        for i in range(-min(WARMUP, len(obs)), len(obs)):
            t0 = perf()
            toks = engine.greedy_chunk(obs[max(i, 0)])
            if i >= 0:
                one_ns.append(perf() - t0)
                one_equal += toks == greedy[i]
        out["one_graph_chunk_us_p50"], out["one_graph_chunk_us_p99"] = _us(one_ns, 50), _us(one_ns, 99)
        out["one_graph_equals_greedy"] = one_equal / len(obs)

    # parity with the fp32 CPU reference
    logits = np.stack([_teacher_forced(engine, o, t) for o, t in zip(obs, ref_tokens)])
    greedy = np.asarray(greedy)
    out["max_abs_logit_diff"] = float(np.abs(logits - ref_logits).max())
    out["teacher_forced_agreement"] = float(np.mean(logits.argmax(-1) == ref_tokens))
    out["token_agreement"] = float(np.mean(greedy == ref_tokens))
    out["action_rmse_rad"] = action_rmse_rad(policy.tokenizer, greedy, feature_increment(feats), offsets)
    return out, greedy


def _row_specs(backends, precisions, device: str, cuda_graphs: str) -> list[tuple[str, str, bool]]:
    """(backend, precision, graphs) in run order: on CUDA every eager row before any graph row, so that a
    capture that goes wrong cannot spoil rows already measured."""
    graph_modes = [False]
    if device.startswith("cuda"):
        graph_modes = {"both": [False, True], "on": [True], "off": [False]}[cuda_graphs]
    specs = []
    for graphs in graph_modes:
        for backend in backends:
            if graphs and backend != "torch":
                continue  # graphs are a torch-backend option
            specs.extend((backend, precision, graphs) for precision in precisions
                         if precision in BUILDS.get(backend, PRECISIONS))  # unknown backends: an error row
    return specs


def _with_threads(specs, threads: int) -> list[tuple[str, str, bool, int]]:
    """The row specs with their CPU threads: `threads` each, and the packed engine also on 2 (a pass shared by two
    threads) when `threads` is 1."""
    out = []
    for backend, precision, graphs in specs:
        out.append((backend, precision, graphs, threads))
        if backend == "packed" and threads == 1:
            out.append((backend, precision, graphs, 2))
    return out


def _open(policy, backend: str, precision: str, device: str, threads: int, graphs: bool, compile: bool = False):
    """load_engine, with the torch engine's CUDA-graph option on CUDA. Raises RuntimeError when graphs were
    asked for but capture failed (the engine would silently run eager)."""
    from edgeinfer.engines.backends.build import load_engine

    options = {"cuda_graphs": graphs} if backend == "torch" and device.startswith("cuda") else {}
    if backend == "torch" and compile:
        options["compile"] = True
    engine = load_engine(policy, backend, precision, device, threads, **options)
    if graphs and not engine.cuda_graphs:
        raise RuntimeError(f"CUDA graphs requested but not in use: {engine.graph_error}")
    return engine


def machine_info() -> dict:
    """CPU, cores, GPU and library versions of this machine."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "torch_threads": torch.get_num_threads(),
            "gpu": None, "gpu_capability": None, "onnxruntime": None}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    for dist in ("onnxruntime", "onnxruntime-gpu"):
        try:
            info["onnxruntime"] = f"{importlib.metadata.version(dist)} ({dist})"
            break
        except importlib.metadata.PackageNotFoundError:
            pass
    return info


def bench_engines(policy=None, backends=("torch", "onnxruntime", "fused", "packed"), precisions=PRECISIONS,
                  device: str = "cpu",
                  n_obs: int = 100, json_out: str | Path | None = None, *, n_iters: int = 200, threads: int = 1,
                  cuda_graphs: str = "both", data_dir=None, quiet: bool = False, compile: bool = False) -> dict:
    """Measure every available combination; returns {"machine", "data", "reference", "rows"} (and writes
    it as JSON to json_out). A row that cannot run or fails carries `error` and None metrics; nothing
    here raises for one engine. cuda_graphs: "both" | "on" | "off", torch rows on CUDA only. compile: torch
    rows run single-token passes through torch.compile (compile time excluded: it happens at warm-up)."""
    policy = policy or load_policy()
    feats, offsets, source = sample_windows(policy, n_obs, PARITY_SEED, data_dir)
    obs = policy.normalise(feats)
    specs = _row_specs(backends, precisions, device, cuda_graphs)
    result = {
        "machine": machine_info(),
        "data": {"source": source, "n_obs": n_obs, "seed": PARITY_SEED, "n_iters": n_iters, "threads": threads},
        "reference": {"backend": "torch", "precision": "fp32", "device": "cpu", "action_rmse_rad": None},
        "rows": [],
    }
    if any(unavailable_reason(b, device) is None for b, _, _ in specs):  # else every row is an error row
        t0 = time.perf_counter()
        ref_tokens, ref_logits = reference(policy, obs, threads)
        result["reference"]["action_rmse_rad"] = action_rmse_rad(policy.tokenizer, ref_tokens, feature_increment(feats),
                                                                 offsets)
        result["reference"]["seconds"] = round(time.perf_counter() - t0, 2)
    _save(result, json_out)
    for backend, precision, graphs, row_threads in _with_threads(specs, threads):
        row = {"backend": backend, "precision": precision, "device": device, "cuda_graphs": graphs,
               "threads": row_threads, "compiled": compile and backend == "torch",
               **dict.fromkeys(METRICS), "fp8_kernel": None, "graphs_equal_eager": None,
               "error": None}
        t0 = time.perf_counter()
        reason = unavailable_reason(backend, device)
        if reason:
            row["error"] = f"unavailable: {reason}"
        else:
            try:
                engine = _open(policy, backend, precision, device, row_threads, graphs, compile)
                metrics, greedy = measure(engine, policy, obs, feats, offsets, ref_tokens, ref_logits, n_iters)
                row.update(metrics, fp8_kernel=getattr(engine, "fp8_kernel", None))
                if graphs:  # exactness: the same tokens as the same engine without graphs
                    engine = _open(policy, backend, precision, device, threads, False, compile)
                    eager = [speculative_decode(engine, o, len(greedy[0]), None, FixedK(0)).tokens for o in obs]
                    row["graphs_equal_eager"] = float(np.mean([e == g.tolist() for e, g in zip(eager, greedy)]))
            except Exception as e:  # one failing engine is a row, not the end of the bench
                row["error"] = f"{type(e).__name__}: {e}"
                if not quiet and not isinstance(e, ValueError):  # ValueError: a precision it does not build
                    traceback.print_exc()
            finally:
                engine = None
        row["seconds"] = round(time.perf_counter() - t0, 2)
        result["rows"].append(row)
        if not quiet:
            status = row["error"] or f"chunk p50 {row['chunk_us_p50']} us"
            print(f"[{backend} {precision} {device} graphs={graphs} threads={row_threads}] {status}", file=sys.stderr)
        _save(result, json_out)  # after every row: a run cut short by a timeout keeps what it measured
    return result


def _save(result: dict, json_out: str | Path | None) -> None:
    if json_out:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(json_out).write_text(json.dumps(result, indent=2) + "\n")


def _fmt(v, digits=1):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2e}" if 0 < abs(v) < 10.0 ** -digits else f"{v:.{digits}f}"
    return str(v)


def table_rows(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Header and text cells of the bench table (one line per row)."""
    # vK p50: one verify pass of K drafts + the last committed token
    head = ["backend", "prec", "device", "graphs", "tok p50 us", "tok p99 us",
            *[f"v{k} p50" for k in VERIFY_KS], "chunk p50 us", "chunk p99 us", "spec p50 us", "tok/pass",
            "1-graph chunk p50 us", "max|dlogit|", "tf agree", "agree", "rmse rad", "spec=greedy", "graphs=eager",
            "error"]
    cells = []
    for r in rows:
        v = r.get("verify_us_p50") or {}
        threads = r.get("threads") or 1
        name = r["backend"] + ("+compile" if r.get("compiled") else "") + (f" x{threads}" if threads > 1 else "")
        cells.append([name, r["precision"], r["device"], "on" if r["cuda_graphs"] else "off",
                      _fmt(r["per_token_us_p50"]), _fmt(r["per_token_us_p99"]),
                      *[_fmt(v.get(str(k))) for k in VERIFY_KS],
                      _fmt(r["chunk_us_p50"], 0), _fmt(r["chunk_us_p99"], 0), _fmt(r["spec_chunk_us_p50"], 0),
                      _fmt(r.get("spec_tokens_per_pass"), 2), _fmt(r.get("one_graph_chunk_us_p50"), 0),
                      _fmt(r["max_abs_logit_diff"], 4),
                      _fmt(r.get("teacher_forced_agreement"), 4), _fmt(r["token_agreement"], 4),
                      _fmt(r["action_rmse_rad"], 6), _fmt(r.get("spec_equals_greedy"), 3),
                      _fmt(r.get("graphs_equal_eager"), 3), (r["error"] or "")[:60]])
    return head, cells


def print_table(result: dict, title: str = "engine bench") -> None:
    """The rows as a table, then machine, data and full errors."""
    head, cells = table_rows(result["rows"])
    m, data = result.get("machine", {}), result.get("data", {})
    notes = [f"machine: {m.get('cpu')} ({m.get('cores')} cores), GPU {m.get('gpu')} (sm {m.get('gpu_capability')}), "
             f"torch {m.get('torch')} (CUDA {m.get('torch_cuda')}), onnxruntime {m.get('onnxruntime')}",
             f"data: {data.get('n_obs')} observations, {data.get('source')}",
             f"fp32 torch CPU reference action RMSE {result.get('reference', {}).get('action_rmse_rad')} rad"]
    notes += [f"fp8 kernel: {r['backend']} {r['device']} graphs={r['cuda_graphs']}: {r['fp8_kernel']}"
              for r in result["rows"] if r.get("fp8_kernel")]
    notes += [f"error: {r['backend']} {r['precision']} {r['device']} graphs={r['cuda_graphs']}: {r['error']}"
              for r in result["rows"] if r["error"]]
    table = Table(title=title)
    for h in head:
        left = h in ("backend", "prec", "device", "graphs", "error")
        table.add_column(h, justify="left" if left else "right", no_wrap=True)
    for c in cells:
        table.add_row(*c)
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(head)]
    console = Console(width=max(120, sum(w + 3 for w in widths) + 1))  # never squeeze a column
    console.print(table)
    console.print("\n".join(notes), soft_wrap=True, highlight=False, markup=False)


def headline(rows: list[dict]) -> list[str]:
    """The questions the bench answers, in words: FP8 + CUDA graphs full-chunk latency against the 1 ms
    goal, FP8 against bf16 (latency, agreement, action error) for every device in rows, and CUDA graphs
    against eager (speed-up, identical tokens)."""
    def find(precision, device_prefix, graphs):
        for r in rows:
            if (r["backend"] == "torch" and r["precision"] == precision and r["device"].startswith(device_prefix)
                    and bool(r["cuda_graphs"]) == graphs and not r["error"] and not r.get("compiled")):
                return r
        return None

    lines = []
    for dev, graphs in (("cuda", True), ("cuda", False), ("cpu", False)):
        fp8, bf16 = find("fp8", dev, graphs), find("bf16", dev, graphs)
        label = f"torch {dev}" + (" + CUDA graphs" if graphs else "")
        if fp8:
            ms, spec_ms = fp8["chunk_us_p50"] / 1e3, fp8["spec_chunk_us_p50"] / 1e3
            met = lambda x: "MET" if x < 1 else "NOT met"  # noqa: E731
            goal = f"; goal < 1 ms: target-only {met(ms)}, speculative {met(spec_ms)}" if dev == "cuda" else ""
            lines.append(f"{label}: FP8 ({fp8.get('fp8_kernel')}) full action chunk p50 {ms:.3f} ms, "
                         f"p99 {fp8['chunk_us_p99'] / 1e3:.3f} ms (speculative k={SPEC_K}: "
                         f"{spec_ms:.3f} ms){goal}")
        if fp8 and bf16:
            lines.append(f"{label}: FP8 vs bf16: chunk {fp8['chunk_us_p50'] / 1e3:.3f} vs "
                         f"{bf16['chunk_us_p50'] / 1e3:.3f} ms "
                         f"(FP8 at x{bf16['chunk_us_p50'] / fp8['chunk_us_p50']:.2f} bf16's speed), "
                         f"token agreement with fp32 {fp8['token_agreement']:.3f} vs "
                         f"{bf16['token_agreement']:.3f}, action RMSE {fp8['action_rmse_rad']:.6f} vs "
                         f"{bf16['action_rmse_rad']:.6f} rad")
    for g in rows:
        if g.get("one_graph_chunk_us_p50") is not None:
            ms = g["one_graph_chunk_us_p50"] / 1e3
            name = "torch+compile" if g.get("compiled") else "torch"
            lines.append(f"{name} cuda {g['precision']}: whole greedy chunk in ONE CUDA graph p50 {ms:.3f} ms, p99 "
                         f"{g['one_graph_chunk_us_p99'] / 1e3:.3f} ms (goal < 1 ms: {'MET' if ms < 1 else 'NOT met'}); "
                         f"tokens identical to pass-by-pass greedy: {g['one_graph_equals_greedy']:.3f}")
    for precision in PRECISIONS:
        g, e = find(precision, "cuda", True), find(precision, "cuda", False)
        if g and e:
            same = g.get("graphs_equal_eager")
            gt, et = g["per_token_us_p50"], e["per_token_us_p50"]
            lines.append(f"torch cuda {precision}: CUDA graphs {gt:.1f} vs eager {et:.1f} us per token "
                         f"(x{et / gt:.1f}), chunk {g['chunk_us_p50'] / 1e3:.3f} vs {e['chunk_us_p50'] / 1e3:.3f} "
                         f"ms; greedy chunks identical to eager: {same if same is not None else 'not checked'}")
    for r in rows:
        cost = r.get("pass_cost_us_p50")
        if cost and not r["error"] and r["device"] == "cpu":
            curve = " ".join(f"{t}:{cost[t] / cost['1']:.2f}" for t in cost)
            lines.append(f"{r['backend']} {r['precision']} on {r.get('threads') or 1} thread(s): a pass of t tokens "
                         f"costs x(t:ratio) a single-token pass ({cost['1']:.0f} us): {curve}; a verify pass of 5 "
                         f"tokens x{cost['5'] / cost['1']:.2f} (goal <= 1.5: "
                         f"{'MET' if cost['5'] <= 1.5 * cost['1'] else 'NOT met'}); speculative k={SPEC_K} chunk "
                         f"x{r['chunk_us_p50'] / r['spec_chunk_us_p50']:.2f} its target-only")
    return lines or ["no torch fp8 row measured"]


@dataclass
class EnginesBenchConfig:
    """`edgeinfer bench engines`: the engine rows (backends x precisions on one device) and the ultrafast rows."""

    device: str = "cpu"  # the engines' device: cpu or cuda[:i]
    # The backends of the engine rows (packed runs on 1 and 2 threads).
    backends: tuple[str, ...] = ("torch", "onnxruntime", "fused", "packed")
    # The precisions of the engine rows; each backend runs those it builds (int8 on onnxruntime, bf16 and fp8 on
    # torch).
    precisions: tuple[str, ...] = PRECISIONS
    cuda_graphs: Literal["both", "on", "off"] = "both"  # torch rows on CUDA: with graphs, without, or both
    n_obs: int = 100  # held-out observations for chunks and parity
    n_iters: int = 200  # timed passes per per-token and verify-k figure
    threads: int = 1  # CPU threads per engine (1, as the runtime)
    data_dir: Path | None = None  # Schunk data (None: $EDGEINFER_DATA_DIR or ../shared/data)
    json: Path | None = None  # write the results here
    compile: bool = False  # torch rows: single-token passes via torch.compile
    # Policy manifests, repeatable (None: the shipped target, plus engines/weights/schunk_large_target.json when
    # shipped); the engine rows measure the first.
    policy: list[Path] | None = None
    # The engine rows, the ultrafast rows (each layer of the stack vs torch eager), or both.
    rows: Literal["all", "engines", "ultrafast"] = "all"
    ultrafast_n_obs: int = 50  # held-out observations per ultrafast row (50: both policies in a few minutes)
    summary: list[Path] | None = None  # print these saved results (merged) and exit

    def __post_init__(self):
        from edgeinfer.engines.backends.engine import BACKENDS

        refuse_bad(type(self).__name__, [(name, getattr(self, name), getattr(self, name) >= 1, ">= 1")
                                         for name in ("n_obs", "n_iters", "threads", "ultrafast_n_obs")])
        for name, given, known in (("backends", self.backends, BACKENDS), ("precisions", self.precisions,
                                                                             PRECISIONS)):
            if not given or set(given) - set(known):
                raise ValueError(f"--{name}: unknown {sorted(set(given) - set(known)) or 'none given'}; known: "
                                 f"{sorted(known)}")
        if missing := [str(p) for p in self.policy or () if not Path(p).is_file()]:
            raise ValueError(f"--policy: no such manifest: {', '.join(missing)}")


def main(argv: list[str] | None = None) -> int:
    """`edgeinfer bench engines` as a program of its own: parse EnginesBenchConfig options, then run_command."""
    from edgeinfer.bench.suite_cli import parse_suite

    return run_command(parse_suite("engines", EnginesBenchConfig, argv, __doc__.split("\n")[0])[0])


def run_command(cfg: EnginesBenchConfig) -> int:
    """`edgeinfer bench engines`: the engine rows, then the ultrafast rows (--rows), printed and saved to --json
    after each row; or, with --summary, saved results printed again. 0."""
    from edgeinfer.bench.ceiling import ceiling_lines
    from edgeinfer.bench.ultrafast import UltrafastConfig, bench_ultrafast, default_policies, print_ultrafast

    if cfg.summary:
        return _print_summary(cfg.summary)
    policies = list(cfg.policy) if cfg.policy else default_policies()
    result = {"machine": machine_info(), "rows": []}
    if cfg.rows != "ultrafast":
        result = bench_engines(load_policy(policies[0]), backends=cfg.backends, precisions=cfg.precisions,
                               device=cfg.device, n_obs=cfg.n_obs, json_out=cfg.json, n_iters=cfg.n_iters,
                               threads=cfg.threads, cuda_graphs=cfg.cuda_graphs, data_dir=cfg.data_dir,
                               compile=cfg.compile)
        print_table(result, f"engine bench on {cfg.device}")
        print("\n".join(headline(result["rows"])))
    if cfg.rows != "engines":
        def save(section: dict) -> None:  # after every row, with the engine rows already measured
            result["ultrafast"] = section
            _save(result, cfg.json)

        uf = UltrafastConfig(device=cfg.device, n_obs=cfg.ultrafast_n_obs, threads=cfg.threads)
        print_ultrafast(bench_ultrafast(policies, uf, cfg.data_dir, save))
    print("\n".join(ceiling_lines(result)))
    return 0


def _print_summary(paths: list[Path]) -> int:
    """Print saved results: the engine rows merged, each run's ultrafast rows on their own (their ratios hold
    within one run only). 0."""
    from edgeinfer.bench.ceiling import ceiling_lines
    from edgeinfer.bench.ultrafast import print_ultrafast

    results = [json.loads(Path(p).read_text()) for p in paths]
    merged = {**results[0], "rows": [r for res in results for r in res["rows"]]}
    if merged["rows"]:
        print_table(merged, "engine bench: " + ", ".join(map(str, paths)))
        print("\n".join(headline(merged["rows"])))
    for res in results:
        if res.get("ultrafast"):
            print_ultrafast(res["ultrafast"])
            print("\n".join(ceiling_lines(res)))
    return 0

if __name__ == "__main__":
    sys.exit(main())
