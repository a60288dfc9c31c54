"""edgeinfer's speculative decoding side by side with Hugging Face transformers' assisted generation.

    python -m edgeinfer.engines.peers.hf_peer [--prompts 8] [--max-new-tokens 48] [--repeats 5] [--json out.json]

One target/draft pair, the same weights in both implementations (engines/models/llama.py loads and exports
LlamaForCausalLM weights), the same prompts, greedy, the same max_new_tokens, CPU, 1 torch thread, one run:
    transformers assisted        target.generate(ids, assistant_model=draft, do_sample=False, ...), the
                                 assistant settings as the installed transformers defaults them (recorded)
    transformers assisted, k     the same with a constant k = edgeinfer's best k, confidence threshold off
    transformers target-only     target.generate(ids, do_sample=False, ...)
    edgeinfer speculative, k     speculative_decode over the llama adapter (engines/models/model_protocol.py) with
                                 the draft as an EngineDrafter, the best fixed k of ks on these prompts
    edgeinfer target-only        the same with no drafter
Timing: time.perf_counter over all prompts of a method, warm-up run excluded, methods interleaved within
each repeat (a machine that slows down mid-run slows every method alike), median of repeats.

The pair: a random llama target (4 layers, d 128, 4 heads, 2 KV heads, vocab 64) whose layers after the
first have their residual output projections (wo, w_down) scaled by `refine_scale`, so that later layers
refine the first layer's prediction (as in trained LLMs, where early exits are informative), and the
draft = the target's first layer with its embeddings, final norm and head (early exit, engines/models/llama.py).
Plain N(0, 0.02) random weights instead decode a constant token after a few steps. This pair's greedy
continuations hold about 25 distinct tokens per 48; with refine_scale 0.05 the early exit's drafts are
accepted at 0.7-0.8 (k 4-6), with 0.1 at about 0.6 (k 3): the range of published draft/target pairs.
Edgeinfer's prefill is a pass of its own (token 0, no drafts), so its passes per sequence run about one
above transformers', whose first verify pass also reads the prompt.

HfDecoder also runs any transformers causal LM through the protocol (cache kind "append"): the test of
the adapter's append path.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import json
import statistics
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from edgeinfer.core.scheduler import SchedulerConfig, TickPlanner
from edgeinfer.core.speculative import speculative_decode
from edgeinfer.engines.models.llama import Llama, LlamaConfig, early_exit
from edgeinfer.engines.models.model_protocol import EngineDrafter, TorchModuleEngine

_ASSISTANT_SETTINGS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
PEER_TARGET = LlamaConfig(vocab_size=64, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=344, max_seq_len=128)


class HfDecoder(nn.Module):
    """A transformers causal LM (batch 1) as a protocol module: prefix kind "tokens", cache kind "append"
    (a DynamicCache, cropped on rollback)."""

    prefix_kind = "tokens"
    cache_kind = "append"

    def __init__(self, hf_model):
        super().__init__()
        self.hf = hf_model.eval()
        # transformers 5 names the argument `cache`; 4.x `past_key_values`
        self._cache_arg = "cache" if "cache" in inspect.signature(hf_model.forward).parameters else "past_key_values"

    def empty_cache(self, batch: int = 1, dtype=None, device=None) -> tuple:
        from transformers import DynamicCache

        try:
            return (DynamicCache(config=self.hf.config),)
        except TypeError:  # transformers < 4.56 takes no config
            return (DynamicCache(),)

    def step(self, prefix, tokens, input_pos, cache):
        out = self.hf(input_ids=tokens, position_ids=input_pos[None], use_cache=True, **{self._cache_arg: cache})
        return out.logits, cache  # the DynamicCache grew in place

    def truncate_cache(self, cache: tuple, n: int) -> tuple:
        remove = cache[0].get_seq_length() - n
        if remove > 0:
            cache[0].crop(-remove)  # a negative argument removes that many tokens, in 4.x and 5.x
        return cache


def peer_pair(seed: int = 0, cfg: LlamaConfig = PEER_TARGET, refine_scale: float = 0.05,
              std: float = 0.1) -> tuple[Llama, Llama]:
    """(target, draft): see the module docstring. Weights N(0, std), embeddings N(0, 0.02), norms 1."""
    torch.manual_seed(seed)
    target = Llama(cfg)
    with torch.no_grad():
        for name, p in target.named_parameters():
            if name.endswith("norm.weight"):
                continue
            p.normal_(0, 0.02 if name == "tok_emb.weight" else std)
            if name.startswith("layers.") and int(name.split(".")[1]) >= 1 and (".wo." in name or ".w_down." in name):
                p.mul_(refine_scale)
    target.eval()
    return target, early_exit(target, 1)


class _Count:
    """Forward calls of a module, counted by a forward hook."""

    def __init__(self, module: nn.Module):
        self.n = 0
        module.register_forward_hook(self._hook)

    def _hook(self, *args) -> None:
        self.n += 1


def compare_with_hf_assisted(n_prompts: int = 8, max_new_tokens: int = 48, seed: int = 0, prompt_len: int = 16,
                             repeats: int = 5, ks: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8),
                             refine_scale: float = 0.05) -> dict:
    """Decode the same prompts with each method (module docstring) and time them.

    Returns {"rows": [...], "settings": {...}}; each row: name, tokens_per_s (generated tokens / median
    seconds), seconds_median, target_passes_per_chunk (target forward passes per sequence; edgeinfer's
    include its prefill), acceptance_rate (accepted / drafted; transformers': (new tokens - target passes)
    / assistant forward passes, as each target pass commits its accepted drafts + 1), k, exact (every
    sequence token-identical to transformers' target-only greedy). Raises ImportError without transformers.
    """
    import transformers

    threads = torch.get_num_threads()
    verbosity = transformers.logging.get_verbosity()
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    try:
        return _compare(n_prompts, max_new_tokens, seed, prompt_len, repeats, ks, refine_scale)
    finally:
        torch.set_num_threads(threads)
        transformers.logging.set_verbosity(verbosity)


def _hf_run(hf_target, hf_draft, prompts: list, n_new: int, assistant: dict | None) -> Callable[[], list[list[int]]]:
    """transformers' generate over every prompt. assistant: None (target-only), or the assistant's generation
    settings ({} = the defaults). They live in the draft's generation_config, where assisted generation reads
    (and adapts) them."""
    def run():
        kwargs = {}
        if assistant is not None:
            for name in _ASSISTANT_SETTINGS:
                setattr(hf_draft.generation_config, name, assistant.get(name))
            kwargs["assistant_model"] = hf_draft
        out = []
        for p in prompts:
            ids = torch.as_tensor(p, dtype=torch.long)[None]
            with torch.inference_mode():
                seq = hf_target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                         max_new_tokens=n_new, **kwargs)
            out.append(seq[0, len(p):].tolist())
        return out
    return run


def _ei_run(engine, drafter, prompts: list, n_new: int, k: int, stats: dict) -> Callable[[], list[list[int]]]:
    """edgeinfer's speculative_decode over every prompt with a fixed k (0: target-only); stats[k] = (target
    passes, drafted, accepted) of the last run."""
    def run():
        out, passes, drafted, accepted = [], 0, 0, 0
        for p in prompts:
            planner = TickPlanner(SchedulerConfig(k_max=k))
            planner.unlimited()
            if k:
                drafter.start(p)
            res = speculative_decode(engine, p, n_new, drafter if k else None, planner)
            out.append(res.tokens)
            passes, drafted, accepted = passes + res.target_passes, drafted + res.drafted, accepted + res.accepted
        stats[k] = (passes, drafted, accepted)
        return out
    return run


def _compare(n_prompts, max_new_tokens, seed, prompt_len, repeats, ks, refine_scale) -> dict:
    cfg = dataclasses.replace(PEER_TARGET, max_seq_len=prompt_len + max_new_tokens + 16)
    target, draft = peer_pair(seed, cfg, refine_scale)
    hf_target, hf_draft = target.to_hf(), draft.to_hf()
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, target.cfg.vocab_size, prompt_len) for _ in range(n_prompts)]
    n_new = max_new_tokens
    hf_calls, hf_draft_calls = _Count(hf_target), _Count(hf_draft)
    engine, drafter = TorchModuleEngine(target), EngineDrafter(TorchModuleEngine(draft))
    assistant_defaults = _assistant_defaults(hf_draft)
    hf_run = functools.partial(_hf_run, hf_target, hf_draft, prompts, n_new)  # (assistant settings)
    stats: dict = {}  # k -> (target passes, drafted, accepted) of edgeinfer's last run with that k
    ei_run = functools.partial(_ei_run, engine, drafter, prompts, n_new, stats=stats)  # (k)

    # edgeinfer's k: the fastest of ks on these prompts, median of `repeats` interleaved runs after a warm-up
    ei_run(ks[0])()
    k_times: dict[int, list[float]] = {k: [] for k in ks}
    for _ in range(repeats):
        for k in ks:
            k_times[k].append(_seconds(ei_run(k)))
    k_best = min(ks, key=lambda k: statistics.median(k_times[k]))
    methods = {
        "transformers assisted (default settings)": (hf_run({}), None),
        f"transformers assisted (constant k={k_best})": (hf_run({
            "num_assistant_tokens": k_best, "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0}), k_best),
        "transformers target-only": (hf_run(None), 0),
        f"edgeinfer speculative (k={k_best})": (ei_run(k_best), k_best),
        "edgeinfer target-only": (ei_run(0), 0),
    }
    outputs, counts, times = {}, {}, {name: [] for name in methods}
    for name, (run, _) in methods.items():  # warm-up, and the outputs and pass counts (deterministic)
        hf_calls.n = hf_draft_calls.n = 0
        outputs[name] = run()
        counts[name] = (hf_calls.n, hf_draft_calls.n)
    for _ in range(repeats):
        for name, (run, _) in methods.items():
            times[name].append(_seconds(run))
    reference = outputs["transformers target-only"]
    rows = []
    for name, (_, k) in methods.items():
        seconds = statistics.median(times[name])
        if name.startswith("edgeinfer"):
            passes, drafted, accepted = stats[k]
        else:
            passes, drafted = counts[name]
            accepted = n_prompts * n_new - passes
        rows.append({"name": name, "tokens_per_s": n_prompts * n_new / seconds, "seconds_median": seconds,
                     "target_passes_per_chunk": passes / n_prompts,
                     "acceptance_rate": accepted / drafted if drafted else None, "k": k,
                     "exact": outputs[name] == reference})
    return {"rows": rows, "settings": {
        "n_prompts": n_prompts, "prompt_len": prompt_len, "max_new_tokens": n_new, "seed": seed,
        "repeats": repeats, "torch_threads": 1, "refine_scale": refine_scale, "ks_searched": list(ks),
        "edgeinfer_k": k_best,
        "edgeinfer_tokens_per_s_by_k": {k: n_prompts * n_new / statistics.median(t) for k, t in k_times.items()},
        "transformers_assistant_defaults": assistant_defaults, "transformers": _version("transformers"),
        "torch": torch.__version__, "target": target.cfg.to_dict(), "draft_layers": draft.cfg.n_layers,
        "all_exact": all(r["exact"] for r in rows)}}


def _assistant_defaults(hf_draft) -> dict:
    """The assistant settings assisted generation starts from when none are set (transformers fills its
    global defaults into a copy of the draft's generation_config; read the same way here)."""
    config = copy.deepcopy(hf_draft.generation_config)
    defaults = getattr(config, "_get_default_generation_params", None)  # private in transformers 5; absent in 4.x
    if defaults is not None:
        config.update(**defaults(), defaults_only=True)
    return {name: getattr(config, name, None) for name in _ASSISTANT_SETTINGS}


def _seconds(run: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def _version(dist: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def format_table(result: dict) -> str:
    lines = [f"{'method':44s} {'tokens/s':>9s} {'passes/seq':>10s} {'accept':>7s} {'exact':>6s}"]
    for r in result["rows"]:
        acc = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.2f}"
        lines.append(f"{r['name']:44s} {r['tokens_per_s']:9.0f} {r['target_passes_per_chunk']:10.1f} {acc:>7s} "
                     f"{str(r['exact']):>6s}")
    return "\n".join(lines)


@dataclasses.dataclass
class HfPeerConfig:
    """`python -m edgeinfer.engines.peers.hf_peer`: the prompts decoded and how often each method is timed."""

    prompts: int = 8  # number of prompts
    max_new_tokens: int = 48  # tokens generated per prompt
    repeats: int = 5  # timed runs per method (the median is reported)
    seed: int = 0  # seed of the random target/draft pair and of the prompts
    json: Path | None = None  # write the result here

    def __post_init__(self):
        if min(self.prompts, self.max_new_tokens, self.repeats) < 1:
            raise ValueError(f"HfPeerConfig.prompts, max_new_tokens and repeats must be >= 1, got {self}")


def main(argv: list[str] | None = None) -> None:
    from edgeinfer.core.config import parse

    cfg = parse(HfPeerConfig, argv, prog="python -m edgeinfer.engines.peers.hf_peer",
                description=__doc__.splitlines()[0])
    result = compare_with_hf_assisted(cfg.prompts, cfg.max_new_tokens, cfg.seed, repeats=cfg.repeats)
    print(format_table(result))
    print(json.dumps(result["settings"], indent=1))
    if cfg.json:
        with open(cfg.json, "w") as fh:
            json.dump(result, fh, indent=1)

if __name__ == "__main__":
    main()
