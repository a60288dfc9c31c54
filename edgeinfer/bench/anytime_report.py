"""Rendering `edgeinfer bench anytime`'s result (edgeinfer/bench/anytime.py): the terminal tables (rich) and the
plot (matplotlib): the anytime curve (action RMSE vs verified tokens, both tokenizers) and held ticks per replay
condition. Everything is computed from the result dict, never typed by hand."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from edgeinfer.core.progress import say
from edgeinfer.core.wire import RUNGS


def _mrad(v) -> str:
    return "-" if v is None else f"{v * 1e3:.3f}"


def print_result(result: dict, console: Console | None = None) -> None:
    """The curve, spec, replay and verdict tables of `result`."""
    console = console or Console(width=150)
    pols = list(result["curve"])
    t = Table(title="anytime curve: action RMSE (mrad) vs verified tokens, over the whole horizon and at its first "
                    f"step ({result['curve'][pols[0]]['windows']} held-out windows)")
    t.add_column("tokens", justify="right")
    kinds = (("greedy", "action_rmse_rad"), ("tokenizer", "action_rmse_rad"), ("greedy", "first_step_rmse_rad"))
    cols = [(p, kind, key) for p in pols for kind, key in kinds]
    for p, kind, key in cols:
        t.add_column(f"{p} {kind}" + (" step 1" if key == "first_step_rmse_rad" else ""), justify="right")
    for i, point in enumerate(result["curve"][pols[0]]["greedy"]):
        t.add_row(str(point["tokens"]), *(_mrad(result["curve"][p][kind][i].get(key)) for p, kind, key in cols))
    console.print(t)

    t = Table(title="speculative decoding (held-out chunks, torch target)")
    for col in ("policy", "drafter", "row", "k", "x target-only", "acceptance", "tokens/pass", "exact"):
        t.add_column(col, justify="left" if col in ("policy", "drafter", "row") else "right")
    for p, s in result["spec"].items():
        t.add_row(p, "-", "target-only", "-", "1.00", "-", "1.00", "yes")
        for d, rows in s["drafters"].items():
            for kind, r in rows.items():
                acc = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.3f}"
                t.add_row(p, d, kind, str(r["k"] or "-"), f"{r['speedup']:.2f}", acc,
                          f"{r['tokens_per_target_pass']:.2f}", "yes" if r["exact"] else "NO")
    console.print(t)
    for p, s in result["spec"].items():
        for d, why in s.get("drafters_skipped", {}).items():
            say(console, f"{p} policy: drafter {d} skipped: {why}")

    t = Table(title="replays (runs pooled): steady-state misses, held ticks, tick rungs, commanded action RMSE")
    for col in ("policy", "condition", "ticks", "miss rate (95 % CI)", "held", *RUNGS[:-1], "RMSE mrad",
                "w/o holds"):
        t.add_column(col, justify="left" if col in ("policy", "condition") else "right")
    for r in result["replays"]:
        lo, hi = r["miss_rate_ci95"]
        miss = "-" if r["miss_rate"] is None else f"{r['miss_rate'] * 100:.2f} % ({lo * 100:.2f}-{hi * 100:.2f})"
        t.add_row(r["policy"], r["condition"], str(r["ticks"]), miss, str(r["held_ticks"]),
                  *(str(r["tick_rungs"].get(rung, 0)) for rung in RUNGS[:-1]),
                  _mrad(r["action_rmse_rad"]), _mrad(r["action_rmse_rad_without_holds"]))
    console.print(t)

    v = result["verdict"]
    for row in v["conditions_with_step_partial"]:
        console.print(f"{row['condition']}: step sends partial chunks; DCT held ticks {row['held_ticks']['dct']} vs "
                      f"{row['held_ticks']['step']} ({_fewer(row)}), RMSE "
                      f"{_mrad(row['action_rmse_rad']['dct'])} vs {_mrad(row['action_rmse_rad']['step'])} mrad "
                      f"({'lower' if row['lower_action_rmse'] else 'NOT lower'})")
    if not v["conditions_with_step_partial"]:
        console.print("no condition where the step policy sent partial chunks")
    console.print(f"full-chunk RMSE DCT / step {v['full_chunk_ratio']:.3f} "
                  f"({'within' if v['full_chunk_within_10pct'] else 'NOT within'} 10 %); "
                  f"verdict: {'PASSED' if v['passed'] else 'FAILED'}; {result['seconds']:.0f} s; plot {result['plot']}")


def _fewer(row: dict) -> str:
    if not row["fewer_held_ticks"]:
        return "NOT fewer"
    return "none held" if row["held_ticks"]["dct"] == row["held_ticks"]["step"] == 0 else "fewer"


def write_plot(result: dict, path: Path) -> Path:
    """anytime.png at `path`: (left) action RMSE vs verified tokens, greedy solid and tokenizer-only dashed, per
    policy; (right) held ticks per replay condition, one bar per policy. Returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, (p, c) in enumerate(result["curve"].items()):
        for kind, style in (("greedy", "-o"), ("tokenizer", "--x")):
            pts = c[kind]
            ax.plot([q["tokens"] for q in pts], [q["action_rmse_rad"] * 1e3 for q in pts], style, color=f"C{i}",
                    label=f"{p} {kind}")
    ax.set(xlabel="verified tokens", ylabel="action RMSE over the horizon (mrad)", yscale="log",
           title="anytime curve (held-out windows)")
    ax.legend()
    conds = list(dict.fromkeys(r["condition"] for r in result["replays"]))
    width = 0.8 / max(1, len(result["curve"]))
    for i, p in enumerate(result["curve"]):
        held = {r["condition"]: r["held_ticks"] for r in result["replays"] if r["policy"] == p}
        bx.bar([j + i * width for j in range(len(conds))], [held.get(c, 0) for c in conds], width, label=p,
               color=f"C{i}")
    bx.set_xticks([j + width * (len(result["curve"]) - 1) / 2 for j in range(len(conds))], conds, rotation=20)
    bx.set(ylabel="held ticks (runs pooled)", title="held ticks per replay condition")
    bx.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
