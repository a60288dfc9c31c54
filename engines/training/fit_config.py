"""The configs of `edgeinfer train` and `edgeinfer distill`, without torch: `--help` and a launch file's check read
them, and importing torch takes seconds."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edgeinfer.core.config import refuse_bad
from edgeinfer.engines.models.paths import DEFAULT_POLICY, TRAINED_DIR, check_writable, trained_policy_path
from edgeinfer.engines.training.fit_data import SCHUNK_DATA, FitDataConfig


@dataclass(kw_only=True)
class FitConfig(FitDataConfig):
    """What every fit of a model to logs shares (training the target, distilling the drafter): the data, the
    seed, the optimizer's schedule and where the result may be written."""

    seed: int = 0  # seed of the initial weights and the batch order
    steps: int = 3000  # optimizer steps
    batch_size: int = 256  # windows per step
    lr: float = 2e-3  # peak learning rate (AdamW)
    # Allow --out inside the package's engines/weights/ (regenerating the shipped Schunk policies on purpose).
    overwrite_shipped: bool = False

    def __post_init__(self):
        super().__post_init__()
        refuse_bad(type(self).__name__, (("steps", self.steps, self.steps >= 1, ">= 1"),
                                         ("batch_size", self.batch_size, self.batch_size >= 1, ">= 1"),
                                         ("lr", self.lr, self.lr > 0, "> 0")))


@dataclass(kw_only=True)
class TrainConfig(FitConfig):
    """Training of the target policy (training units fit, held-out units measure)."""

    # The logs: a LeRobot dataset (each episode a unit), a folder of logs (each a unit) or one log (split by
    # time); any format `edgeinfer replay --log` reads.
    data: Path = SCHUNK_DATA
    # Manifest JSON of the policy, weights next to it (`.pt`) (None: out/policies/<data name>_target.json
    # under the working directory). Never engines/weights/ without --overwrite-shipped.
    out: Path | None = None
    n_bins: int = 64  # action token bins per joint (per coefficient and joint for --tokenizer dct)
    # The action tokens: step (one per chunk step and joint, step-major; engines/models/tokenizer.py) or dct (one per
    # DCT coefficient and joint, low frequency first, so that any verified prefix spans the whole horizon;
    # engines/models/dct_tokenizer.py).
    tokenizer: Literal["step", "dct"] = "step"
    # The transformer's size: small (d_model 64, 2 layers, 4 heads: 0.11 M parameters on the Schunk chunk, the
    # shipped schunk_target) or large (d_model 256, 4 layers, 8 heads: 3.2 M parameters, schunk_large_target).
    size: Literal["small", "large"] = "small"
    # Action steps per chunk (None: as many, up to 8, as keep H x joints within 48 tokens per 20 ms of chunk
    # step, so that a chunk decodes within one step wherever the Schunk chunk does; see engines/training/fit_data.py).
    horizon: int | None = None
    stride_ticks: int | None = None  # control ticks per action step (None: a step of about 20 ms, at least 1 tick)

    def __post_init__(self):
        super().__post_init__()
        self.out = Path(self.out) if self.out is not None else trained_policy_path(self.data)
        check_writable(self.out, self.overwrite_shipped)
        for name in ("horizon", "stride_ticks"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.horizon is not None and self.horizon > MAX_HORIZON:
            raise ValueError(f"TrainConfig.horizon must be <= {MAX_HORIZON} chunk steps, got {self.horizon} (a chunk "
                             "of horizon x joints tokens is decoded one target pass at a time)")


MAX_HORIZON = 64  # chunk steps a trained policy may have (the wire carries up to 256)


def warmup_fraction(steps: int) -> float:
    """OneCycleLR's warm-up: 5% of the steps, at least 3 (so that short smoke runs keep a valid schedule)."""
    return min(0.3, max(0.05, 3 / steps))


@dataclass(kw_only=True)
class DistillConfig(FitConfig):
    """Distillation of the learned drafter from the target (training units distil, held-out units measure)."""

    target: Path = DEFAULT_POLICY  # manifest JSON of the target distilled from (`edgeinfer train --out`)
    # The logs (as `edgeinfer train --data`; None: the data, reader options and split of the target's manifest,
    # the Schunk recordings for the shipped target).
    data: Path | None = None
    # Manifest JSON of the draft, weights next to it (`.pt`) (None: out/policies/<target name>_draft.json under
    # the working directory, the target's name without "_target"). Never engines/weights/ without
    # --overwrite-shipped.
    out: Path | None = None
    lr: float = 6e-3  # peak learning rate (AdamW)
    d_model: int = 64  # the student's width
    n_layers: int = 1  # the student's transformer blocks
    n_heads: int = 4  # the student's attention heads
    init_from_target: bool = True  # start from the target's first n_layers blocks, embeddings, ln_f and head
    # Start from this policy's weights instead (a manifest JSON of the student's shape, e.g. the shipped small
    # target engines/weights/schunk_target.json for a draft of the large one); its width, layers and heads
    # replace d_model, n_layers and n_heads, and it must share the target's tokenizer and normalisation.
    init_from: Path | None = None
    eval_k: int = 4  # drafts per target pass of the held-out acceptance metric

    def __post_init__(self):
        super().__post_init__()
        self.target = Path(self.target)
        self.init_from = Path(self.init_from) if self.init_from is not None else None
        name = self.target.stem.removesuffix("_target")
        self.out = Path(self.out) if self.out is not None else TRAINED_DIR / f"{name}_draft.json"
        check_writable(self.out, self.overwrite_shipped)
        if self.eval_k < 1:
            raise ValueError(f"DistillConfig.eval_k must be >= 1, got {self.eval_k}")
        from edgeinfer.engines.models.model import PolicyConfig  # torch: only when the command runs, not for --help

        PolicyConfig(d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads)  # raises on a bad shape


