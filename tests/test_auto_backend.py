"""`backend="auto"` (engines/backends/auto.py): the fastest exact engine by measured chunk time, every exclusion with
its reason, the mode/precision rules of RuntimeConfig, and the choice in a real replay's report."""
import json
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from edgeinfer.engines.backends.auto import choice_counters, choice_from_counters, choose_engine
from edgeinfer.engines.backends.torch_engine import TorchEngine
from edgeinfer.engines.models.drafters import make_drafter
from edgeinfer.node.runtime import RuntimeConfig


class FakeClock:
    def __init__(self):
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


class CostlyEngine:
    """The torch fp32 target, each pass advancing the fake clock by cost_ns; perturbed: one bin's logit raised at
    position 7, so that greedy decoding differs there (a deliberately inexact engine)."""

    def __init__(self, policy, clock: FakeClock, cost_ns: int, perturbed: bool = False):
        self.inner, self.clock, self.cost_ns, self.perturbed = TorchEngine(policy.model), clock, cost_ns, perturbed

    def forward(self, obs, tokens, start):
        self.clock.ns += self.cost_ns
        logits = self.inner.forward(obs, tokens, start)
        if self.perturbed:
            row = 7 - start
            if 0 <= row < len(logits):
                logits[row, (int(logits[row].argmax()) + 1) % logits.shape[1]] += 100.0
        return logits

    def rollback(self, n):
        self.inner.rollback(n)


COST_US = {"torch": 190, "slow": 120, "fast": 40, "perturbed": 5}  # per pass


@pytest.fixture(scope="module")
def choice(policy, one_torch_thread):
    clock = FakeClock()

    def open_engine(policy, backend, precision, device, threads):
        assert precision == "fp32"  # never a lossy candidate
        if backend == "broken":
            raise RuntimeError("plan export failed")
        return CostlyEngine(policy, clock, COST_US[backend] * 1000, perturbed=backend == "perturbed")

    def available(backend, device):
        return "gone is not installed" if backend == "gone" else None

    engine, choice = choose_engine(policy, open_engine, drafter=make_drafter("kinematic", policy), k=4, n_probes=6,
                                   names=["slow", "fast", "perturbed", "broken", "gone", "torch"], clock=clock,
                                   available=available)
    return engine, choice


def test_auto_picks_the_fastest_exact_engine_by_measured_chunk_time(choice):
    engine, c = choice
    assert c["chosen"] == "fast" and engine.cost_ns == 40_000
    cands = c["candidates"]
    assert set(cands) == {"slow", "fast", "perturbed", "torch"}
    assert all(cands[n]["exact"] and cands[n]["mismatched_tokens"] == 0 for n in ("slow", "fast", "torch"))
    # on the fake clock a chunk costs passes * cost: the order of the figures is the order of the costs
    assert cands["perturbed"]["chunk_ms_p90"] < cands["fast"]["chunk_ms_p90"] < cands["slow"]["chunk_ms_p90"] \
        < cands["torch"]["chunk_ms_p90"]
    assert cands["fast"]["chunk_ms_p90"] >= 0.04 * 12  # at least a 48-token chunk's passes at k=4
    assert c["probes"] == 8 and c["statistic"].startswith("p50") and "kinematic, k=4" in c["statistic"]
    assert "fast" in c["why"] and "slow" in c["why"]
    # a pass costs the same whatever its length here, so speculation pays for every candidate
    assert all(cands[n]["k"] == 4 for n in ("slow", "fast", "torch")) and "speculative, k=4" in c["why"]


def test_auto_ranks_an_engine_by_target_only_where_speculation_does_not_pay(policy, one_torch_thread):
    """An engine whose pass costs grow with the tokens verified (compute-bound, like the fused kernel) is faster
    target-only; auto ranks it by that decode, which the adaptive planner converges to, and says so."""
    clock = FakeClock()

    class ComputeBound(CostlyEngine):
        def forward(self, obs, tokens, start):
            self.clock.ns += self.cost_ns * max(len(tokens), 1)  # one cost per position (k drafts + 1)
            return self.inner.forward(obs, tokens, start)

    def open_engine(policy, backend, precision, device, threads):
        cls = ComputeBound if backend == "compute" else CostlyEngine
        return cls(policy, clock, {"compute": 30_000, "torch": 190_000}[backend])

    engine, c = choose_engine(policy, open_engine, drafter=make_drafter("kinematic", policy), k=4, n_probes=4,
                              names=["compute", "torch"], clock=clock, available=lambda b, d: None)
    compute = c["candidates"]["compute"]
    assert c["chosen"] == "compute" and compute["k"] == 0
    assert compute["chunk_ms_p90_by_k"]["0"] < compute["chunk_ms_p90_by_k"]["4"]
    assert compute["chunk_ms_p90"] == pytest.approx(0.03 * 48, rel=1e-3)  # 48 passes of one position
    assert "target-only" in c["why"]


def test_auto_excludes_inexact_broken_and_unavailable_engines_with_the_reason(choice):
    _, c = choice
    ex = c["excluded"]
    assert set(ex) == {"perturbed", "broken", "gone"}
    n_tokens = 8 * 48 * 2  # 8 probes, target-only and k=4
    assert ex["perturbed"].startswith("not exact: ") and f"of {n_tokens} tokens" in ex["perturbed"]
    assert 1 <= c["candidates"]["perturbed"]["mismatched_tokens"] <= n_tokens
    assert ex["broken"] == "build error: RuntimeError: plan export failed"
    assert ex["gone"] == "unavailable: gone is not installed"


def test_the_choice_survives_the_trip_through_stats_counters(choice):
    _, c = choice
    counters = choice_counters(c)
    assert all(isinstance(v, int) for v in counters.values())
    back = choice_from_counters({"observations": 5, **counters})
    assert back["chosen"] == "fast" and back["probes"] == 8
    assert back["excluded"] == {"broken": "build error", "gone": "unavailable", "perturbed": "not exact"}
    for name, f in c["candidates"].items():
        assert back["candidates"][name]["exact"] == f["exact"]
        assert back["candidates"][name]["chunk_ms_p90"] == pytest.approx(f["chunk_ms_p90"], abs=1e-3)
    assert choice_from_counters({"observations": 5}) is None


@pytest.mark.parametrize("fields, named", [
    ({"mode": "ultrafast", "precision": "int8"}, "precision"),
    ({"mode": "ultrafast", "acceptance": "relaxed"}, "acceptance"),
    ({"mode": "ultrafast", "backend": "onnxruntime"}, "backend"),
    ({"mode": "ultrafast", "decode": "target-only"}, "decode"),
    ({"backend": "auto", "precision": "int8"}, "precision"),
])
def test_lossy_or_conflicting_fields_are_refused_naming_them(fields, named):
    with pytest.raises(ValueError, match=named):
        RuntimeConfig(**fields)


def test_ultrafast_sets_the_exact_preset():
    cfg = RuntimeConfig(mode="ultrafast")
    assert (cfg.backend, cfg.precision, cfg.decode, cfg.drafter, cfg.acceptance) == (
        "auto", "fp32", "speculative", "kinematic", "greedy")
    assert RuntimeConfig(mode="standard", backend="onnxruntime").backend == "onnxruntime"


def test_the_choice_reaches_a_real_replays_report(tmp_path):
    from edgeinfer.sim.replay import replay
    from edgeinfer.sim.run_config import ReplayConfig

    report = replay(ReplayConfig(out=tmp_path, duration_s=1.0, plots=False, runtime=RuntimeConfig(mode="ultrafast")),
                    Console(quiet=True))
    c = report["engine_choice"]
    assert c is not None and c["candidates"][c["chosen"]]["exact"]
    assert c["chosen"] in ("packed", "fused", "onnxruntime", "torch") and "torch" in c["candidates"]
    assert report["engine"].startswith(f"{c['chosen']} (auto)")
    assert c["start_up_ms"] > 0 and c["probes"] > 0
    assert np.isfinite(c["candidates"][c["chosen"]]["chunk_ms_p90"])


def test_the_choice_is_cached_per_policy_and_machine_and_reused_without_probes(policy, tmp_path, monkeypatch):
    """open_auto keeps its choice under EDGEINFER_CACHE_DIR: the next start with the same key opens the chosen engine
    alone (choose_engine is not called), a different key (threads) measures again, a corrupt file is measured over,
    and EDGEINFER_ENGINE_CHOICE=measure measures whatever the cache holds."""
    from edgeinfer.engines.backends import auto

    monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(tmp_path))
    names = ["fused", "torch"]
    engine, first = auto.open_auto(policy, "cpu", 1, "kinematic", 4, n_probes=3, names=names)
    files = list((tmp_path / "engine_choice").glob("*.json"))
    assert first["cached"] is None and len(files) == 1
    measured = auto.choose_engine
    monkeypatch.setattr(auto, "choose_engine", lambda *a, **k: pytest.fail("measured again despite the cache"))
    engine, again = auto.open_auto(policy, "cpu", 1, "kinematic", 4, n_probes=3, names=names)
    assert again["cached"] == str(files[0]) and again["chosen"] == first["chosen"] == engine.backend
    assert again["candidates"] == first["candidates"] and again["probes"] == first["probes"]
    counters = auto.choice_counters(again)
    assert auto.choice_from_counters(counters)["cached"] is True
    real = first["probes_from"].startswith("real held-out windows")  # where the Schunk runs are on this machine
    assert real == (Path(__file__).resolve().parents[2] / "shared/data/schunk_lwa4p/measurement_1").is_dir()
    want = "real held-out windows" if real else "synthetic states"
    assert auto.choice_from_counters(counters)["probes_from"] == want
    monkeypatch.setattr(auto, "choose_engine", measured)
    _, other = auto.open_auto(policy, "cpu", 2, "kinematic", 4, n_probes=3, names=names)  # another key
    assert other["cached"] is None and len(list((tmp_path / "engine_choice").glob("*.json"))) == 2
    files[0].write_text("{not json")
    _, remeasured = auto.open_auto(policy, "cpu", 1, "kinematic", 4, n_probes=3, names=names)
    assert remeasured["cached"] is None and json.loads(files[0].read_text())["chosen"] == remeasured["chosen"]
    monkeypatch.setenv("EDGEINFER_ENGINE_CHOICE", "measure")
    _, forced = auto.open_auto(policy, "cpu", 1, "kinematic", 4, n_probes=3, names=names)
    assert forced["cached"] is None


def test_runtimes_starting_at_once_on_a_cold_cache_measure_one_after_the_other_and_once(tmp_path):
    """Three processes open `auto` at once on an empty EDGEINFER_CACHE_DIR: the engine-choice lock lets one measure,
    and the others, once it is done, open its cached choice: one measurement, not three side by side (which would
    also time each candidate on a machine the others load). A process that holds the lock and dies releases it."""
    import subprocess
    import sys

    script = ("import json, sys\n"
              "from edgeinfer.engines.backends import auto\n"
              "from edgeinfer.engines.models.policy import load_policy\n"
              "_, c = auto.open_auto(load_policy(), 'cpu', 1, 'kinematic', 4, n_probes=3, names=['fused', 'torch'])\n"
              "print(json.dumps({'cached': c['cached'], 'chosen': c['chosen']}))\n")
    env = {**__import__("os").environ, "EDGEINFER_CACHE_DIR": str(tmp_path)}
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; (tmp_path := sys.argv[1]); "
                               "os.makedirs(tmp_path + '/engine_choice', exist_ok=True); "
                               "fd = os.open(tmp_path + '/engine_choice/.measuring.lock', os.O_RDWR | os.O_CREAT); "
                               "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(2); "
                               "os._exit(9)", str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "locked\n"  # a runtime that dies while it measures
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert holder.wait(timeout=30) == 9
    assert sum(o["cached"] is None for o in outs) == 1  # one measured, two opened its choice
    assert len({o["chosen"] for o in outs}) == 1 and len(list((tmp_path / "engine_choice").glob("*.json"))) == 1


@pytest.mark.parametrize("damage", [
    {"chosen": "packed"},  # nothing else: the report reads probes, candidates, excluded
    {"candidates": "x"},
    {"excluded": {"onnxruntime": "weird reason"}},
    {"chosen": "nope"},
    {"chosen": "torch", "candidates": {"torch": {"exact": False}}},
])
def test_a_damaged_cache_file_is_measured_over(policy, tmp_path, monkeypatch, damage):
    """Whatever a cache file holds that is not a whole choice, the start measures again (the breaker's start-ups
    that failed every time on {"chosen": "packed"} and tracebacks on bad types)."""
    from edgeinfer.engines.backends import auto

    monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(tmp_path))
    names = ["fused", "torch"]
    _, good = auto.open_auto(policy, "cpu", 1, "kinematic", 4, n_probes=3, names=names)
    path = next((tmp_path / "engine_choice").glob("*.json"))
    path.write_text(json.dumps({**good, **damage} if "chosen" not in damage or len(damage) > 1 else damage))
    engine, again = auto.open_auto(policy, "cpu", 1, "kinematic", 4, n_probes=3, names=names)
    assert again["cached"] is None and again["chosen"] in names
    auto.choice_from_counters(auto.choice_counters(again))  # the report can read it
    assert json.loads(path.read_text())["chosen"] == again["chosen"]  # and the file is whole again


def test_a_cold_measurement_compiles_packed_aside_and_opens_it_last_once_that_process_is_gone(policy, monkeypatch,
                                                                                              tmp_path):
    """_measure: packed's kernels (the slowest compile) compile in a process of their own while the other candidates
    open; packed opens last, after that process exited. With numba's cache warm there is no such process."""
    from edgeinfer.engines.backends import auto

    started, opened = [], []
    real_aside = auto._compile_packed_aside

    def aside(threads):
        proc = real_aside(threads)
        started.append(proc)
        return proc

    def open_engine(policy, backend, precision, device, threads):
        opened.append((backend, None if not started or started[0] is None else started[0].poll()))
        return CostlyEngine(policy, FakeClock(), COST_US["torch"] * 1000)

    monkeypatch.setattr(auto, "_packed_cached", lambda: False)  # as on a cold machine
    monkeypatch.setattr(auto, "_compile_packed_aside", aside)
    auto._measure(policy, open_engine, "cpu", 1, None, 0, None, auto.candidates("cpu"), {"n_probes": 3})
    assert [b for b, _ in opened] == ["torch", "fused", "onnxruntime", "packed"]
    assert opened[-1][1] == 0  # the aside process had compiled (or loaded) packed and exited before packed opened
    monkeypatch.setattr(auto, "_packed_cached", lambda: True)
    assert real_aside(1) is None  # cached: nothing to compile aside
