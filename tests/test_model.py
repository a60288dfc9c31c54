"""KV-cache correctness: cached decoding over arbitrary pass sizes and rollbacks equals a cache-free forward."""
import torch

from edgeinfer.engines.models.model import ActionTransformer, PolicyConfig


def test_cached_passes_with_rollbacks_match_full_forward():
    torch.manual_seed(0)
    cfg = PolicyConfig(horizon=4, n_joints=3, obs_dim=9, n_bins=16, d_model=32)
    model = ActionTransformer(cfg).eval()
    obs = torch.randn(1, cfg.obs_dim)
    tokens = torch.randint(0, cfg.n_bins, (1, cfg.n_tokens))
    with torch.inference_mode():
        ref = model(obs, tokens[:, :-1])  # (1, seq_len - 1 ... ) cache-free causal forward
        k_cache, v_cache = model.empty_cache(1)
        step = lambda tok, pos: model.step(obs, tok, pos, k_cache, v_cache)  # noqa: E731
        torch.testing.assert_close(step(tokens[:, :1], torch.tensor([0])), ref[:, :1], rtol=1e-4, atol=1e-5)
        pos = 1
        gen = torch.Generator().manual_seed(1)
        while pos < cfg.n_tokens:
            k = int(torch.randint(1, 6, (1,), generator=gen))
            k = min(k, cfg.n_tokens - pos)
            # garbage first: a rejected speculative pass that writes positions pos..pos+k-1
            junk = torch.randint(0, cfg.n_bins, (1, k), generator=gen)
            step(junk, torch.arange(pos, pos + k))
            # then the real tokens overwrite the same positions (rollback by position)
            out = step(tokens[:, pos - 1:pos - 1 + k], torch.arange(pos, pos + k))
            torch.testing.assert_close(out, ref[:, pos:pos + k], rtol=1e-4, atol=1e-5)
            pos += k
