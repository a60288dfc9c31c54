"""PyTorch backend: the target on CPU or CUDA, in fp32, bf16 or fp8 (engines/backends/fp8.py).

CPU runs eager; fp32 on CPU is the reference every other engine is compared with. On CUDA each pass
length T = 1..max_pass (default 17: verify of up to k = 16 drafts plus the last committed token) is
captured once in a CUDA graph over a static KV cache and static inputs. The prefill is the T = 1 graph at
position 0: model.step embeds the observation wherever input_pos == 0, so one graph serves both. Longer
passes run eagerly through the same code. Inputs travel in one host->device copy per pass, a pinned
float32 buffer [obs (obs_dim), start, tokens (T)] unpacked on the device (token ids and positions are
small integers, exact in float32). `cuda_graphs=False` runs that same code eagerly, so graphs on and off
launch the same kernels and decode the same tokens.

The static KV cache (n_layers, 1, n_heads, seq_len, head_dim) is written in place by position (gpt-fast).
"""
from __future__ import annotations

import sys
from typing import Sequence

import numpy as np
import torch

from edgeinfer.engines.backends.fp8 import calibrate_input_amax, quantise_linears, scaled_mm_supported
from edgeinfer.engines.models.model import ActionTransformer

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp8": torch.bfloat16}  # fp8: non-fp8 parts in bf16
DEFAULT_MAX_PASS = 17
_WARMUP_RUNS = 3  # eager runs on a side stream before each capture (PyTorch CUDA graphs docs)


class TorchEngine:
    """Engine (see engines/backends/engine.py) running an ActionTransformer with torch.

    model: the fp32 target (not modified: the engine holds its own copy). precision: fp32 | bf16 | fp8.
    device: "cpu" or "cuda[:i]". cuda_graphs: capture passes of 1..max_pass tokens (CUDA only).
    compile: run single-token passes through torch.compile (slow first call; measured 0.55x eager per token
    on a 2-core CPU). fp32 only: see the ValueError below.
    input_amax: fp8 only, the calibrated amax of each nn.Linear's input by module name
    (fp8.calibrate_input_amax; from_policy computes it on real observations).
    Logits come back as float32 whatever the precision.

    Raises ValueError for an unknown precision, or fp8 without input_amax. Two GPU failures do not raise
    but warn and fall back, saying so in attributes: a failed graph capture runs eagerly (`cuda_graphs`
    False, the cause in `graph_error`); a torch._scaled_mm that refuses every form emulates FP8
    (`fp8_kernel` "emulated (scaled_mm failed: ...)"; otherwise "scaled_mm" or "emulated").
    """

    backend = "torch"

    def __init__(self, model: ActionTransformer, precision: str = "fp32", device: str = "cpu", *,
                 cuda_graphs: bool = True, max_pass: int = DEFAULT_MAX_PASS,
                 input_amax: dict[str, float] | None = None, compile: bool = False):
        if precision not in DTYPES:
            raise ValueError(f"torch backend: precision must be one of {sorted(DTYPES)}, got {precision!r}")
        if compile and precision != "fp32":
            # compiled single-token passes and eager verify passes round differently in bf16/fp8, which breaks
            # speculative == greedy exactness (measured on an H200: 0.60 of chunks identical in bf16, 0.04 in fp8)
            raise ValueError(f"torch backend: compile is fp32 only (got {precision!r}): in reduced precision the "
                             "compiled decode pass and the eager verify passes disagree on near-tie tokens")
        if precision == "fp8" and input_amax is None:
            raise ValueError("torch backend: fp8 needs input_amax (see TorchEngine.from_policy)")
        self.precision, self.device, self.cfg = precision, device, model.cfg
        self.dtype = DTYPES[precision]
        self._dev = torch.device(device)
        self.fp8_linears: list[str] = []
        self.fp8_kernel: str | None = None
        self.model = self._copy(model)
        if precision == "fp8":
            self.fp8_kernel = "scaled_mm" if scaled_mm_supported(self._dev) else "emulated"
            try:
                self.fp8_linears, _ = quantise_linears(self.model, model, input_amax, self.fp8_kernel == "scaled_mm",
                                                       self._dev)
            except RuntimeError as e:  # _scaled_mm refused every form (fp8.Fp8Linear._probe_scaled_mm)
                print(f"WARNING: torch engine fp8 on {device}: {e}; emulating FP8 instead", file=sys.stderr)
                self.fp8_kernel = f"emulated (scaled_mm failed: {e})"
                self.model = self._copy(model)
                self.fp8_linears, _ = quantise_linears(self.model, model, input_amax, False, self._dev)
        self.k, self.v = self.model.empty_cache(1, self.dtype, self._dev)
        # compile: single-token passes (decode, prefill, the one-graph chunk) through torch.compile (Inductor
        # fuses the ~50 small kernels of a pass); compiled on first use, once (static shapes)
        self.compiled = bool(compile)
        self._step1 = torch.compile(self.model.step, dynamic=False) if compile else self.model.step
        self._pos1 = [torch.tensor([p], device=self._dev) for p in range(model.cfg.seq_len)]
        self._obs0 = torch.zeros(1, model.cfg.obs_dim, dtype=self.dtype, device=self._dev)
        self.cuda_graphs = bool(cuda_graphs) and self._dev.type == "cuda"
        self.graph_error: str | None = None
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._chunk_graph: tuple[torch.cuda.CUDAGraph, torch.Tensor] | None = None  # greedy_chunk, on first use
        if self._dev.type == "cuda":
            self._setup_cuda(max_pass)

    def _copy(self, model: ActionTransformer) -> ActionTransformer:
        copy = ActionTransformer(model.cfg).to(self._dev, self.dtype).eval()
        copy.load_state_dict(model.state_dict())
        return copy

    @classmethod
    def from_policy(cls, policy, precision: str = "fp32", device: str = "cpu", threads: int = 1, *,
                    cuda_graphs: bool = True, max_pass: int = DEFAULT_MAX_PASS, data_dir=None,
                    compile: bool = False) -> "TorchEngine":
        """Engine for policy.model. fp8 calibrates activation scales first, on CPU in fp32, over greedy
        decoding of 512 real held-out observations (engines/backends/calibration.py; data_dir as there)."""
        torch.set_num_threads(threads)
        input_amax = None
        if precision == "fp8":
            from edgeinfer.engines.backends.calibration import calibration_features

            obs = torch.as_tensor(calibration_features(policy, data_dir))
            input_amax = calibrate_input_amax(policy.model, obs)
        return cls(policy.model, precision, device, cuda_graphs=cuda_graphs, max_pass=max_pass,
                   input_amax=input_amax, compile=compile)

    def forward(self, obs: np.ndarray | None, tokens: Sequence[int], start: int) -> np.ndarray:
        if self._dev.type == "cuda":
            return self._forward_staged(obs, tokens, start)
        return self._forward_cpu(obs, tokens, start)

    def rollback(self, n: int) -> None:
        """Nothing to do: the cache is written by position (see engines/backends/engine.py)."""

    def greedy_chunk(self, obs: np.ndarray) -> list[int]:
        """Target-only greedy decoding of a whole chunk, obs (obs_dim,) float32 -> n_tokens ints.

        On CUDA with graphs, the whole chunk is ONE graph replay: each pass's argmax stays on the device and
        feeds the next pass, and one copy brings the tokens back (captured on first use). The same tokens as
        a pass-by-pass decode (argmax of the same logits, first index on ties). Elsewhere: pass by pass."""
        if not self.cuda_graphs:
            from edgeinfer.engines.backends.quality import greedy_chunk

            return greedy_chunk(self, obs, self.cfg.n_tokens)
        with torch.inference_mode():
            if self._chunk_graph is None:
                self._chunk_graph = self._capture(0)
            od = self.cfg.obs_dim
            self._host_np[:od] = obs
            self._inputs[:od].copy_(self._host[:od], non_blocking=True)
            graph, tokens = self._chunk_graph
            graph.replay()
            return tokens.tolist()

    # --- CPU: eager, one call of model.step per pass --------------------------------------------------

    @torch.inference_mode()
    def _forward_cpu(self, obs, tokens, start):
        if start == 0:
            obs_t = torch.as_tensor(obs, dtype=torch.float32).to(self._dev, self.dtype).view(1, -1)
            ids = [0, *tokens]
        else:
            obs_t, ids = self._obs0, list(tokens)
        tok = torch.tensor([ids], dtype=torch.long, device=self._dev)
        pos = torch.arange(start, start + len(ids), device=self._dev)
        step = self._step1 if len(ids) == 1 else self.model.step
        logits = step(obs_t, tok, self._pos1[start] if len(ids) == 1 else pos, self.k, self.v)
        return logits[0].float().cpu().numpy()

    # --- CUDA: staged inputs, one graph per pass length ------------------------------------------------

    def _setup_cuda(self, max_pass: int) -> None:
        self._setup_staging()
        if not self.cuda_graphs:
            return
        try:
            with torch.cuda.device(self._dev), torch.inference_mode():
                for t in range(1, min(max_pass, self.cfg.seq_len) + 1):
                    self._graphs[t] = self._capture(t)
                self.k.zero_()  # warm-up and capture wrote garbage rows; harmless (by position), but tidy
                self.v.zero_()
                torch.cuda.synchronize(self._dev)
        except Exception as e:  # keep the engine usable (eager) and say why
            self.graph_error = f"{type(e).__name__}: {e}"
            self.cuda_graphs, self._graphs = False, {}
            print(f"WARNING: torch engine {self.precision} on {self.device}: CUDA graph capture failed, "
                  f"running eagerly: {self.graph_error}", file=sys.stderr)

    def _setup_staging(self) -> None:
        """Host and device input buffers [obs, start, tokens], room for the longest possible pass."""
        c = self.cfg
        n = c.obs_dim + 1 + c.seq_len
        self._host = torch.zeros(n, dtype=torch.float32, pin_memory=self._dev.type == "cuda")
        self._host_np = self._host.numpy()  # writes from numpy land in the (pinned) host buffer
        self._inputs = torch.zeros(n, dtype=torch.float32, device=self._dev)
        self._arange = torch.arange(c.seq_len, device=self._dev)

    def _step(self, t: int) -> torch.Tensor:
        """One pass of t tokens read from the device input buffer -> logits (1, t, n_bins) float32."""
        od = self.cfg.obs_dim
        obs = self._inputs[:od].view(1, od).to(self.dtype)
        pos = self._inputs[od].long() + self._arange[:t]
        tok = self._inputs[od + 1:od + 1 + t].long().view(1, t)
        return (self._step1 if t == 1 else self.model.step)(obs, tok, pos, self.k, self.v).float()

    def _greedy_on_device(self) -> torch.Tensor:
        """The whole target-only greedy chunk from the observation in the device input buffer, tokens kept
        on the device between passes -> tokens (n_tokens,) int64."""
        od, n = self.cfg.obs_dim, self.cfg.n_tokens
        obs = self._inputs[:od].view(1, od).to(self.dtype)
        tok = torch.zeros(1, 1, dtype=torch.long, device=self._dev)
        out = []
        for p in range(n):
            tok = self._step1(obs, tok, self._pos1[p], self.k, self.v)[:, -1].argmax(-1, keepdim=True)
            out.append(tok)
        return torch.cat(out, dim=1)[0]

    def _capture(self, t: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Capture a pass of t tokens, or (t = 0) the whole greedy chunk (_greedy_on_device)."""
        fn = self._greedy_on_device if t == 0 else lambda: self._step(t)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(_WARMUP_RUNS):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
        return graph, out

    @torch.inference_mode()
    def _forward_staged(self, obs, tokens, start):
        c = self.cfg
        ids = [0, *tokens] if start == 0 else list(tokens)
        t = len(ids)
        # an out-of-range index would be a device-side assert, which poisons the CUDA context for good
        if not (t >= 1 and start >= 0 and start + t <= c.seq_len):
            raise ValueError(f"pass of {t} tokens at position {start} does not fit seq_len={c.seq_len}")
        if min(ids) < 0 or max(ids) >= c.n_bins:
            raise ValueError(f"token ids must be in 0..{c.n_bins - 1}, got {ids}")
        od, h = c.obs_dim, self._host_np
        if start == 0:
            h[:od] = obs  # later passes leave it: model.step ignores obs away from position 0
        h[od] = start
        h[od + 1:od + 1 + t] = ids
        # the previous pass's .cpu() synchronised, so the pinned buffer is free to overwrite and copy
        self._inputs[:od + 1 + t].copy_(self._host[:od + 1 + t], non_blocking=True)
        if t in self._graphs:
            graph, out = self._graphs[t]
            graph.replay()
        else:
            out = self._step(t)
        return out[0].cpu().numpy()
