"""PyTorch batched target (core/protocols.BatchedEngine): one eager forward over every KV-cache slot per call.

The static KV cache has a slot dimension, (n_layers, n_slots, n_heads, seq_len + max_pass, head_dim), written by
position (rollback is a no-op, as in every engine here). Each call runs the fixed-shape steps (n_slots, width) of
engines/backends/slot_rows.py through engines/backends/batched_step.py, so a pass's logits are bit-identical whichever
other passes share the call (tests/test_batched_engines.py). They are not bit-identical to TorchEngine's batch-1 passes
(another shape, so other rounding: differences of ~1e-6), so a near-tie token can differ from a single-sequence engine.
Device-agnostic (device "cpu" or "cuda[:i]"); tested on CPU only.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from edgeinfer.core.protocols import Pass
from edgeinfer.engines.backends.batched_step import batched_step
from edgeinfer.engines.backends.slot_rows import SlotRows
from edgeinfer.engines.models.model import ActionTransformer

DEFAULT_MAX_PASS = 9  # places per slot and call: a verify pass of k = 8 drafts (FleetPolicy.k_max) in one round
DEFAULT_WIDTHS = (1,)  # step widths besides max_pass: decode passes (T = 1) run in (n_slots, 1)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class TorchBatchedEngine:
    """BatchedEngine running an ActionTransformer with torch over n_slots KV-cache slots.

    model: the fp32 target (not modified: the engine holds its own copy). precision: fp32 | bf16 (logits come back
    float32). device: "cpu" or "cuda[:i]". max_pass: places per slot per step; longer passes run in rounds.
    widths: the step widths besides max_pass (engines/backends/slot_rows.py). A step costs the same whatever the number
    of passes in it (the fixed shape): pick n_slots to fit the fleet.
    Raises ValueError for an unknown precision, n_slots/max_pass < 1 or a width out of range; forward_batch raises
    ValueError for an invalid pass."""

    backend = "torch"

    def __init__(self, model: ActionTransformer, n_slots: int, precision: str = "fp32", device: str = "cpu", *,
                 max_pass: int = DEFAULT_MAX_PASS, widths: Sequence[int] = DEFAULT_WIDTHS):
        if precision not in DTYPES:
            raise ValueError(f"torch batched: precision must be one of {sorted(DTYPES)}, got {precision!r}")
        self.precision, self.device, self.cfg, self.n_slots = precision, device, model.cfg, n_slots
        self.rows = r = SlotRows(model.cfg, n_slots, max_pass, widths)
        self._dev, self._dtype = torch.device(device), DTYPES[precision]
        self.model = ActionTransformer(model.cfg).to(self._dev, self._dtype).eval()
        self.model.load_state_dict(model.state_dict())
        c = model.cfg
        shape = (c.n_layers, n_slots, c.n_heads, self.rows.cache_len, c.d_model // c.n_heads)
        self.k = torch.zeros(shape, dtype=self._dtype, device=self._dev)
        self.v = torch.zeros(shape, dtype=self._dtype, device=self._dev)
        self._obs = torch.from_numpy(r.obs)
        self._host = {w: [torch.from_numpy(a[w]) for a in (r.tokens, r.pos, r.write)] for w in r.widths}

    @classmethod
    def from_policy(cls, policy, n_slots: int, threads: int = 1, *, precision: str = "fp32", device: str = "cpu",
                    max_pass: int = DEFAULT_MAX_PASS, widths: Sequence[int] = DEFAULT_WIDTHS) -> "TorchBatchedEngine":
        """Engine for policy.model on `threads` torch intra-op threads (a process-wide torch setting)."""
        torch.set_num_threads(threads)
        return cls(policy.model, n_slots, precision, device, max_pass=max_pass, widths=widths)

    def forward_batch(self, passes: Sequence[Pass]) -> list[np.ndarray]:
        """Logits (T_i, n_bins) float32 per pass, in order (core/protocols.BatchedEngine)."""
        return self.rows.forward(passes, self._step)

    @torch.inference_mode()
    def _step(self, width: int) -> np.ndarray:
        obs = self._obs.to(self._dev, self._dtype)
        tokens, pos, write = (t.to(self._dev) for t in self._host[width])
        logits = batched_step(self.model, obs, tokens, pos, write, self.k, self.v)
        return logits.float().cpu().numpy()
