"""Drafters: cheap proposers of the next action tokens, verified by the target. Registry by name.

A drafter is reset once per chunk with the observation, then asked for k tokens after the committed prefix:

    drafter.reset(q_rad, qd_rad_s, q_prev_rad)      # (D,) float64 each
    drafter.propose(tokens, k) -> list[int]          # greedy mode; tokens: committed action tokens so far
    drafter.propose_dist(tokens, k, warp, rng) -> (list[int], q (k, n_bins) float64)
        # sampling mode: each draft token sampled from the drafter's own distribution q_i (its logits
        # through `warp`, the same temperature / top-p the target's get); a deterministic drafter
        # returns one-hot rows. rng: numpy Generator.

Drafts never change the output (the target decides every token in greedy mode, and the rejection rule
keeps the target's distribution in sampling mode); they only change how many tokens one target pass can
commit. Registry entries are factories taking the Policy (and options): make_drafter(name, policy).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from edgeinfer.core.protocols import Drafter
from edgeinfer.engines.models.dct_tokenizer import DctTokenizer
from edgeinfer.engines.models.tokenizer import ActionTokenizer

DEFAULT_DRAFT = Path(__file__).resolve().parents[1] / "weights" / "schunk_draft.json"  # engines/training/distill.py


def one_hot(tokens: Sequence[int], n_bins: int) -> np.ndarray:
    """(k, n_bins) float64 rows, 1 at each token: the proposal distribution of a deterministic drafter."""
    q = np.zeros((len(tokens), n_bins))
    q[np.arange(len(tokens)), list(tokens)] = 1.0
    return q


class KinematicDrafter:
    """Model-free drafter: constant-velocity extrapolation of each joint, tokenized.

    Along the chunk, a joint's offsets from the observed q are known at chunk steps -2 (q_prev - q,
    observed), -1 (0, the observation itself) and 0..h-1 (decoded from committed or already drafted
    tokens). The draft for step h repeats the last increment, offset[h-1] - offset[h-2]; its token is the
    tokenizer's bin of that increment (the error-feedback residual of a constant-velocity prediction).
    Smooth arm motion makes this a strong drafter at near-zero cost: no model, a few flops per token.
    On the held-out Schunk runs constant velocity beat linear and quadratic fits over 3-5 steps.
    """

    name = "kinematic"

    def __init__(self, tokenizer: ActionTokenizer):
        if getattr(tokenizer, "kind", "step") != "step":
            raise ValueError(f"KinematicDrafter drafts step tokens, not {tokenizer.kind!r} ones: build the kinematic "
                             "drafter with kinematic_drafter(tokenizer) or make_drafter('kinematic', policy)")
        self.tok = tokenizer
        self.d = tokenizer.n_joints
        self._first_tokens = [0] * self.d

    def reset(self, q_rad, qd_rad_s, q_prev_rad) -> None:
        increment = np.asarray(q_rad, dtype=np.float64) - np.asarray(q_prev_rad, dtype=np.float64)
        # step 0 of every joint: the bin of the observed increment over the last chunk step
        self._first_tokens = self.tok.bin_of(increment, np.arange(self.d)).tolist()

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        tokens = list(tokens)
        out: list[int] = []
        for _ in range(k):
            h, j = divmod(len(tokens), self.d)
            if h == 0:
                tok = self._first_tokens[j]
            else:  # the decoded increment of step h-1 is exactly its token's bin centre
                tok = tokens[(h - 1) * self.d + j]
            tokens.append(tok)
            out.append(tok)
        return out

    def propose_dist(self, tokens, k, warp, rng):
        drafts = self.propose(tokens, k)
        return drafts, one_hot(drafts, self.tok.n_bins)


class DctKinematicDrafter:
    """The kinematic drafter in DCT space (engines/models/dct_tokenizer.py): the constant-velocity extrapolation of each
    joint over the whole horizon, offset[h] = (h+1) * (q - q_prev), h = 0..H-1, tokenised once per chunk; draft
    token p is its token p. That chunk is the tokenizer's own prior, so its departure is zero: every draft is the
    bin of a zero coefficient. A coefficient does not follow from the ones before it the way a step follows from the
    steps before it, so the drafts ignore the committed tokens (the target corrects them)."""

    name = "kinematic"

    def __init__(self, tokenizer: DctTokenizer):
        self.tok = tokenizer
        self._tokens = [0] * (tokenizer.horizon * tokenizer.n_joints)

    def reset(self, q_rad, qd_rad_s, q_prev_rad) -> None:
        increment = np.asarray(q_rad, dtype=np.float64) - np.asarray(q_prev_rad, dtype=np.float64)
        steps = np.arange(1, self.tok.horizon + 1)[:, None]  # (H, 1) chunk steps ahead
        self._tokens = self.tok.encode(steps * increment[None, :], increment).tolist()  # all H*D tokens

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        n = len(tokens)
        return self._tokens[n:n + k]

    def propose_dist(self, tokens, k, warp, rng):
        drafts = self.propose(tokens, k)
        return drafts, one_hot(drafts, self.tok.n_bins)


def kinematic_drafter(tokenizer: ActionTokenizer | DctTokenizer) -> KinematicDrafter | DctKinematicDrafter:
    """The kinematic drafter for a tokenizer's kind: KinematicDrafter (step; also a factory policy's tokenizer,
    which has no kind and decodes step-major, engines/models/factory.py) or DctKinematicDrafter (dct)."""
    return {"step": KinematicDrafter, "dct": DctKinematicDrafter}[getattr(tokenizer, "kind", "step")](tokenizer)


class ModelDrafter:
    """Drafter that decodes with a model behind any Engine: a distilled draft model (`learned`) or the
    target's first layers (`early-exit`). Draft token p is the argmax (greedy) or a sample (sampling mode)
    of the engine's logits row at position p, which predicts action token p (engines/models/model.py).

    The draft engine's static KV cache follows what it was fed: `_fed` lists the tokens at positions
    1..len(_fed) (position 0, the observation, is prefilled by reset) and `_rows` (seq_len, n_bins) float32
    the logits row each position produced. A row stays valid while the tokens before it stay (a position's
    keys depend on earlier positions only), so `_sync(seq)` re-feeds seq from its first difference with
    `_fed`, in ONE pass; entries past it (old drafts) are overwritten by position later.

    propose(tokens, k), n = len(tokens): sync to tokens + the kinematic drafter's guesses of tokens
    n..n+k-2, then draft i = argmax of row n+i. After a verify this one pass feeds the target's correction
    (the catch-up) and the guesses together. Row n follows the committed tokens only; row n+i+1 follows
    draft i only where the fed guess equals it, and otherwise one more sync from there fixes it (Jacobi
    iteration, Santilli et al. 2023, arXiv 2305.10427): with max_passes None the drafts are exactly the
    model's autoregressive ones, in 1 + (wrong guesses) passes instead of k single-token passes.
    max_passes=1 stops after the first pass: drafts past a wrong guess come from rows that saw the guess,
    still proposals the target verifies (on the Schunk runs, k = 4: acceptance 0.62 instead of 0.66, for
    one draft pass per target pass instead of about two; faster overall, see engines/training/distill.py).
    propose_dist feeds every sample before drafting the next (q_i must follow the drafts actually sampled
    to track the target's p_i).

    Self-speculation with the target's own first layers: LayerSkip (Elhoushi et al. 2024, arXiv
    2404.16710), EAGLE (Li et al. 2024, arXiv 2401.15077). The acceptance rule is the target's (Leviathan
    et al. 2023; edgeinfer/core/speculative.py), so drafts change the speed, never the output.
    """

    def __init__(self, name: str, engine, policy, max_passes: int | None = None):
        if max_passes is not None and max_passes < 1:
            raise ValueError(f"ModelDrafter.max_passes must be >= 1 or None, got {max_passes}")
        self.name, self.engine, self.policy = name, engine, policy  # policy: the draft model's normalisation
        self.max_passes = max_passes
        self.guess = kinematic_drafter(policy.tokenizer)
        self.passes = 0  # draft-engine passes so far (prefills included): the drafter's cost in passes
        self._fed: list[int] = []
        self._obs: np.ndarray | None = None  # the chunk's features until the draft engine's prefill has run
        self._rows = np.zeros((policy.cfg.seq_len, policy.cfg.n_bins), np.float32)
        self._rowless = policy.cfg.seq_len  # _fed[_rowless:] were fed by a greedy_run, without logits rows

    def reset(self, q_rad, qd_rad_s, q_prev_rad) -> None:
        """Take the chunk's observation. The draft engine's prefill waits for the first proposal, so a chunk
        that does not speculate (adaptive k = 0, or another drafter chosen) costs nothing here, and the
        prefill is timed as part of drafting."""
        self.guess.reset(q_rad, qd_rad_s, q_prev_rad)
        self._obs = self.policy.features(q_rad, qd_rad_s, q_prev_rad)
        self._fed = []
        self._rowless = len(self._rows)

    def _prefill(self) -> None:
        if self._obs is not None:
            self.engine.rollback(0)
            self._rows[0] = self.engine.forward(self._obs, (), 0)[-1]
            self._obs = None
            self.passes += 1

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        run = getattr(self.engine, "greedy_run", None)
        if self.max_passes is None and run is not None and 0 < len(tokens) and len(tokens) + k <= len(self._rows) - 1:
            return self._draft_run(tokens, k, run)
        return self._draft(tokens, k, lambda row: int(row.argmax()), self.max_passes or k)

    def _draft_run(self, tokens: Sequence[int], k: int, run) -> list[int]:
        """The model's autoregressive drafts in ONE engine call (Engine.greedy_run: k passes back to back): sync
        the cache to tokens[:-1], then passes at positions n..n+k-1 (n = len(tokens)) each feeding the token
        before. The cache then holds tokens + drafts[:-1], so the next proposal, after the target kept some drafts,
        feeds nothing before its run; those positions have no logits rows (`_rowless`: from there)."""
        self._prefill()
        seq = list(tokens)
        self._sync(seq[:-1])  # a prefix of what the last run fed: no pass
        drafts = run(seq, k)
        self._fed = seq + drafts[:-1]
        self._rowless = min(self._rowless, len(seq) - 1)
        self.passes += k
        return drafts

    def propose_dist(self, tokens, k, warp, rng):
        """Drafts sampled from q_i = softmax(warp(logits_i)); returns (drafts, q (k, n_bins) float64)."""
        qs: list[np.ndarray] = []

        def sample(row: np.ndarray) -> int:
            qs.append(softmax(warp(row)))
            cdf = np.cumsum(qs[-1])
            # u < 1 = cdf[-1]: the first index whose cdf exceeds u, which has q > 0
            return int(np.searchsorted(cdf / cdf[-1], rng.random(), side="right"))

        drafts = self._draft(tokens, k, sample, k)
        return drafts, np.array(qs).reshape(len(drafts), self.policy.cfg.n_bins)

    def _draft(self, tokens: Sequence[int], k: int, pick: Callable[[np.ndarray], int], passes: int) -> list[int]:
        """k drafts after tokens, each pick(row) of its logits row, with at most `passes` engine passes."""
        del self._fed[self._rowless:]  # positions a greedy_run fed have no rows: fed again below
        self._rowless = len(self._rows)
        self._prefill()
        seq, n = list(tokens), len(tokens)
        passes -= self._sync(seq + self.guess.propose(seq, k - 1))
        for i in range(k):
            seq.append(pick(self._rows[n + i]))
            if i < k - 1 and passes > 0 and self._fed[n + i] != seq[-1]:  # rows past n+i saw a wrong guess
                passes -= self._sync(seq + self.guess.propose(seq, k - 2 - i))
        return seq[n:]

    def _sync(self, seq: list[int]) -> int:
        """Make the cache hold seq at positions 1..len(seq), feeding from the first difference in one pass.
        Returns the passes run (0 or 1)."""
        fed = self._fed
        m = min(len(seq), len(fed))
        if fed[:m] != seq[:m]:
            m = next(i for i, (a, b) in enumerate(zip(fed, seq)) if a != b)
        del fed[m:]
        if m == len(seq):
            return 0
        self.engine.rollback(m + 1)
        self._rows[m + 1:len(seq) + 1] = self.engine.forward(None, seq[m:], m + 1)
        fed.extend(seq[m:])
        self.passes += 1
        return 1


def softmax(z: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, float64; -inf entries get probability 0."""
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def default_backend() -> str:
    """The draft model's engine: packed when numba can run here (a whole pass as one call: ~10x faster per pass
    than onnxruntime for a small draft model on a 2-core CPU), else onnxruntime (about 4x torch eager), else torch."""
    from edgeinfer.engines.backends.engine import unavailable_reason

    return next(b for b in ("packed", "onnxruntime", "torch") if b == "torch" or unavailable_reason(b) is None)


def early_exit_policy(policy, n_layers: int = 1):
    """The target's first n_layers blocks with its own embeddings, final LayerNorm and head, as a Policy
    (an ActionTransformer of n_layers, weights copied from the target; same tokenizer and normalisation).
    Its manifest sha256 is derived from the target's, so engine caches key it apart. Raises ValueError
    unless 1 <= n_layers < the target's n_layers."""
    import dataclasses
    import hashlib

    from edgeinfer.engines.models.model import ActionTransformer
    from edgeinfer.engines.models.policy import Policy

    if not 1 <= n_layers < policy.cfg.n_layers:
        raise ValueError(f"early-exit n_layers must be in 1..{policy.cfg.n_layers - 1}, got {n_layers}")
    model = ActionTransformer(dataclasses.replace(policy.cfg, n_layers=n_layers)).eval()
    state = {k: v for k, v in policy.model.state_dict().items()
             if not k.startswith("blocks.") or int(k.split(".")[1]) < n_layers}
    model.load_state_dict(state)
    target = policy.manifest["sha256"]
    sha = hashlib.sha256(f"{target}:early-exit:{n_layers}".encode()).hexdigest()
    return Policy(model, policy.tokenizer, policy.feat_mean, policy.feat_std,
                  manifest={"sha256": sha, "early_exit_of": target, "n_layers": n_layers})


def _early_exit(policy, n_layers: int = 1, backend: str | None = None, max_passes: int | None = 1,
                **engine_options) -> ModelDrafter:
    """Self-speculation: the target's first n_layers blocks (early_exit_policy) on their own engine and cache."""
    from edgeinfer.engines.backends.build import load_engine

    draft = early_exit_policy(policy, n_layers)
    engine = load_engine(draft, backend or default_backend(), **engine_options)
    return ModelDrafter("early-exit", engine, draft, max_passes)


def draft_path(policy) -> Path:
    """Where the learned drafter of `policy` is: beside its manifest, named as `edgeinfer distill` names it
    (<name>_draft.json for <name>_target.json: the shipped schunk_draft.json for schunk_target.json,
    schunk_dct_draft.json for the DCT policy); DEFAULT_DRAFT for a policy not loaded from a file."""
    path = getattr(policy, "path", None)
    if path is None:
        return DEFAULT_DRAFT
    return path.with_name(f"{path.stem.removesuffix('_target')}_draft.json")


def applicable_drafters(policy) -> list[str]:
    """The drafters of policy.drafters that can run for it here: "learned" only when its draft exists
    (draft_path), so that drafter "auto" does not fail for a policy that was never distilled."""
    return [n for n in policy.drafters if n != "learned" or draft_path(policy).is_file()]


CHEAP_DRAFT = 8  # a draft model with at most 1/8 of the target's parameters drafts autoregressively (max_passes None)


def _learned(policy, path: Path | str | None = None, backend: str | None = None, max_passes: int | None | str = "auto",
             **engine_options) -> ModelDrafter:
    """The distilled draft model at `path` (None: draft_path(policy); engines/training/distill.py). max_passes "auto":
    None (the model's own autoregressive drafts, more of them kept) when it has at most 1/CHEAP_DRAFT of the target's
    parameters, so that its passes cost little beside the target's; else 1 (see ModelDrafter). Raises
    FileNotFoundError naming the expected file and the command that makes it; ValueError when its tokens do not
    mean the target's (shape, tokenizer or normalisation differ); warns when it was distilled from another
    target (still exact, but its drafts will rarely be accepted)."""
    from edgeinfer.engines.backends.build import load_engine
    from edgeinfer.engines.models.policy import load_policy

    if path is None:
        path = draft_path(policy)
        if not path.is_file():
            target = getattr(policy, "path", None) or "the target"
            raise FileNotFoundError(f"no learned drafter for {target}: expected {path} "
                                    f"(edgeinfer distill --target {target} --out {path})")
    draft = load_policy(path)
    same = ("obs_dim", "n_joints", "horizon", "n_bins")
    if any(getattr(draft.cfg, f) != getattr(policy.cfg, f) for f in same) or \
            draft.tokenizer.state_dict() != policy.tokenizer.state_dict() or \
            not (np.allclose(draft.feat_mean, policy.feat_mean) and np.allclose(draft.feat_std, policy.feat_std)):
        raise ValueError(f"draft model {path} does not share the target's {same}, tokenizer and normalisation")
    if draft.manifest.get("distilled_from") != policy.manifest.get("sha256"):
        print(f"WARNING: draft model {path} was distilled from {draft.manifest.get('distilled_from')}, not from "
              f"this target ({policy.manifest.get('sha256')}): run `edgeinfer distill`", file=sys.stderr)
    engine = load_engine(draft, backend or default_backend(), **engine_options)
    if max_passes == "auto":
        size = [sum(p.numel() for p in m.parameters()) for m in (draft.model, policy.model)]
        max_passes = None if size[0] * CHEAP_DRAFT <= size[1] else 1
    return ModelDrafter("learned", engine, draft, max_passes)


def _model(policy, device: str = "cpu") -> Drafter:
    """A factory policy's draft model (engines/models/factory.py) through the model protocol, on `device`."""
    from edgeinfer.engines.models.model_protocol import EngineDrafter

    return EngineDrafter(policy.open_draft_engine(device), policy.draft.features)


DRAFTERS: dict[str, Callable[..., Drafter]] = {
    "kinematic": lambda policy: kinematic_drafter(policy.tokenizer),
    "early-exit": _early_exit,
    "learned": _learned,
    "model": _model,
}


def make_drafter(name: str, policy, **kwargs) -> Drafter:
    """Build a drafter by registry name for `policy` (edgeinfer.engines.models.policy.Policy, or a factory policy:
    engines/models/factory.py), with the factory's options: early-exit (n_layers=1), learned (path=draft_path(policy));
    both take backend (None: default_backend()), max_passes (default 1, see ModelDrafter) and load_engine's options
    (e.g. cache, log for onnxruntime); model (device="cpu"). Raises KeyError naming the known drafters, ValueError
    for one that does not apply to the policy (policy.drafters)."""
    if name not in DRAFTERS:
        raise KeyError(f"unknown drafter {name!r}; known: {sorted(DRAFTERS)}")
    if name not in policy.drafters:
        raise ValueError(f"drafter {name!r} does not apply to this policy; its drafters: {list(policy.drafters)}")
    return DRAFTERS[name](policy, **kwargs)
