"""`backend="auto"`: at start-up, measure the exact engines available here and run the fastest.

    candidates   cpu: packed, fused, onnxruntime, torch; cuda: torch (decode/verify in CUDA graphs), tensorrt,
                 onnxruntime; always fp32: a reduced precision (engines.engine.LOSSY_PRECISIONS, int8 among them) is
                 never one
    exclusion    unavailable here (engines.engine.unavailable_reason), failed to open (build error), or not exact:
                 its greedy tokens differ from torch fp32 target-only greedy decoding on any probe observation
    measure      every probe observation decoded target-only and speculatively with the runtime's drafter and k
                 (FixedK), greedy acceptance, the candidates in turn per probe; the first DISCARD_CHUNKS are one-off
                 costs and dropped. A candidate's time is the better of the two decodes: the runtime's adaptive
                 planner (core/adaptive.py) turns speculation off where it does not pay, as it does on the fused
                 engine, whose verify pass of k + 1 tokens costs about k + 1 single-token passes
    choice       the exact candidate with the lowest median chunk time (STATISTIC; its p90 reported beside it); the
                 others are closed

The choice travels to the run report as integer counters of the runtime's Stats (choice_counters), decoded on the
other side by choice_from_counters: the report's "engine_choice" section (sim/report.py).

Cache: open_auto keeps each choice in engine_choice/ of the engine cache (engines/backends/cache.py:
$EDGEINFER_CACHE_DIR, default ~/.cache/edgeinfer/engines), keyed by the policy's weights (sha256), device, threads,
drafter, k, the candidates, this machine's CPU model and core count, and the versions of numba, torch, onnxruntime and
edgeinfer: a later start with the same key opens the chosen engine alone (no probes: ~0.1-1 s instead of seconds), and
says so ("cached" in the choice). A change of any of those measures again; EDGEINFER_ENGINE_CHOICE=measure always
measures (and keeps the new choice). Measurements on one machine take turns (measuring_alone: an flock in
engine_choice/), so runtimes that start at once on a cold machine compile and measure once, each on a quiet machine.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from edgeinfer.core.acceptance import Greedy
from edgeinfer.core.filelock import held, say_waiting
from edgeinfer.core.speculative import FixedK, speculative_decode
from edgeinfer.engines.backends.engine import unavailable_reason

# of the measured chunk times: the median. The tail of 16 probes is the start-up's noise (the other nodes start at the
# same time): at a large-policy main job's start packed measured p50 6.6 / p90 12.0 ms and onnxruntime 9.3 / 10.5 ms,
# and p90 chose onnxruntime, 2x slower in the run (bench: packed 4.96 ms against onnxruntime 16 ms)
STATISTIC = "p50"
DISCARD_CHUNKS = 2  # the first chunks of each candidate: allocation, lazy binding, caches
PROBE_OBSERVATIONS = 16  # decoded by every candidate: the exactness check and the timing
PREFIX = "engine_choice."  # of the Stats counters that carry the choice
MEASURE_LOCK_TIMEOUT_S = 300.0  # the longest a start waits for another process's measurement (a cold compile: ~60 s)
PROBE_K = 4  # drafts per pass measured (at most the planner's k_max): the k of `bench engines`' kinematic k = 4 rows


def candidates(device: str = "cpu") -> list[str]:
    """The backends auto measures on `device`, in order ("packed" and "fused" are CPU kernels)."""
    return ["torch", "tensorrt", "onnxruntime"] if device.startswith("cuda") else ["packed", "fused", "onnxruntime",
                                                                                     "torch"]


def probe_states(policy, n: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """n robot states (q_rad, qd_rad_s, q_prev_rad) (D,) float64: the policy's warm-up state, then states drawn
    around it (the built-in policy: its features' mean + std * N(0, 1), velocity and last increment moving
    together; otherwise 1 mrad of noise)."""
    q, qd, q_prev = (np.asarray(a, np.float64) for a in policy.warmup_state())
    d, rng = len(q), np.random.default_rng(seed)
    std = getattr(policy, "feat_std", None)
    scale = (std[:d], std[d:2 * d], std[2 * d:3 * d]) if std is not None else (1e-3, 1e-3, 1e-3)
    states = [(q, qd, q_prev)]
    for _ in range(n - 1):  # smooth motion: the last chunk step's increment drawn with the velocity (same z)
        zq, zv = rng.standard_normal(d), rng.standard_normal(d)
        q1 = q + scale[0] * zq
        states.append((q1, qd + scale[1] * zv, q1 - (q - q_prev + scale[2] * zv)))
    return states


def probe_observations(policy, n: int) -> tuple[list[tuple[np.ndarray, np.ndarray, np.ndarray]], str]:
    """n probe robot states and where they came from: real held-out windows of the policy's own recordings when
    they are on this machine (a policy trained on the Schunk runs, as the shipped ones: a learned drafter's
    acceptance on them is what a replay sees, 0.66 for the large policy's, against 0.22 on synthetic states), else
    probe_states (synthetic)."""
    if probe_source_kind(policy) == "real":
        from edgeinfer.engines.backends.calibration import sample_windows

        try:
            feats, _, source = sample_windows(policy, n, 0, require_real=True)
        except (FileNotFoundError, OSError, ValueError):
            pass
        else:
            d = policy.cfg.n_joints
            states = [(f[:d], f[d:2 * d], f[:d] - f[2 * d:3 * d]) for f in np.asarray(feats, np.float64)]
            return states, f"real held-out windows ({source})"
    return probe_states(policy, n), "synthetic states around the warm-up state"


def reference_tokens(policy, xs: np.ndarray, torch_engine) -> np.ndarray:
    """Torch fp32 target-only greedy tokens (N, n_tokens) of normalised observations xs (N, obs_dim): batched for
    the built-in policy (engines/training/evaluate.py), pass by pass on `torch_engine` (torch fp32) for any other."""
    from edgeinfer.engines.backends.quality import greedy_chunk
    from edgeinfer.engines.models.policy import Policy

    if isinstance(policy, Policy):
        import torch

        from edgeinfer.engines.training.evaluate import greedy_decode_batch

        return greedy_decode_batch(policy.model, torch.as_tensor(xs))
    return np.array([greedy_chunk(torch_engine, x, policy.cfg.n_tokens) for x in xs])


def measure(opened: dict, policy, states, xs, drafter, k: int, clock: Callable[[], int]) -> dict:
    """Every probe decoded by every opened engine, target-only (k = 0) and, with a drafter, speculatively (greedy,
    FixedK(k)), round-robin per probe so that a load that comes and goes weighs on all alike:
    {(name, k): (chunk times (N,) ns, tokens per probe)}."""
    ks = (0, k) if drafter is not None and k > 0 else (0,)
    out = {(name, kk): ([], []) for name in opened for kk in ks}
    for state, x in zip(states, xs):
        for (name, kk), (times, tokens) in out.items():
            if kk:
                drafter.reset(*state)
            t0 = clock()
            res = speculative_decode(opened[name], x, policy.cfg.n_tokens, drafter if kk else None, FixedK(kk),
                                     Greedy())
            times.append(clock() - t0)
            tokens.append(res.tokens)
    return {key: (np.array(times), tokens) for key, (times, tokens) in out.items()}


def choose_engine(policy, open_engine: Callable, device: str = "cpu", threads: int = 1, drafter=None, k: int = 4,
                  n_probes: int = PROBE_OBSERVATIONS, names: list[str] | None = None,
                  clock: Callable[[], int] | None = None,
                  available: Callable[[str, str], str | None] = unavailable_reason):
    """The fastest exact engine of `policy` on `device`, and why: (engine, choice dict).

    open_engine(policy, backend, precision, device, threads) opens an engine (engines/models/served.py open_engine);
    drafter: the runtime's drafter (None: target-only), k its drafts per pass; names: the candidates (default
    candidates(device)); clock: ns (default time.perf_counter_ns); available(backend, device): why one cannot
    run (None: it can;
    engines.engine.unavailable_reason). Tests inject the last three. The choice dict: statistic, probes, chosen,
    candidates {name: {chunk_ms_p50, chunk_ms_p90, k (the faster decode: 0 target-only), chunk_ms_p50_by_k,
    chunk_ms_p90_by_k, exact, mismatched_tokens, open_s}}, excluded {name: reason},
    start_up_s. Raises what opening torch fp32 (the reference) raises, and RuntimeError listing every candidate's
    reason when none is exact and available.
    """
    t_start, clock = time.perf_counter(), clock or time.perf_counter_ns
    names = names or candidates(device)
    states, probes_from = probe_observations(policy, n_probes + DISCARD_CHUNKS)
    xs = np.stack([policy.features(*s) for s in states]).astype(np.float32)
    opened, open_s, excluded = {}, {}, {}
    # torch first (the reference); packed, the slowest to compile, last: _measure may compile it aside meanwhile
    for name in ["torch", *[n for n in names if n not in ("torch", "packed")], *[n for n in names if n == "packed"]]:
        if (reason := available(name, device)) is not None:
            excluded[name] = f"unavailable: {reason}"
            continue
        t0 = time.perf_counter()
        try:
            opened[name] = open_engine(policy, name, "fp32", device, threads)
        except Exception as e:  # noqa: BLE001  (a backend that fails to build is a reason, not the end of start-up)
            if name == "torch":  # the reference: its error (a factory policy's failed load check) is the policy's
                raise
            excluded[name] = f"build error: {type(e).__name__}: {e}"
            continue
        open_s[name] = round(time.perf_counter() - t0, 3)
    if "torch" not in opened:
        raise RuntimeError(f"backend auto on {device}: torch fp32, the reference of exactness, is {excluded['torch']}")
    ref = reference_tokens(policy, xs, opened["torch"])
    engines, figures = {}, {}
    measured = measure(opened, policy, states, xs, drafter, k, clock)
    for name in opened:
        runs = {kk: v for (n, kk), v in measured.items() if n == name}
        mismatched = int(sum(np.sum(np.asarray(t) != r) for _, tokens in runs.values() for t, r in zip(tokens, ref)))
        p50, p90 = ({kk: float(np.percentile(times[DISCARD_CHUNKS:] / 1e6, q)) for kk, (times, _) in runs.items()}
                    for q in (50, 90))
        best_k = min(p50, key=p50.get)
        figures[name] = {"chunk_ms_p50": round(p50[best_k], 4), "chunk_ms_p90": round(p90[best_k], 4), "k": best_k,
                         "chunk_ms_p50_by_k": {str(kk): round(v, 4) for kk, v in p50.items()},
                         "chunk_ms_p90_by_k": {str(kk): round(v, 4) for kk, v in p90.items()},
                         "exact": mismatched == 0, "mismatched_tokens": mismatched, "open_s": open_s[name]}
        if mismatched:
            excluded[name] = f"not exact: {mismatched} of {ref.size * len(runs)} tokens differ from torch fp32 greedy"
        elif name in names:
            engines[name] = opened[name]
    if not engines:
        raise RuntimeError(f"backend auto: no exact engine available on {device}: {excluded}")
    chosen = min(engines, key=lambda n: figures[n]["chunk_ms_p50"])
    best = figures[chosen]["k"]
    others = ", ".join(f"{n} {figures[n]['chunk_ms_p50']:.3f} ms" for n in engines if n != chosen) or "none"
    choice = {
        "statistic": f"{STATISTIC} chunk time of {n_probes} probe chunks, the better of target-only"
                     f"{f' and speculative ({drafter.name}, k={k})' if drafter else ''}, after {DISCARD_CHUNKS} "
                     "discarded",
        "probes": n_probes + DISCARD_CHUNKS, "probes_from": probes_from, "chosen": chosen,
        "why": f"fastest exact: {STATISTIC} {figures[chosen]['chunk_ms_p50']:.3f} ms "
               f"({'target-only' if best == 0 else f'speculative, k={best}'}); "
               f"other exact: {others}",
        "candidates": {n: figures[n] for n in names if n in figures},
        "excluded": {n: excluded[n] for n in names if n in excluded},
        "start_up_s": round(time.perf_counter() - t_start, 3),
    }
    return engines[chosen], choice


# The choice as Stats counters (integers) and back: name -> 1 for the chosen, figures in us, excluded reasons by kind.
_KINDS = ("unavailable", "build error", "not exact")


def choice_counters(choice: dict) -> dict[str, int]:
    """The choice dict of choose_engine as integer counters under PREFIX (times in us)."""
    out = {f"{PREFIX}chosen.{choice['chosen']}": 1, f"{PREFIX}start_up_ms": round(choice["start_up_s"] * 1e3),
           f"{PREFIX}probes": choice["probes"], f"{PREFIX}cached": int(bool(choice.get("cached"))),
           f"{PREFIX}probes_real": int(str(choice.get("probes_from", "")).startswith("real"))}
    for name, f in choice["candidates"].items():
        out |= {f"{PREFIX}{name}.chunk_us_p50": round(f["chunk_ms_p50"] * 1e3),
                f"{PREFIX}{name}.chunk_us_p90": round(f["chunk_ms_p90"] * 1e3),
                f"{PREFIX}{name}.mismatched_tokens": f["mismatched_tokens"], f"{PREFIX}{name}.k": f["k"]}
    for name, reason in choice["excluded"].items():
        kind = next(k for k in _KINDS if reason.startswith(k))
        out[f"{PREFIX}excluded.{name}.{kind.replace(' ', '_')}"] = 1
    return out


def choice_from_counters(counters: dict[str, int]) -> dict | None:
    """The report's view of choice_counters (None when the runtime did not choose): chosen, start_up_ms, probes,
    candidates {name: {chunk_ms_p50, chunk_ms_p90, exact, mismatched_tokens, k (0: target-only was faster)}},
    excluded {name: kind}, cached (the choice came from the cache: no probes ran at this start), probes_from."""
    mine = {k[len(PREFIX):]: v for k, v in counters.items() if k.startswith(PREFIX)}
    chosen = [k.split(".", 1)[1] for k in mine if k.startswith("chosen.")]
    if not chosen:
        return None
    cands: dict[str, dict] = {}
    excluded = {}
    for key, value in mine.items():
        head, _, tail = key.rpartition(".")
        if key.startswith("excluded."):
            excluded[head.split(".", 1)[1]] = tail.replace("_", " ")
        elif head and not key.startswith("chosen."):
            cands.setdefault(head, {})[tail] = value
    return {"chosen": chosen[0], "statistic": STATISTIC, "start_up_ms": mine.get("start_up_ms"),
            "probes": mine.get("probes"), "cached": bool(mine.get("cached")),
            "probes_from": "real held-out windows" if mine.get("probes_real") else "synthetic states",
            "candidates": {n: {"chunk_ms_p50": f["chunk_us_p50"] / 1e3, "chunk_ms_p90": f["chunk_us_p90"] / 1e3,
                               "exact": f["mismatched_tokens"] == 0, "mismatched_tokens": f["mismatched_tokens"],
                               "k": f.get("k")}
                           for n, f in sorted(cands.items())},
            "excluded": dict(sorted(excluded.items()))}


def open_auto(policy, device: str = "cpu", threads: int = 1, drafter="kinematic", k: int = 4, cache: bool = True,
              **options):
    """choose_engine with the runtime's engine opener (engines/models/served.py open_engine); drafter: a Drafter, a
    drafter's name (engines/models/drafters.py) or None (target-only). With `cache`, a choice made before with the same
    key (module docstring) is reused: only its engine is opened. Returns (engine, choice dict; "cached": the cache
    file the choice came from, else None)."""
    from edgeinfer.engines.models.drafters import make_drafter
    from edgeinfer.engines.models.served import open_engine

    if isinstance(drafter, str):
        drafter = make_drafter(drafter, policy)
    names = options.get("names") or candidates(device)
    path = choice_cache_file(policy, device, threads, drafter, k, names) if cache else None
    remeasure = os.environ.get("EDGEINFER_ENGINE_CHOICE") == "measure"

    def cached_engine():
        cached = _read_choice(path) if not remeasure else None
        if cached is None or cached["chosen"] not in names or unavailable_reason(cached["chosen"], device) is not None:
            return None
        t0 = time.perf_counter()
        engine = open_engine(policy, cached["chosen"], "fp32", device, threads)
        return engine, {**cached, "cached": str(path), "start_up_s": round(time.perf_counter() - t0, 3),
                        "why": f"{cached.get('why', '')} (measured at an earlier start, cached in {path})"}

    if (found := cached_engine()) is not None:
        return found
    with measuring_alone(path):  # a runtime that started beside this one may have measured meanwhile
        if (found := cached_engine()) is not None:
            return found
        return _measure(policy, open_engine, device, threads, drafter, k, path, names, options)


def _measure(policy, open_engine, device, threads, drafter, k, path: Path | None, names: list[str], options: dict):
    """choose_engine over `names`, its choice kept in `path` (None: not kept). The packed kernels compile aside
    meanwhile (_compile_packed_aside)."""
    aside = _compile_packed_aside(threads) if "packed" in names and unavailable_reason("packed", device) is None \
        else None

    def open_after_aside(policy, name, *args):  # packed opens last: once the process compiling it is gone
        if name == "packed" and aside is not None:
            aside.wait()
        return open_engine(policy, name, *args)

    try:
        engine, choice = choose_engine(policy, open_after_aside, device, threads, drafter, k,
                                       **{**options, "names": names})
    finally:
        if aside is not None:
            aside.wait()
    if path is not None:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:  # written whole, then renamed: a reader never sees half a file
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(choice, indent=1))
            tmp.replace(path)
        except OSError:  # a read-only home, a folder in the file's place: every start measures, as before
            tmp.unlink(missing_ok=True)
    return engine, {**choice, "cached": None}


def measuring_alone(path: Path | None, timeout_s: float = MEASURE_LOCK_TIMEOUT_S):
    """A context holding the machine's engine-choice lock (core.filelock on engine_choice/.measuring.lock beside
    `path`): runtimes that start at once on a cold machine (a fleet, a launch file, a test suite) measure one after
    another, each on an otherwise quiet machine, and all but the first usually find the numba kernels compiled and
    their choice cached. Without a cache (path None), or after timeout_s of waiting, the block runs unlocked."""
    if path is None:
        return contextlib.nullcontext()
    lock = path.parent / ".measuring.lock"
    return held(lock, timeout_s, say_waiting("engine choice", "measuring this machine's engines",
                                             "its choice is then opened if it fits", lock, timeout_s))


# the packed engine of the shipped policy (kernels specialise on types, not shapes: any policy's compile serves all)
_PACKED_ASIDE = ("import os, sys\n"
                 "try:\n"  # any CPU this machine lets it have: a runtime pinned to one would compile on that one
                 "    os.sched_setaffinity(0, range(os.cpu_count()))\n"
                 "except OSError:\n"
                 "    pass\n"
                 "from edgeinfer.engines.backends.packed_engine import PackedEngine\n"
                 "from edgeinfer.engines.models.policy import load_policy\n"
                 "PackedEngine.from_policy(load_policy(), threads=int(sys.argv[1])).close()\n"
                 "os._exit(0)\n")


def _compile_packed_aside(threads: int) -> subprocess.Popen | None:
    """A process that compiles the packed kernels (or loads them from numba's cache) holding their compile lock
    (kernel_cache.kernels_ready), started before choose_engine opens its candidates, packed last: on a cold machine
    the slowest compile (~23 s on the 2-core EPYC VM) runs beside this process's fused kernels and ONNX export, and
    packed's open then loads what it wrote. Its output goes to this process's stderr. None when numba's cache already
    holds them (nothing to compile: no process to wait for) or it cannot start."""
    if _packed_cached():
        return None
    try:
        return subprocess.Popen([sys.executable, "-c", _PACKED_ASIDE, str(min(max(threads, 1), 2))],
                                stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno())
    except (OSError, ValueError):  # no fileno (a captured stderr), no interpreter: packed compiles here
        return None


def _packed_cached() -> bool:
    """Whether numba's on-disk cache holds the packed engine's chunk kernel (kernel_cache.kernels_cached)."""
    from edgeinfer.engines.backends import packed_engine
    from edgeinfer.engines.backends.kernel_cache import kernels_cached

    return kernels_cached(packed_engine._greedy)


def choice_cache_file(policy, device: str, threads: int, drafter, k: int, names: list[str]) -> Path | None:
    """The cache file of a choice (module docstring), or None when the policy has no weights hash."""
    from edgeinfer.engines.backends.cache import default_root

    sha = (getattr(policy, "manifest", None) or {}).get("sha256")
    if not sha:
        return None
    cpu = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")), "unknown")
    versions = {}
    for dist in ("numba", "torch", "onnxruntime", "edgeinfer"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    engines = Path(__file__).resolve().parents[1]  # this code's own version: a change of any engine measures again
    code = hashlib.sha256(b"".join(f.read_bytes() for f in sorted(engines.rglob("*.py")))).hexdigest()
    key = {"policy": sha, "device": device, "threads": threads, "drafter": getattr(drafter, "name", None), "k": k,
           "candidates": list(names), "cpu": cpu, "cores": os.cpu_count(), "versions": versions, "code": code,
           "real_probes": _real_probes_here(policy)}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return default_root() / "engine_choice" / f"{digest}.json"


def _real_probes_here(policy) -> bool:
    """Whether probe_observations would find real held-out windows (cheap: a folder check, no reading): a choice
    measured on synthetic states is not reused once the recordings are here."""
    from edgeinfer.engines.backends.calibration import resolve_data_dir

    try:
        return probe_source_kind(policy) == "real" and (resolve_data_dir() / "measurement_1").is_dir()
    except Exception:  # noqa: BLE001
        return False


def probe_source_kind(policy) -> str:
    """"real" for a policy whose probes may come from the Schunk runs (probe_observations), else "synthetic"."""
    from edgeinfer.engines.models.policy import Policy

    data = (getattr(policy, "manifest", None) or {}).get("data") or {"format": "schunk"}  # shipped: no "data"
    ok = isinstance(policy, Policy) and data.get("format") == "schunk" and policy.cfg.n_joints == 6
    return "real" if ok else "synthetic"


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def _read_choice(path: Path | None) -> dict | None:
    """A cached choice dict, or None (measured again) for no file or anything but a whole choice: the chosen engine
    among its exact candidates, every figure the report reads, and counters that decode."""
    if path is None or not path.is_file():
        return None
    try:
        choice = json.loads(path.read_text())
        chosen = choice["chosen"]
        if not choice["candidates"][chosen]["exact"] or not isinstance(choice["why"], str):
            return None
        choice_from_counters(choice_counters(choice))  # raises on a figure of the wrong type or an unknown reason
        return choice
    except Exception:  # noqa: BLE001  (a damaged cache file is measured over, whatever is wrong with it)
        return None
