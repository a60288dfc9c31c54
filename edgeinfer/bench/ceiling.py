"""How fast speculation could ever be on one engine: the ceiling its own pass-cost curve sets.

A chunk of n tokens decodes target-only in a prefill plus n - 1 single-token passes. With speculation at k drafts,
each verify pass of k + 1 tokens commits T_k tokens (1 <= T_k <= k + 1), so the chunk takes the prefill plus
(n - 1) / T_k verify passes of cost c(k + 1). Drafting and the decoder's own work only add to that, so

    ceiling(k) = (c(1) + (n - 1) c(1)) / (c(1) + (n - 1) / T_k * c(k + 1))

bounds the speed-up of any drafter with tokens-per-pass T_k on this engine (Leviathan et al. 2023, arXiv
2211.17192, section 3.4, with the cost of drafting set to 0). Two ceilings are reported, each the best over k:
    oracle      T_k = k + 1, every draft kept: no drafter can beat it on this engine;
    measured    T_k as the bench measured it for a drafter: what that drafter could reach were drafting free.
On a CPU a verify pass costs about one pass plus one token's arithmetic per extra token, so c(k + 1) / c(1) grows
with k and the ceiling is low; on a GPU the curve is flat for small k and the ceiling is about k + 1.
"""
from __future__ import annotations

from typing import Mapping


def chunk_us(pass_cost_us: Mapping[int, float], n_tokens: int, k: int, tokens_per_pass: float) -> float:
    """A chunk's decode time, us, with nothing but target passes: the prefill c(1) and (n_tokens - 1) / T_k verify
    passes of k + 1 tokens (k = 0: target-only, T_0 = 1). pass_cost_us: {tokens in the pass: p50 us}. Raises
    KeyError when the curve lacks k + 1, ValueError unless 1 <= tokens_per_pass <= k + 1."""
    if not 1 <= tokens_per_pass <= k + 1:
        raise ValueError(f"tokens per pass must be in 1..{k + 1} for k={k}, got {tokens_per_pass}")
    return pass_cost_us[1] + (n_tokens - 1) / tokens_per_pass * pass_cost_us[k + 1]


def ceiling(pass_cost_us: Mapping[int, float], n_tokens: int,
            tokens_per_pass: Mapping[int, float] | None = None, pass_us: float | None = None) -> dict:
    """The best speed-up over target-only on this curve: {"ratio", "k"}, best over the k the curve covers (k + 1 in
    pass_cost_us) and, when tokens_per_pass ({k: measured T_k}) is given, over the k it holds; the oracle
    (every draft kept) when tokens_per_pass is None. Keys of pass_cost_us may be ints or their strings (JSON).
    pass_us: what one target-only pass really costs inside a decode (a chunk's time over its tokens), when the
    decoder adds a fixed cost to every pass that the curve, timed on the engine alone, does not hold (torch's eager
    loop): every pass of the curve is then shifted by pass_us - c(1). Raises ValueError without c(1)."""
    cost = _curve(pass_cost_us, pass_us)
    plain = chunk_us(cost, n_tokens, 0, 1.0)
    per_k = {k: float(k + 1) for k in range(1, max(cost))} if tokens_per_pass is None else \
        {int(k): float(t) for k, t in tokens_per_pass.items() if int(k) + 1 in cost}
    best = {"ratio": 1.0, "k": 0}
    for k, t in per_k.items():
        ratio = plain / chunk_us(cost, n_tokens, k, t)
        if ratio > best["ratio"]:
            best = {"ratio": round(ratio, 3), "k": k}
    return best


def speedup_at(pass_cost_us: Mapping[int, float], n_tokens: int, k: int, tokens_per_pass: float,
               pass_us: float | None = None) -> float:
    """Target-only's chunk time over speculation's at this k and T_k, with free drafting (below 1: speculation at
    this k loses even then). Arguments and errors as ceiling's, plus KeyError when the curve lacks k + 1."""
    cost = _curve(pass_cost_us, pass_us)
    return chunk_us(cost, n_tokens, 0, 1.0) / chunk_us(cost, n_tokens, k, tokens_per_pass)


def _curve(pass_cost_us: Mapping[int, float], pass_us: float | None) -> dict[int, float]:
    """{tokens: us} with int keys, shifted so that c(1) = pass_us when given. Raises ValueError without c(1)."""
    cost = {int(t): float(us) for t, us in pass_cost_us.items()}
    if 1 not in cost:
        raise ValueError("the pass-cost curve has no single-token pass (key 1)")
    if pass_us is not None:
        cost = {t: us - cost[1] + pass_us for t, us in cost.items()}
    return cost


def ceiling_lines(result: dict) -> list[str]:
    """`edgeinfer bench engines`' ceiling lines: per engine row with a pass-cost curve, the oracle ceiling and, for
    each drafter's exact ultrafast rows on the same engine (first policy: the one the engine rows measured), the
    ceiling at the tokens per verify pass it measured, beside the speed-up it measured (the curve shifted to the
    target-only chunk's own cost per pass: see ceiling's pass_us). result: the bench's JSON
    (rows, data.threads, ultrafast.rows and policies). Rows with an error or without a curve are skipped."""
    uf = result.get("ultrafast") or {}
    policy = next(iter(uf.get("policies") or {}), None)
    n_tokens = uf["policies"][policy]["n_tokens"] if policy else None
    run_threads = (result.get("data") or {}).get("threads", 1)
    lines = []
    for row in result.get("rows", []):
        curve = row.get("pass_cost_us_p50")
        if row.get("error") or not curve or n_tokens is None:
            continue
        engine = f"{row['backend']} {row['precision']}" + (f" x{row['threads']} threads" if row["threads"] > 1 else "")
        same = [r for r in uf.get("rows", []) if r.get("policy") == policy and not r.get("error")
                and r["backend"] == row["backend"] and r["precision"] == row["precision"]
                and (r.get("threads") or run_threads) == row["threads"] and r["acceptance"] == "greedy"]
        own = next((r for r in same if r["decode"] == "target-only"), None)
        pass_us = own["chunk_us_p50"] / n_tokens if own else None
        best = ceiling(curve, n_tokens, pass_us=pass_us)
        parts = [f"any drafter x{best['ratio']:.2f} (k={best['k']})"]
        for r in same:
            passes = r.get("target_passes_per_chunk")
            if r["decode"] in ("target-only", "one-graph", "preset") or not passes or passes <= 1 or own is None:
                continue
            t = min((n_tokens - 1) / (passes - 1), r["k"] + 1)
            if r["k"] + 1 not in {int(n) for n in curve}:
                continue
            cap = speedup_at(curve, n_tokens, r["k"], t, pass_us)
            parts.append(f"{r['decode']} k={r['k']} ({t:.2f} tokens per verify pass) x{cap:.2f} with free "
                         f"drafting, measured x{own['chunk_us_p50'] / r['chunk_us_p50']:.2f}")
        lines.append(f"{policy}: ceiling of speculation on {engine} (estimated from its pass-cost curve): "
                     + "; ".join(parts))
    return lines
