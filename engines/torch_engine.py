"""PyTorch backend: the target in eager mode on CPU or CUDA, fp32 or bf16.

The static KV cache (n_layers, 1, n_heads, seq_len, head_dim) is written in place by position (gpt-fast).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from edgeinfer.engines.model import ActionTransformer

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class TorchEngine:
    """Engine (see engines/engine.py) running an ActionTransformer with torch.

    model: the fp32 target (not modified: the engine holds its own copy). precision: fp32 | bf16.
    device: "cpu" or "cuda[:i]". Raises ValueError for a precision this backend does not build.
    """

    backend = "torch"

    def __init__(self, model: ActionTransformer, precision: str = "fp32", device: str = "cpu"):
        if precision not in DTYPES:
            raise ValueError(f"torch backend: precision must be one of {sorted(DTYPES)}, got {precision!r}")
        self.precision, self.device, self.cfg = precision, device, model.cfg
        self.dtype = DTYPES[precision]
        self.model = ActionTransformer(model.cfg).to(device, self.dtype).eval()
        self.model.load_state_dict(model.state_dict())
        self.k, self.v = self.model.empty_cache(1, self.dtype, device)
        self._obs0 = torch.zeros(1, model.cfg.obs_dim, dtype=self.dtype, device=device)

    @classmethod
    def from_policy(cls, policy, precision: str = "fp32", device: str = "cpu", threads: int = 1) -> "TorchEngine":
        torch.set_num_threads(threads)
        return cls(policy.model, precision, device)

    @torch.inference_mode()
    def forward(self, obs: np.ndarray | None, tokens: Sequence[int], start: int) -> np.ndarray:
        if start == 0:
            obs_t = torch.as_tensor(obs, dtype=torch.float32).to(self.device, self.dtype).view(1, -1)
            ids = [0, *tokens]
        else:
            obs_t, ids = self._obs0, list(tokens)
        tok = torch.tensor([ids], dtype=torch.long, device=self.device)
        pos = torch.arange(start, start + len(ids), device=self.device)
        logits = self.model.step(obs_t, tok, pos, self.k, self.v)
        return logits[0].float().cpu().numpy()

    def rollback(self, n: int) -> None:
        """Nothing to do: the cache is written by position (see engines/engine.py)."""
