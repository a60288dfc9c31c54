"""Load-time self-test of a bring-your-own model (engines/models/model_protocol.py): does its cache rewind?

Speculative decoding is exact only if the logits at engine position p depend on the committed tokens before p
alone: not on a rejected draft that was fed and rolled back, not on how the positions were split into passes,
not on the sequence decoded before. A module that breaks this (a recurrent state that cannot rewind, an
append cache whose truncate_cache keeps the entries, a multi-token pass without a causal mask) decodes with
no error and drifts from target-only decoding a few tokens after the first rejected draft; a sliding-window
(rotating) cache does so only once the sequence is longer than its window (mlx-lm's RotatingKVCache, whose
trim cannot bring back the entries a rejected draft overwrote). So the self-test decodes the whole chunk: the
probe prefix, then n random tokens (n: the policy's longest chunk, all its tokens: engine positions 0..n), in
several ways, and compares every logits row with the reference:

    reference            fresh cache (module.empty_cache), the prefill, then one token per pass:
                         target-only decoding
    "fresh cache"        a new empty_cache and the prefill again (state kept outside the cache shows here)
    "multi-token pass"   then all n tokens in one pass (as a verify pass feeds them)
    "rollback"           then a fresh cache, the prefill and, at every position p = 1..n, speculative decoding
                         with every draft rejected: rollback(p), then one pass of the real token at p and a
                         rejected draft of min(k, n - p) other tokens at p+1.. (k: the most drafts a pass
                         verifies; default: to the chunk's end, every k a decode can use); each pass's row
                         at p must be the reference's
    "prefill"            on that used cache, a new prefill and the n tokens in one pass (the next chunk)

Positions past n are never fed: speculative decoding clamps k to the tokens left (core/speculative.py), so a
chunk of n tokens reaches engine position n - 1 and the self-test, position n.
Each clause is checked on a state the clauses before it have cleared, so the first that fails is the one
broken. A row fails when max |got - reference| exceeds rtol x the largest |reference logit|. Cost: 2n + 5
forward passes (101 for the built-in policy's 48 tokens), n of them rollback passes of up to k + 1 tokens;
the module must hold the prefix and n tokens (the prompt's P tokens + n positions for prefix kind "tokens").

check_speculative then decodes whole chunks, as the runtime does: speculative decoding with each drafter (and an
oracle that proposes target-only's tokens with every third one changed, so that passes both keep and reject
drafts) must commit exactly target-only greedy decoding's tokens (clause "speculative"). A factory policy runs
both at load (engines/models/factory.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from edgeinfer.core.speculative import FixedK, speculative_decode

DEFAULT_TOKENS = 8  # positions decoded when neither the caller nor the module's cfg (n_tokens) gives a chunk
MIN_TOKENS = 4  # the rollback clause needs drafts rejected at two positions or more
# relative tolerances: a pass of T tokens may sum in another order than T passes of one token (< 1e-6 of the
# largest logit in fp32 on CPU; bf16 rounds each op to 4e-3); a stale cache entry moves them by 0.1-0.5
RTOL = {torch.float64: 1e-6, torch.float32: 1e-3}
LOW_PRECISION_RTOL = 3e-2  # bf16, fp16 and anything else
SPECULATIVE_K = 4  # check_speculative: drafts per target pass
ORACLE_WRONG_EVERY = 3  # check_speculative's oracle changes the tokens at positions that are multiples of this
_WRITTEN_BY_POSITION = ("a pass does not overwrite the entries of its positions: a recurrent state, or a cache "
                        "that grows by appending (declare cache kind 'append' and give truncate_cache)")
_ROLLBACK_CAUSE = {"static": _WRITTEN_BY_POSITION, "functional": _WRITTEN_BY_POSITION,
                   "append": "truncate_cache(cache, n) kept what was fed at positions >= n; a recurrent state "
                             "cannot be cut"}


class ProtocolViolation(ValueError):
    """A module breaks the model protocol. clause: "logits", "fresh cache", "multi-token pass", "rollback",
    "prefill" or "speculative"."""

    def __init__(self, clause: str, message: str):
        super().__init__(message)
        self.clause = clause


@dataclass(frozen=True)
class SelfTestReport:
    """worst: clause -> the largest relative logits difference seen (max |got - reference| / max |reference|);
    rtol: the tolerance applied; passes: forward passes spent."""

    worst: dict[str, float]
    rtol: float
    passes: int


def default_probe(engine) -> np.ndarray:
    """The prefix the self-test decodes after: prefix kind "tokens": the prompt [0, 1]; "obs": a seeded
    standard normal observation (module.cfg.obs_dim,) float32. Raises ValueError for an "obs" module
    without cfg.obs_dim (pass probe= instead)."""
    if engine.prefix_kind == "tokens":
        return np.array([0, 1], np.int64)
    obs_dim = getattr(engine.cfg, "obs_dim", None)
    if obs_dim is None:
        raise ValueError(f"{type(engine.module).__name__}: prefix kind 'obs' without cfg.obs_dim: pass probe=, "
                         f"an observation (obs_dim,) float32, for the load self-test")
    return np.random.default_rng(0).standard_normal(obs_dim).astype(np.float32)


def self_test(engine, probe: np.ndarray | None = None, n_tokens: int | None = None, k: int | None = None,
              rtol: float | None = None) -> SelfTestReport:
    """Run the clauses of the module docstring on `engine` (a TorchModuleEngine), then give it a fresh cache.

    probe: the prefix (see default_probe). n_tokens: the longest chunk, tokens decoded after the prefix, >= 4
    (default: the module's cfg.n_tokens, else DEFAULT_TOKENS); the module must hold engine positions
    0..n_tokens. k: the most drafts a pass verifies (default: to the chunk's end). rtol: relative tolerance
    (default by the module's dtype: RTOL, else LOW_PRECISION_RTOL). Returns a SelfTestReport.
    Raises ProtocolViolation (a ValueError) naming the module, the clause broken, the engine position and
    the difference; ValueError for n_tokens < 4, k < 1 or a probe that default_probe cannot make.
    """
    n = getattr(engine.cfg, "n_tokens", DEFAULT_TOKENS) if n_tokens is None else n_tokens
    if not isinstance(n, int) or n < MIN_TOKENS:
        raise ValueError(f"self_test: n_tokens must be an int >= {MIN_TOKENS}, got {n!r}")
    if k is not None and k < 1:
        raise ValueError(f"self_test: k must be >= 1 (or None: to the chunk's end), got {k}")
    k = n if k is None else k
    prefix = default_probe(engine) if probe is None else probe
    name = type(engine.module).__name__

    engine.reset_cache()
    rows = [engine.forward(prefix, (), 0)]
    vocab = max(rows[0].shape[-1], 2)  # (a narrower row fails the check below)
    rng = np.random.default_rng(0)
    real = rng.integers(0, vocab, n).tolist()  # the token at engine position p >= 1 is real[p - 1]
    # junk[p]: a rejected draft's token at engine position p, never the real one
    junk = [0] + ((np.array(real) + rng.integers(1, vocab, n)) % vocab).tolist()
    rows += [engine.forward(None, [tok], p) for p, tok in enumerate(real, 1)]
    for p, row in enumerate(rows):
        if row.shape != (1, vocab) or not np.all(np.isfinite(row)):
            raise ProtocolViolation("logits", f"{name} breaks the model protocol (logits): the pass at engine "
                                              f"position {p} gave logits of shape {row.shape}, finite: "
                                              f"{bool(np.all(np.isfinite(row)))}; expected one finite row of "
                                              f">= 2 logits per position fed")
    check = _Checker(name, np.concatenate(rows), RTOL.get(engine.dtype, LOW_PRECISION_RTOL) if rtol is None
                     else rtol)

    engine.reset_cache()
    check("fresh cache", engine.forward(prefix, (), 0), 0, 1,
          "the output depends on state kept outside the cache: a prefill on a new module.empty_cache()")
    check("multi-token pass", engine.forward(None, real, 1), 1, n + 1,
          f"a pass of {n} tokens at engine positions 1..{n} differs from {n} single-token passes")
    # every pass rejects all its drafts, so every position p >= 2 is first read after a rollback(p) that had
    # to forget a draft written at p.. (a window's worth later than a short probe would reach)
    engine.reset_cache()  # a fresh cache (cleared above) and prefill: each row below follows rejected drafts only
    engine.forward(prefix, (), 0)
    walk = []
    for p in range(1, n + 1):
        engine.rollback(p)
        walk.append(engine.forward(None, [real[p - 1], *junk[p + 1:p + 1 + min(k, n - p)]], p)[:1])
    check("rollback", np.concatenate(walk), 1, n + 1,
          f"rollback(p) did not forget positions >= p ({_ROLLBACK_CAUSE[engine.cache_kind]}): decoding "
          f"{n} tokens with a rejected draft of up to {min(k, n - 1)} tokens after each position p and "
          f"rollback(p) before the next pass")
    check("prefill", engine.forward(prefix, real, 0), 0, n + 1,
          "a new prefill did not forget the previous sequence (a cache not rewritten or truncated from "
          "position 0): on a used cache")
    engine.reset_cache()
    return SelfTestReport(check.worst, check.rtol, passes=2 * n + 5)


def check_speculative(engine, cases: Sequence[tuple[np.ndarray, tuple]], n_tokens: int, drafters: dict,
                      k: int = SPECULATIVE_K) -> dict[str, float]:
    """Speculative decoding (edgeinfer.core.speculative, greedy, k drafts per pass) commits the same tokens as
    target-only decoding, for every case and drafter.

    cases: (prefix, state) pairs: the engine's prefix (observation features, or a prompt) and the (q_rad,
    qd_rad_s, q_prev_rad) the drafters are reset with. drafters: name -> Drafter (core/protocols.py); an oracle
    is added. Returns name -> tokens per target pass over the cases. Raises ProtocolViolation (clause
    "speculative") naming the drafter, the case and the first token that differs.
    """
    name = type(getattr(engine, "module", engine)).__name__
    passes: dict[str, int] = {}
    for i, (prefix, state) in enumerate(cases):
        want = speculative_decode(engine, prefix, n_tokens, None, FixedK(0)).tokens
        for drafter_name, drafter in {**drafters, "oracle": _Oracle(want)}.items():
            drafter.reset(*state)
            got = speculative_decode(engine, prefix, n_tokens, drafter, FixedK(k))
            if got.tokens != want:
                j = next((j for j, (a, b) in enumerate(zip(got.tokens, want)) if a != b), min(len(got.tokens),
                                                                                             len(want)))
                raise ProtocolViolation("speculative", f"{name} breaks the model protocol (speculative): with the "
                                                       f"{drafter_name} drafter (k={k}) on probe observation {i}, "
                                                       f"speculative decoding commits {got.tokens[j:j + 1]} as "
                                                       f"token {j}, target-only greedy decoding {want[j:j + 1]}")
            passes[drafter_name] = passes.get(drafter_name, 0) + got.target_passes
    return {d: len(cases) * n_tokens / p for d, p in passes.items()}


class _Oracle:
    """Proposes the target-only tokens, every ORACLE_WRONG_EVERY-th one changed: passes keep and reject drafts."""

    name = "oracle"

    def __init__(self, tokens: list[int]):
        self.tokens = tokens

    def reset(self, q_rad, qd_rad_s, q_prev_rad) -> None:
        pass

    def propose(self, tokens, k: int) -> list[int]:
        n = len(tokens)
        out = self.tokens[n:n + k]
        return [t if (n + i) % ORACLE_WRONG_EVERY else (t - 1 if t > 0 else 1) for i, t in enumerate(out)]

    def propose_dist(self, tokens, k, warp, rng):
        raise NotImplementedError("the oracle drafter serves the greedy load check only")


class _Checker:
    """Compares logits rows with the reference (1 + n, V) and records the worst relative difference."""

    def __init__(self, name: str, reference: np.ndarray, rtol: float):
        self.name, self.ref, self.rtol = name, reference.astype(np.float64), rtol
        self.scale = max(float(np.abs(self.ref).max()), np.finfo(np.float64).tiny)
        self.worst: dict[str, float] = {}

    def __call__(self, clause: str, got: np.ndarray, start: int, stop: int, what: str) -> None:
        """got: the logits rows of engine positions start..stop-1; raises ProtocolViolation when one is off."""
        want = self.ref[start:stop]
        head = f"{self.name} breaks the model protocol ({clause}): {what}"
        if got.shape != want.shape:
            raise ProtocolViolation(clause, f"{head}: logits of shape {got.shape}, expected {want.shape}")
        if not np.all(np.isfinite(got)):
            raise ProtocolViolation(clause, f"{head}: non-finite logits")
        diff = np.abs(got - want).max(axis=1)  # (rows,)
        self.worst[clause] = float(diff.max() / self.scale)
        if self.worst[clause] > self.rtol:
            i = int(np.argmax(diff > self.rtol * self.scale))  # the first row off
            raise ProtocolViolation(clause, f"{head}, logits at engine position {start + i} differ from "
                                            f"the first decode (target-only, from a fresh cache) by {diff[i]:.3g} "
                                            f"({diff[i] / self.scale:.2g} of the largest logit "
                                            f"{self.scale:.3g}; tolerance {self.rtol:.2g})")
