"""A llama-style decoder with a static KV cache, written from the papers; loads Hugging Face Llama weights.

    RMSNorm before attention and MLP, SwiGLU MLP       LLaMA (Touvron et al. 2023, arXiv 2302.13971)
    rotary position embeddings (RoPE) on q and k       RoFormer (Su et al. 2021, arXiv 2104.09864)
    grouped-query attention, n_kv_heads <= n_heads     GQA (Ainslie et al. 2023, arXiv 2305.13245)

It shares no code with engines/models/model.py. It implements the "tokens" kind of the bring-your-own-model
protocol (engines/models/model_protocol.py): positions 0.. hold plain token ids, logits at position p predict the
token at p + 1, and the KV cache is preallocated at max_seq_len and written by position (gpt-fast), so a
rejected draft needs no rollback work.

RoPE rotates each pair of adjacent features (x[2i], x[2i+1]) of a head by the angle pos * theta_i, theta_i =
rope_theta^(-2i / head_dim), as in the paper and Meta's reference code. Hugging Face checkpoints store q
and k projections with their rows permuted so that pair i is (x[i], x[i + head_dim/2]) ("rotate_half");
from_hf_state_dict undoes that permutation (and to_hf_state_dict redoes it), so the same weights compute
the same function in both implementations.
"""
from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LlamaConfig:
    """Shape of the decoder. d_ff: SwiGLU hidden width. norm_eps: RMSNorm epsilon. max_seq_len: positions in
    the static KV cache (prompt + generated tokens)."""

    vocab_size: int = 64
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    d_ff: int = 344
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    tie_embeddings: bool = False

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"LlamaConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(f"LlamaConfig: d_model={self.d_model} must be n_heads={self.n_heads} x an even head_dim")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"LlamaConfig: n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_hf(cls, hf_config) -> "LlamaConfig":
        """The same shape as a transformers LlamaConfig. Raises ValueError for what this decoder does not
        implement: biases, an activation other than SiLU, RoPE scaling, a head_dim other than d/n_heads."""
        c = hf_config
        # transformers 5 keeps theta and the RoPE type in rope_parameters; 4.x in rope_theta and rope_scaling
        rope = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
        theta = rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))
        unsupported = {
            "attention_bias": getattr(c, "attention_bias", False),
            "mlp_bias": getattr(c, "mlp_bias", False),
            "hidden_act != silu": c.hidden_act != "silu",
            "rope_type != default": rope.get("rope_type", rope.get("type", "default")) != "default",
            "head_dim != hidden/heads": getattr(c, "head_dim", None) not in (None, c.hidden_size
                                                                             // c.num_attention_heads),
        }
        bad = [name for name, on in unsupported.items() if on]
        if bad:
            raise ValueError(f"Hugging Face config not supported by engines/models/llama.py: {bad}")
        return cls(vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
                   n_heads=c.num_attention_heads, n_kv_heads=c.num_key_value_heads or c.num_attention_heads,
                   d_ff=c.intermediate_size, max_seq_len=c.max_position_embeddings, rope_theta=float(theta),
                   norm_eps=c.rms_norm_eps, tie_embeddings=bool(c.tie_word_embeddings))

    def to_hf(self):
        """A transformers LlamaConfig of this shape (imports transformers)."""
        from transformers import LlamaConfig as HfLlamaConfig

        return HfLlamaConfig(vocab_size=self.vocab_size, hidden_size=self.d_model, intermediate_size=self.d_ff,
                             num_hidden_layers=self.n_layers, num_attention_heads=self.n_heads,
                             num_key_value_heads=self.n_kv_heads, max_position_embeddings=self.max_seq_len,
                             rms_norm_eps=self.norm_eps, rope_parameters={"rope_type": "default",
                                                                          "rope_theta": self.rope_theta},
                             tie_word_embeddings=self.tie_embeddings, bos_token_id=None, eos_token_id=None,
                             pad_token_id=None)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * g over the last axis (Zhang & Sennrich 2019), normalised in float32."""

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def rope_table(cfg: LlamaConfig) -> torch.Tensor:
    """(cos, sin) of angle pos * theta_j, theta_j = rope_theta^(-2j/head_dim), as (max_seq_len, head_dim/2, 2)
    float32 (real pairs, not complex: Module.to(dtype) would drop a complex buffer's imaginary part). The
    angles are evaluated in float32 by the same operations as transformers' LlamaRotaryEmbedding, so the
    two agree bit for bit."""
    theta = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim)
    angle = torch.arange(cfg.max_seq_len, dtype=torch.float32)[:, None] * theta[None, :]
    return torch.stack([angle.cos(), angle.sin()], dim=-1)


def apply_rope(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """Rotate each adjacent feature pair (x[2j], x[2j+1]) of x (B, T, heads, head_dim) by its position's angle:
    the pair as the complex number x[2j] + i x[2j+1] times rot (T, 1, head_dim/2),
    the complex form of the rotation in RoFormer."""
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
    return torch.view_as_real(pairs * rot).flatten(-2).to(x.dtype)


class Layer(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.wqkv = nn.Linear(cfg.d_model, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.d_ff = cfg.d_ff
        self.w_gate_up = nn.Linear(cfg.d_model, 2 * cfg.d_ff, bias=False)  # [gate; up] in one matmul
        self.w_down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, rot: torch.Tensor, input_pos: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, k_cache: torch.Tensor | None = None,
                v_cache: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, d); rot (T, 1, hd/2): the RoPE rotations of the T positions. Without a cache: causal
        attention over the T positions. With one (B, n_kv, S, hd): k, v written at input_pos (T,); mask (T, S)
        additive, -inf past each query's position."""
        b, t, _ = x.shape
        qkv = self.wqkv(self.attn_norm(x)).view(b, t, self.n_heads + 2 * self.n_kv, self.hd)
        qk = apply_rope(qkv[:, :, :self.n_heads + self.n_kv], rot)  # q and k heads rotated in one go
        q = qk[:, :, :self.n_heads].transpose(1, 2)  # (B, n_heads, T, hd)
        k = qk[:, :, self.n_heads:].transpose(1, 2)  # (B, n_kv, T, hd)
        v = qkv[:, :, self.n_heads + self.n_kv:].transpose(1, 2)
        if k_cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            k_cache.index_copy_(2, input_pos, k)
            v_cache.index_copy_(2, input_pos, v)
            y = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask, enable_gqa=True)
        x = x + self.wo(y.transpose(1, 2).reshape(b, t, -1))
        gate, up = self.w_gate_up(self.mlp_norm(x)).split(self.d_ff, dim=-1)
        return x + self.w_down(F.silu(gate) * up)  # SwiGLU (Shazeer 2020)


class Llama(nn.Module):
    """Llama-style decoder over token ids. Implements engines/models/model_protocol.py, prefix kind "tokens",
    static cache.

    forward(tokens (B, T) int64) -> logits (B, T, vocab): cache-free causal pass over positions 0..T-1.
    step(prefix, tokens (B, T) int64, input_pos (T,) int64, k_cache, v_cache) -> logits (B, T, vocab):
      cached pass over ascending contiguous positions input_pos; prefix must be None (the prompt is fed as
      tokens). k_cache, v_cache (n_layers, B, n_kv_heads, max_seq_len, head_dim) from empty_cache, written
      in place by position.
    """

    prefix_kind = "tokens"
    cache_kind = "static"

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.tok_emb.weight
        self.register_buffer("rope", rope_table(cfg), persistent=False)
        # row p: 0 at positions <= p, -inf after: an additive mask built once, not per layer (max_seq_len^2 floats)
        causal = torch.full((cfg.max_seq_len, cfg.max_seq_len), float("-inf")).triu(1)
        self.register_buffer("causal_bias", causal, persistent=False)
        for name, p in self.named_parameters():  # N(0, 0.02) as LLaMA-family initialisations; norms at 1
            if not name.endswith("norm.weight"):
                nn.init.normal_(p, std=0.02)

    def empty_cache(self, batch: int = 1, dtype: torch.dtype = torch.float32, device=None):
        """(k, v), each (n_layers, batch, n_kv_heads, max_seq_len, head_dim), zeros."""
        c = self.cfg
        shape = (c.n_layers, batch, c.n_kv_heads, c.max_seq_len, c.head_dim)
        return torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        x = self.tok_emb(tokens)
        rot = torch.view_as_complex(self.rope[:t, None].float())
        for layer in self.layers:
            x = layer(x, rot)
        return self.head(self.norm(x))

    def step(self, prefix: None, tokens: torch.Tensor, input_pos: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor) -> torch.Tensor:
        if prefix is not None:
            raise ValueError("Llama.step: prefix must be None (prefix kind 'tokens': feed the prompt as tokens)")
        x = self.tok_emb(tokens)
        rot = torch.view_as_complex(self.rope[input_pos, None].float())  # (T, 1, hd/2)
        # cache entries past a query's position are stale or empty: masked, so rollback is free
        mask = self.causal_bias[input_pos]  # (T, max_seq_len)
        for i, layer in enumerate(self.layers):
            x = layer(x, rot, input_pos, mask, k_cache[i], v_cache[i])
        return self.head(self.norm(x))

    # --- Hugging Face weights ----------------------------------------------------------------------------

    @classmethod
    def from_hf(cls, hf_model, max_seq_len: int | None = None) -> "Llama":
        """The same weights as a transformers LlamaForCausalLM (fp32 copy, eval mode). max_seq_len: the
        static cache's length (default: the model's max_position_embeddings). Raises ValueError for a
        config this decoder does not implement (LlamaConfig.from_hf)."""
        cfg = LlamaConfig.from_hf(hf_model.config)
        if max_seq_len is not None:
            cfg = dataclasses.replace(cfg, max_seq_len=max_seq_len)
        return cls.from_hf_state_dict(hf_model.state_dict(), cfg)

    @classmethod
    def from_hf_state_dict(cls, state: dict[str, torch.Tensor], cfg: LlamaConfig) -> "Llama":
        """Load a LlamaForCausalLM state dict (names model.layers.{i}.self_attn.q_proj.weight, ...)."""
        model = cls(cfg)
        hd = cfg.head_dim
        ours = {"tok_emb.weight": state["model.embed_tokens.weight"], "norm.weight": state["model.norm.weight"],
                "head.weight": state.get("lm_head.weight", state["model.embed_tokens.weight"])}
        for i in range(cfg.n_layers):
            p = f"model.layers.{i}."
            q = _pairs_from_half(state[p + "self_attn.q_proj.weight"], cfg.n_heads, hd)
            k = _pairs_from_half(state[p + "self_attn.k_proj.weight"], cfg.n_kv_heads, hd)
            ours |= {f"layers.{i}.attn_norm.weight": state[p + "input_layernorm.weight"],
                     f"layers.{i}.wqkv.weight": torch.cat([q, k, state[p + "self_attn.v_proj.weight"]]),
                     f"layers.{i}.wo.weight": state[p + "self_attn.o_proj.weight"],
                     f"layers.{i}.mlp_norm.weight": state[p + "post_attention_layernorm.weight"],
                     f"layers.{i}.w_gate_up.weight": torch.cat([state[p + "mlp.gate_proj.weight"],
                                                                state[p + "mlp.up_proj.weight"]]),
                     f"layers.{i}.w_down.weight": state[p + "mlp.down_proj.weight"]}
        model.load_state_dict({k: v.detach().float() for k, v in ours.items()})
        return model.eval()

    def to_hf_state_dict(self) -> dict[str, torch.Tensor]:
        """This model's weights under LlamaForCausalLM names (the inverse of from_hf_state_dict)."""
        c, hd = self.cfg, self.cfg.head_dim
        s = self.state_dict()
        out = {"model.embed_tokens.weight": s["tok_emb.weight"], "model.norm.weight": s["norm.weight"],
               "lm_head.weight": s["head.weight"]}
        for i in range(c.n_layers):
            q, k, v = s[f"layers.{i}.wqkv.weight"].split([c.n_heads * hd, c.n_kv_heads * hd, c.n_kv_heads * hd])
            gate, up = s[f"layers.{i}.w_gate_up.weight"].split(c.d_ff)
            p = f"model.layers.{i}."
            out |= {p + "input_layernorm.weight": s[f"layers.{i}.attn_norm.weight"],
                    p + "self_attn.q_proj.weight": _half_from_pairs(q, c.n_heads, hd),
                    p + "self_attn.k_proj.weight": _half_from_pairs(k, c.n_kv_heads, hd),
                    p + "self_attn.v_proj.weight": v, p + "self_attn.o_proj.weight": s[f"layers.{i}.wo.weight"],
                    p + "post_attention_layernorm.weight": s[f"layers.{i}.mlp_norm.weight"],
                    p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
                    p + "mlp.down_proj.weight": s[f"layers.{i}.w_down.weight"]}
        return {k: v.clone() for k, v in out.items()}

    def to_hf(self):
        """A transformers LlamaForCausalLM with these weights, fp32, eval mode (imports transformers)."""
        from transformers import LlamaForCausalLM

        hf = LlamaForCausalLM(self.cfg.to_hf())
        hf.load_state_dict(self.to_hf_state_dict(), strict=not self.cfg.tie_embeddings)
        return hf.float().eval()


def early_exit(model: Llama, n_layers: int = 1) -> Llama:
    """A draft from the target's first n_layers layers with its embeddings, final norm and head (self-
    speculation, as LayerSkip, Elhoushi et al. 2024, arXiv 2404.16710). Raises ValueError unless
    1 <= n_layers <= the target's."""
    if not 1 <= n_layers <= model.cfg.n_layers:
        raise ValueError(f"early_exit: n_layers must be in 1..{model.cfg.n_layers}, got {n_layers}")
    cfg = LlamaConfig(**{**model.cfg.to_dict(), "n_layers": n_layers})
    draft = Llama(cfg)
    draft.load_state_dict({k: v for k, v in model.state_dict().items()
                           if not k.startswith("layers.") or int(k.split(".")[1]) < n_layers})
    return draft.eval()


def _pairs_from_half(w: torch.Tensor, n_heads: int, hd: int) -> torch.Tensor:
    """Rows of a q/k projection from HF's rotate-half order (pair i = rows i, i + hd/2 of a head) to adjacent
    pairs (rows 2i, 2i+1): the inverse of the permutation in transformers' convert_llama_weights_to_hf."""
    return w.reshape(n_heads, 2, hd // 2, -1).transpose(1, 2).reshape(n_heads * hd, -1)


def _half_from_pairs(w: torch.Tensor, n_heads: int, hd: int) -> torch.Tensor:
    return w.reshape(n_heads, hd // 2, 2, -1).transpose(1, 2).reshape(n_heads * hd, -1)
