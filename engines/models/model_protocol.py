"""Bring your own model: what a torch module provides so that edgeinfer runs it as a target or a draft.

A conforming module decodes batch-1 sequences over positions 0 .. max_len-1 with a KV cache:

    module.empty_cache(batch, dtype, device) -> cache         a tuple (tensors, or objects the module reads)
    module.step(prefix, tokens, input_pos, *cache) -> logits                  cache kind "static"
                                                   -> (logits, *new_cache)    cache kinds "functional", "append"
        tokens     (B, T) int64   token ids at positions input_pos
        input_pos  (T,) int64     ascending and contiguous: a pass never leaves a gap after the cached positions
        prefix     prefix kind "obs": the observation (B, obs_dim) float32, embedded wherever input_pos == 0
                   (the token id there is ignored); prefix kind "tokens": None
        logits     (B, T, V) any float dtype; row i predicts the token after position input_pos[i]
    module.truncate_cache(cache, n) -> cache                  cache kind "append" only: keep positions < n

Prefix kinds: what position 0 holds, and how Engine positions map to module positions.
    "obs"     edgeinfer's policy (engines/models/model.py): position 0 embeds the observation, action token i sits
              at position 1 + i, so engine and module positions are the same.
    "tokens"  LLM-style: a prompt of P >= 1 token ids fills module positions 0..P-1 and generated token i
              sits at P + i. The prompt plays the observation's role: Engine.forward(prompt, tokens, 0)
              is the prefill, with prompt (P,) int; engine position e >= 1 is module position P - 1 + e.
              Engine position 0 (the whole prompt) thus predicts generated token 0 as the observation
              predicts action token 0, and edgeinfer.core.speculative runs unchanged.

Cache kinds: how a rejected draft is forgotten (Engine.rollback(n): positions >= n are stale).
    "static"      preallocated tensors written in place at input_pos (gpt-fast): step writes the pass's entries
                  first, then each query at position p attends to positions <= p only, so a stale entry is
                  overwritten before anything reads it and rollback costs nothing.
    "functional"  the same, but step returns updated copies (the form exported to ONNX with explicit KV
                  inputs and outputs); the engine keeps the returned tensors.
    "append"      the cache grows by T per pass and holds exactly the positions fed so far (Hugging Face's
                  DynamicCache); the engine calls truncate_cache on rollback and before any pass that starts
                  inside the cached positions.

A module may declare `prefix_kind` and `cache_kind` class attributes; TorchModuleEngine's arguments win.

What speculative decoding relies on (checked at load by engines/models/protocol_check.py): the logits at a position
depend only on the tokens before it, not on a rejected draft that was fed and rolled back, not on how the
positions were split into passes, not on the sequence decoded before the last prefill. TorchModuleEngine
refuses a module that breaks this (a recurrent state, an append cache whose truncate_cache keeps entries)
with a ProtocolViolation naming the clause, instead of decoding it silently wrong.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from edgeinfer.engines.models.protocol_check import self_test

PREFIX_KINDS = ("obs", "tokens")
CACHE_KINDS = ("static", "functional", "append")
_PRECISION = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


class TorchModuleEngine:
    """Engine (engines/backends/engine.py) over a conforming module, batch 1, eager, under inference_mode.

    module: used as is (not copied), in eval mode, on its own device and dtype. prefix, cache: the kinds
    above (default: the module's prefix_kind / cache_kind attributes). step_kwargs: extra keyword arguments
    of every step call (e.g. {"inplace": False} runs engines/models/model.py's ActionTransformer functionally).
    cfg: the module's `cfg` attribute, if any. Logits come back as float32 numpy (T, V).
    selftest: decode a whole chunk several ways at load (engines/models/protocol_check.py, 2 n_tokens + 5 passes)
    and refuse a module whose cache does not rewind at any position of it; n_tokens: the longest chunk it will
    decode (default: cfg.n_tokens, else protocol_check.DEFAULT_TOKENS); probe: the prefix it decodes after
    (default: the prompt [0, 1], or a random observation of cfg.obs_dim). selftest_report: its SelfTestReport
    (None if skipped).
    Raises ValueError for an unknown kind, a "tokens" prefill without a prompt, or a pass that would leave
    a gap after the cached positions of an append cache; ProtocolViolation (a ValueError) for a module that
    fails the self-test.
    """

    backend = "torch-module"

    def __init__(self, module: torch.nn.Module, prefix: str | None = None, cache: str | None = None, *,
                 step_kwargs: dict | None = None, selftest: bool = True, probe: np.ndarray | None = None,
                 n_tokens: int | None = None):
        self.prefix_kind = prefix or getattr(module, "prefix_kind", None)
        self.cache_kind = cache or getattr(module, "cache_kind", None)
        if self.prefix_kind not in PREFIX_KINDS:
            raise ValueError(f"prefix kind must be one of {PREFIX_KINDS}, got {self.prefix_kind!r}")
        if self.cache_kind not in CACHE_KINDS:
            raise ValueError(f"cache kind must be one of {CACHE_KINDS}, got {self.cache_kind!r}")
        if self.cache_kind == "append" and not hasattr(module, "truncate_cache"):
            raise ValueError("cache kind 'append' needs module.truncate_cache(cache, n)")
        self.module = module.eval()
        self.cfg = getattr(module, "cfg", None)
        param = next(module.parameters())
        self.dtype, self._dev = param.dtype, param.device
        self.precision, self.device = _PRECISION.get(self.dtype, str(self.dtype)), str(self._dev)
        self._kwargs = step_kwargs or {}
        self.reset_cache()
        self.selftest_report = self_test(self, probe, n_tokens) if selftest else None

    def reset_cache(self) -> None:
        """A fresh cache from module.empty_cache: what a decode started on a new engine sees."""
        self._cache = tuple(self.module.empty_cache(1, self.dtype, self._dev))
        self._prefix: torch.Tensor | None = None  # the observation (obs kind), for passes away from position 0
        self._offset = 0  # module position of engine position e >= 1 is e + offset (tokens kind: P - 1)
        self._len = 0  # append kind: module positions held by the cache

    @torch.inference_mode()
    def forward(self, obs: np.ndarray | None, tokens: Sequence[int], start: int) -> np.ndarray:
        """logits (T, V) float32 for engine positions start.. (see engines/backends/engine.py and the module docstring;
        for prefix kind "tokens", obs is the prompt, (P,) int)."""
        skip = 0  # leading rows that are not engine positions (the prompt's first P - 1)
        if start == 0 and self.prefix_kind == "tokens":
            prompt = [int(t) for t in np.asarray(obs).reshape(-1)]
            if not prompt:
                raise ValueError("prefix kind 'tokens': the prefill needs a prompt of >= 1 token ids")
            ids, pos0, skip, self._offset = prompt + list(tokens), 0, len(prompt) - 1, len(prompt) - 1
        elif start == 0:
            self._prefix = torch.as_tensor(obs, dtype=torch.float32).to(self._dev, self.dtype).view(1, -1)
            ids, pos0 = [0, *tokens], 0
        else:
            ids, pos0 = list(tokens), start + self._offset
        if self.cache_kind == "append":
            if pos0 > self._len:
                raise ValueError(f"pass at module position {pos0} leaves a gap after {self._len} cached positions")
            if pos0 < self._len:
                self._truncate(pos0)
        tok = torch.tensor([ids], dtype=torch.long, device=self._dev)
        pos = torch.arange(pos0, pos0 + len(ids), device=self._dev)
        out = self.module.step(self._prefix if self.prefix_kind == "obs" else None, tok, pos, *self._cache,
                               **self._kwargs)
        if self.cache_kind == "static":
            logits = out
        else:
            logits, self._cache = out[0], tuple(out[1:])
            self._len = pos0 + len(ids)
        return logits[0, skip:].float().cpu().numpy()

    def rollback(self, n: int) -> None:
        """Forget engine positions >= n: nothing to do for a cache written by position; an append cache is
        truncated."""
        if self.cache_kind == "append":
            m = n + self._offset if n > 0 else 0
            if m < self._len:
                self._truncate(m)

    def _truncate(self, m: int) -> None:
        self._cache = tuple(self.module.truncate_cache(self._cache, m))
        self._len = m


class EngineDrafter:
    """Drafter decoding greedily with a draft model behind an Engine, e.g. a smaller llama through
    TorchModuleEngine: start(prefix) prefills the draft with the target's prefix (prompt or observation),
    then propose(tokens, k) as engines/models/drafters.py's Drafter. With features (the draft's featurizer,
    (q_rad, qd_rad_s, q_prev_rad) -> its prefix), reset(q_rad, qd_rad_s, q_prev_rad) takes the chunk's joint
    state as the runtime gives it, and the prefill waits for the first proposal (a chunk that does not
    speculate costs nothing here): the `model` drafter of a factory policy (engines/models/factory.py).

    The draft cache follows the committed prefix: `_fed` holds the tokens cached at engine positions
    1..len(_fed), `_rows` the logits row of every cached position. propose(tokens, k), n = len(tokens):
    positions up to the first token where `tokens` and `_fed` differ are still valid (a position depends
    only on those before it); the rest are fed in ONE pass (after a verify: the correction, or the last
    draft and the bonus token), then each draft but the last is fed to get the next row. k draft passes.
    """

    name = "model"

    def __init__(self, engine, features: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray] | None = None):
        self.engine, self.features = engine, features
        self._fed: list[int] = []
        self._rows: list[np.ndarray] = []  # row p predicts token p (engine positions)
        self._prefix: np.ndarray | None = None  # reset's prefix until the first proposal prefills it

    def reset(self, q_rad: np.ndarray, qd_rad_s: np.ndarray, q_prev_rad: np.ndarray) -> None:
        """The chunk's joint state, (D,) float64 each. Raises ValueError without features."""
        if self.features is None:
            raise ValueError("EngineDrafter.reset needs features= (the draft's featurizer); or call start(prefix)")
        self._prefix = self.features(q_rad, qd_rad_s, q_prev_rad)

    def start(self, prefix: np.ndarray) -> None:
        self.engine.rollback(0)
        self._rows = [self.engine.forward(prefix, (), 0)[-1]]
        self._fed = []
        self._prefix = None

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        if self._prefix is not None:
            self.start(self._prefix)
        n, m = len(tokens), 0
        while m < min(n, len(self._fed)) and self._fed[m] == tokens[m]:
            m += 1
        if m < n:
            self._feed(list(tokens[m:]), m)
        del self._fed[n:], self._rows[n + 1:]
        out: list[int] = []
        for i in range(k):
            out.append(int(self._rows[n + i].argmax()))
            if i < k - 1:
                self._feed(out[-1:], n + i)
        return out

    def propose_dist(self, tokens, k, warp, rng):
        """Greedy drafts with one-hot proposal rows (a deterministic drafter, as KinematicDrafter)."""
        drafts = self.propose(tokens, k)
        q = np.zeros((len(drafts), len(self._rows[0])))
        q[np.arange(len(drafts)), drafts] = 1.0
        return drafts, q

    def _feed(self, new: list[int], m: int) -> None:
        """Feed tokens m.. at engine positions m+1.. after the first m fed tokens."""
        self.engine.rollback(m + 1)
        rows = self.engine.forward(None, new, m + 1)
        del self._fed[m:], self._rows[m + 1:]
        self._fed.extend(new)
        self._rows.extend(rows)
