"""FP8 (float8_e4m3fn) weights and activations with per-tensor scales, for the torch backend.

Static per-tensor scaling (the recipe of NVIDIA Transformer Engine's and torchao's float8 linears, with
scales fixed once instead of updated online):

    w_scale = amax|W| / 448                  from the weights
    x_scale = amax|x| / 448                  from the Linear's inputs over fp32 decoding of real observations
    y = (q(x / x_scale) @ q(W / w_scale)^T) * (x_scale * w_scale) + b

q rounds to e4m3fn (4 exponent bits, 3 mantissa bits, largest finite value 448, no infinities) after a
saturating clamp: a cast of a value beyond 448 gives NaN, and a real input may exceed the calibration amax.
On CUDA with compute capability >= 8.9 the product runs in torch._scaled_mm (fp8 tensor cores, fp32
accumulation, the bias added in its epilogue, bf16 output). Elsewhere the same quantised values are
multiplied in float32, the bias added and the result rounded to bf16, so FP8 quality can be measured and
gated on a CPU. Everything else runs in bf16.

torch._scaled_mm needs K and N multiples of 16, so a Linear whose in/out features are not (obs_proj: 18
inputs) stays in bf16.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448.0
_ALIGN = 16  # torch._scaled_mm: K and N multiples of 16 (M padded to it too where a release requires it)


def scale_of(amax: float) -> float:
    """Per-tensor scale amax / 448 (1.0 for an all-zero tensor, which any scale represents exactly)."""
    return float(amax) / E4M3_MAX if amax > 0 else 1.0


def quantise(x: torch.Tensor, scale: float | torch.Tensor) -> torch.Tensor:
    """x / scale, clamped to +-448 and rounded (to nearest even) to float8_e4m3fn; same shape as x."""
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def dequantise(q: torch.Tensor, scale: float | torch.Tensor) -> torch.Tensor:
    """float8 values times scale, as float32."""
    return q.float() * scale


def fits_fp8(linear: nn.Linear) -> bool:
    """True when torch._scaled_mm can run this Linear: in_features and out_features multiples of 16."""
    return linear.in_features % _ALIGN == 0 and linear.out_features % _ALIGN == 0


def scaled_mm_supported(device: torch.device | str) -> bool:
    """FP8 tensor cores reachable through torch._scaled_mm: a CUDA device of compute capability >= 8.9."""
    device = torch.device(device)
    if device.type != "cuda" or not hasattr(torch, "_scaled_mm"):
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


class Fp8Linear(nn.Module):
    """A Linear with e4m3 weights and statically scaled e4m3 inputs; input (..., K) any float, output bf16.

    linear: the fp32 source (not modified). x_amax: calibrated amax of its input. use_scaled_mm: run
    torch._scaled_mm (CUDA, capability >= 8.9) instead of the float32 emulation. Raises ValueError when
    the Linear does not fit (see fits_fp8).
    """

    def __init__(self, linear: nn.Linear, x_amax: float, use_scaled_mm: bool, device: torch.device | str = "cpu"):
        super().__init__()
        if not fits_fp8(linear):
            raise ValueError(f"Linear {linear.in_features}->{linear.out_features}: dims must be multiples of 16")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.use_scaled_mm = use_scaled_mm
        w = linear.weight.detach().float()
        x_scale, w_scale = scale_of(x_amax), scale_of(w.abs().max().item())
        f32 = dict(dtype=torch.float32, device=device)
        self.register_buffer("w_fp8", quantise(w, w_scale).to(device))  # (N, K) row-major
        # 0-dim float32 scales: _scaled_mm's tensor-wise form
        self.register_buffer("x_scale", torch.tensor(x_scale, **f32))
        self.register_buffer("w_scale", torch.tensor(w_scale, **f32))
        self.register_buffer("xw_scale", torch.tensor(x_scale * w_scale, **f32))
        b = linear.bias
        self.register_buffer("bias", None if b is None else b.detach().to(device, torch.bfloat16))
        # emulation: the e4m3 weight values (exact in float32) and the bias added before the bf16 rounding,
        # as _scaled_mm's epilogue adds it
        self.register_buffer("w_f32", None if use_scaled_mm else self.w_fp8.float())
        self.register_buffer("bias_f32", None if b is None or use_scaled_mm else self.bias.float())
        self.pad_m, self.fused_bias = False, b is not None
        if use_scaled_mm:
            self.pad_m, self.fused_bias = self._probe_scaled_mm()

    def _scaled_mm(self, x2: torch.Tensor, pad_m: bool, fused_bias: bool) -> torch.Tensor:
        """x2 (M, K) float32 -> (M, N) bf16 through torch._scaled_mm (bias not added unless fused_bias)."""
        m = x2.shape[0]
        pad = (-m) % _ALIGN if pad_m else 0  # zero rows quantise to zero and are sliced off
        xq = quantise(F.pad(x2, (0, 0, 0, pad)) if pad else x2, self.x_scale)
        bias = self.bias if fused_bias else None
        y = torch._scaled_mm(xq, self.w_fp8.t(), scale_a=self.x_scale, scale_b=self.w_scale, bias=bias,
                             out_dtype=torch.bfloat16)
        if isinstance(y, tuple):  # releases before 2.4 returned (out, amax)
            y = y[0]
        return y[:m] if pad else y

    def _probe_scaled_mm(self) -> tuple[bool, bool]:
        """(pad M to 16, bias in the epilogue): the first form this torch/GPU accepts for a 1-row input.
        Releases differ in what _scaled_mm takes; probing once here (outside any graph capture) keeps the
        hot path free of try/except. Raises RuntimeError naming every form's error when none works."""
        x = torch.zeros(1, self.in_features, dtype=torch.float32, device=self.w_fp8.device)
        errors = []
        has_bias = self.bias is not None
        for pad_m, fused in ((False, has_bias), (True, has_bias), (False, False), (True, False)):
            try:
                y = self._scaled_mm(x, pad_m, fused)
                if y.shape == (1, self.out_features) and y.dtype == torch.bfloat16:
                    return pad_m, fused
                errors.append(f"pad_m={pad_m} bias={fused}: got {tuple(y.shape)} {y.dtype}")
            except (RuntimeError, TypeError) as e:
                errors.append(f"pad_m={pad_m} bias={fused}: {type(e).__name__}: {e}")
        raise RuntimeError("torch._scaled_mm rejected every form tried: " + " | ".join(errors))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).float()  # (M, K)
        if self.use_scaled_mm:
            y = self._scaled_mm(x2, self.pad_m, self.fused_bias)
            if self.bias is not None and not self.fused_bias:
                y = y + self.bias
        else:
            y = (quantise(x2, self.x_scale).float() @ self.w_f32.t()) * self.xw_scale
            y = (y if self.bias_f32 is None else y + self.bias_f32).to(torch.bfloat16)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        mode = "scaled_mm" if self.use_scaled_mm else "emulated"
        return f"in_features={self.in_features}, out_features={self.out_features}, {mode}"


@torch.inference_mode()
def calibrate_input_amax(model: nn.Module, obs: torch.Tensor) -> dict[str, float]:
    """amax of every nn.Linear's input (by module name) over fp32 greedy decoding of obs (B, obs_dim).

    The decoding is target-only greedy over whole chunks (engines.evaluate.greedy_decode_batch), so every
    position and layer sees the activations it sees at run time.
    """
    from edgeinfer.engines.training.evaluate import greedy_decode_batch

    amax: dict[str, float] = {}
    hooks = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            def hook(_mod, args, name=name):
                amax[name] = max(amax.get(name, 0.0), args[0].detach().abs().max().item())
            hooks.append(mod.register_forward_pre_hook(hook))
    try:
        greedy_decode_batch(model, obs.float())
    finally:
        for h in hooks:
            h.remove()
    return amax


def quantise_linears(target: nn.Module, source: nn.Module, input_amax: dict[str, float], use_scaled_mm: bool,
                     device: torch.device | str) -> tuple[list[str], list[str]]:
    """Replace every fitting nn.Linear of `target` by an Fp8Linear built from the same-named fp32 Linear of
    `source` (so weights are quantised from fp32, not from a bf16 copy). Returns (quantised, kept) names;
    kept Linears (dims not multiples of 16, or never seen in calibration) stay as they are in `target`."""
    src = dict(source.named_modules())
    quantised, kept = [], []
    for name, mod in list(target.named_modules()):
        if not isinstance(mod, nn.Linear):
            continue
        if not fits_fp8(mod) or name not in input_amax:
            kept.append(name)
            continue
        parent_name, _, child = name.rpartition(".")
        parent = target.get_submodule(parent_name) if parent_name else target
        setattr(parent, child, Fp8Linear(src[name], input_amax[name], use_scaled_mm, device))
        quantised.append(name)
    return quantised, kept
