"""The DCT tokenizer's figures in docs/policy.md and docs/anytime.md, on the held-out Schunk windows:

1. round-trip error (tokenized recorded future vs the future, mrad) at the first step and over the chunk, of 64
   step tokens, 128-bin DCT tokens of the offsets themselves, and 128-bin DCT tokens of the
   departure from constant velocity (the shipped kind), each fitted on the training windows;
2. per prefix of r rows: the tokenized future, the error bound (DctTokenizer.error_bound_sq, as an RMS per step),
   the shipped DCT policy's greedy tokens over the horizon and at the first step.

    .venv/bin/python scripts/dct_prefix_table.py      # needs ../shared/data/schunk_lwa4p; ~1 min on 2 cores
"""
import numpy as np
from scipy.fft import dct

from edgeinfer.engines.models.bins import fitted_range
from edgeinfer.engines.models.dct_tokenizer import DctTokenizer, dct_rad
from edgeinfer.engines.models.paths import DCT_POLICY
from edgeinfer.engines.models.policy import feature_increment, load_policy
from edgeinfer.engines.models.tokenizer import ActionTokenizer
from edgeinfer.engines.training.dataset import step_increments
from edgeinfer.engines.training.evaluate import greedy_tokens
from edgeinfer.engines.training.fit_data import SCHUNK_DATA, FitDataConfig, load_fit_data


def mrad(err: np.ndarray) -> float:
    return float(np.sqrt(np.mean(err ** 2)) * 1e3)


def main() -> None:
    policy = load_policy(DCT_POLICY)
    tok, cfg = policy.tokenizer, policy.cfg
    data = load_fit_data(FitDataConfig(data=SCHUNK_DATA))
    f_tr, o_tr = data.windows("train", cfg.horizon, cfg.stride_ticks)
    feats, off = data.windows("held_out", cfg.horizon, cfg.stride_ticks)
    inc, d = feature_increment(feats), cfg.n_joints
    step = ActionTokenizer.fit(step_increments(o_tr), 64)
    own = DctTokenizer(*fitted_range(dct_rad(o_tr), 0.998), 128)  # bins over the offsets' own coefficients
    k, j = np.indices(own.lo_rad.shape)
    own_trip = dct(own.centers_rad(own.bin_of(dct_rad(off), k, j), k, j), type=3, norm="ortho", axis=-2)
    departure = DctTokenizer.fit(o_tr, feature_increment(f_tr), 128)
    print(f"{len(feats)} held-out windows; round trip, mrad (first step / whole chunk)")
    for name, e in (("step, 64 bins", step.decode(step.encode(off)) - off),
                    ("DCT of the offsets, 128 bins", own_trip - off),
                    ("DCT of the departure, 128 bins", departure.decode(departure.encode(off, inc), inc) - off)):
        print(f"  {name:32s} {mrad(e[:, 0]):.3f} / {mrad(e):.3f}")
    ref, greedy = tok.encode(off, inc), greedy_tokens(policy, feats)
    rows = {"tokenized future": [], "bound": [], "greedy": [], "greedy, first step": []}
    for r in range(1, cfg.horizon + 1):
        rows["tokenized future"].append(mrad(tok.decode(ref[:, :r * d], inc) - off))
        rows["bound"].append(float(np.sqrt(tok.error_bound_sq(r, off, inc).sum(-1).mean() / off[0].size) * 1e3))
        g = tok.decode(greedy[:, :r * d], inc) - off
        rows["greedy"].append(mrad(g))
        rows["greedy, first step"].append(mrad(g[:, 0]))
    cv = tok.decode(ref[:, :0], inc) - off
    print(f"constant velocity (no row): {mrad(cv):.3f}, first step {mrad(cv[:, 0]):.3f}")
    print("| rows (tokens) | " + " | ".join(f"{r} ({r * d})" for r in range(1, cfg.horizon + 1)) + " |")
    print("|---" * (cfg.horizon + 1) + "|")
    for name, v in rows.items():
        print(f"| {name}, mrad | " + " | ".join(f"{x:.3f}" for x in v) + " |")


if __name__ == "__main__":
    main()
