"""The hand-written decoder against transformers' LlamaForCausalLM with the same weights."""

from __future__ import annotations

import torch

from whitney.local.engine import exact
from whitney.local.engine.model import CONFIGS, KeyValues, KVCache, Llama, init_weights

from .helpers import hf_llama


def test_init_is_fixed_and_scaled() -> None:
    cfg = CONFIGS["local/tiny"]
    w1, w2 = init_weights(cfg), init_weights(cfg)
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    assert abs(w1["model.layers.0.mlp.up_proj.weight"].std().item() - 0.02) < 1e-3
    assert abs(w1["lm_head.weight"].std().item() - 128**-0.5) < 5e-3
    assert torch.equal(w1["model.norm.weight"], torch.ones(128))
    assert w1["model.embed_tokens.weight"].shape == (260, 128)
    assert len([k for k in w1 if k.endswith("q_proj.weight")]) == 4
    small = init_weights(CONFIGS["local/small"])
    assert small["model.layers.3.mlp.down_proj.weight"].shape == (256, 1024)


def test_logits_match_transformers_including_right_padded_batch() -> None:
    cfg = CONFIGS["local/tiny"]
    weights = init_weights(cfg)
    reference = hf_llama(cfg, weights)
    gen = torch.Generator().manual_seed(3)
    lengths = [17, 9, 4]
    ids = torch.randint(0, 260, (3, 17), generator=gen)
    mask = (torch.arange(17)[None] < torch.tensor(lengths)[:, None]).long()
    ids = ids * mask  # right padding with token 0
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).logits
        for model in (Llama(cfg, weights),):
            got = model.logits(model.hidden(ids))
            for row, n in enumerate(lengths):
                torch.testing.assert_close(got[row, :n], expected[row, :n], atol=1e-5, rtol=0)
                alone = reference(input_ids=ids[row : row + 1, :n]).logits[0]
                torch.testing.assert_close(got[row, :n], alone, atol=1e-5, rtol=0)


def test_kv_cache_decoding_equals_full_forward_bit_for_bit() -> None:
    cfg = CONFIGS["local/nano"]
    model = Llama(cfg, init_weights(cfg))
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full = model.logits(model.hidden(ids))[0]
        cache = KVCache(cfg, batch=1, length=30)
        steps = [model.logits(model.hidden(ids[:, :10], cache))[0]]  # the prompt, once
        cache = cache.rows(torch.tensor([0, 0, 0]))  # shared by 3 rows
        for t in range(10, 24):
            step = model.logits(model.hidden(ids[:, t : t + 1].expand(3, 1), cache))[:, 0]
            assert torch.equal(step[0], step[1]) and torch.equal(step[0], step[2])
            steps.append(step[:1])
        assert torch.equal(torch.cat(steps), full)


def test_the_kv_cache_holds_keys_and_values_exactly_as_float32() -> None:
    """`KVCache` stores float32 (half the bytes each decode step reads): every key and value
    part `KeyValues.of` makes is a float32 number, for key rows of any scale and values from
    far below their grid to far above it (`KVCache`'s bound)."""
    cfg = CONFIGS["local/nano"]
    assert KVCache(cfg, batch=1, length=4).stored[0].dtype == torch.float32
    gen = torch.Generator().manual_seed(0)
    shape = (3, cfg.kv_heads, 50, cfg.dim_head)
    k = torch.randn(shape, generator=gen) * exact.pow2(
        torch.randint(-140, 100, (*shape[:3], 1), generator=gen)
    )
    v = torch.randn(shape, generator=gen) * exact.pow2(
        torch.randint(-100, 100, shape, generator=gen)
    )
    grid = exact.pow2(torch.randint(-120, 104, (cfg.kv_heads, 1, cfg.dim_head), generator=gen))
    data = KeyValues.of(k.float(), v.float(), grid).data
    assert data.dtype == torch.float64 and torch.equal(data.float().double(), data)
