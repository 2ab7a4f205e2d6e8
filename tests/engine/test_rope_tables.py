"""RoPE's tables the same bits on every CPU by construction: the engine's own sin and cos
(`exact.sin`, `exact.cos`) against Python's math (libm: within 1 ulp) and mpmath at 120 bits
(under 1 ulp), their edges; the inverse frequencies and the cos and sin tables against
references written here (mpmath's powers and numpy's float64 cos and sin, each rounded to
float32: equal but for double-rounding cases, counted), the same bits with torch's and MKL's
code forced to AVX2 and to AVX-512, and within a float32 ulp of transformers' own."""

from __future__ import annotations

import dataclasses
import json
import math

import mpmath
import numpy as np
import pytest
import torch

from whitney.local.engine import exact
from whitney.local.engine.hf_backend import model_config
from whitney.local.engine.model import CONFIGS, ModelConfig, inverse_frequencies, rope_tables

from .test_cpu_capability import ON_AVX512, forced

LIMIT = exact.SIN_COS_LIMIT
SMOLLM2 = model_config(
    {
        "model_type": "llama",
        "hidden_size": 576,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "intermediate_size": 1536,
        "max_position_embeddings": 8192,
        "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    },
    49152,
)
"""SmolLM2-135M's config.json as the engine reads it (4096 positions: the engine's cap)."""
LLAMA3 = ModelConfig(
    hidden_size=512,
    num_layers=1,
    num_heads=4,
    intermediate_size=1024,
    max_positions=4096,
    rope_theta=500000.0,
    rope_type="llama3",
    rope_factor=8.0,
    rope_original_max_positions=8192,
)
"""Llama 3.1's RoPE (head_dim 128, theta 500000, factor 8 of 8192 positions)."""
LINEAR = ModelConfig(
    hidden_size=256,
    num_layers=1,
    num_heads=4,
    intermediate_size=512,
    rope_theta=1000000.0,
    rope_type="linear",
    rope_factor=4.0,
)
TABLE_CONFIGS = {
    "local/tiny": CONFIGS["local/tiny"],
    "SmolLM2": SMOLLM2,
    "llama3": LLAMA3,
    "linear": LINEAR,
}


def uniform(seed: int, n: int, low: float, high: float) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, generator=gen, dtype=torch.float64) * (high - low) + low


def sin_cos_inputs() -> torch.Tensor:
    """The whole domain, a few turns, small angles, every exponent below 1, and the tables'
    own angles (float32 products of positions and inverse frequencies)."""
    gen = torch.Generator().manual_seed(1)
    bits = torch.randint(0x0000000000000001, 0x3FF0000000000000, (50_000,), generator=gen)
    signs = torch.where(torch.rand(50_000, generator=gen) < 0.5, -1.0, 1.0).double()
    angles, _ = torch.sort(uniform(2, 20_000, 0.0, 4096.0).float().double())
    return torch.cat(
        [
            uniform(3, 200_000, -LIMIT, LIMIT),
            uniform(4, 200_000, -4 * math.pi, 4 * math.pi),
            uniform(5, 50_000, -1e-3, 1e-3),
            bits.view(torch.float64) * signs,
            angles,
        ]
    )


def float64_ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """How many float64 steps apart (same-signed finite values, or one of them 0)."""
    return (got.view(torch.int64) - want.view(torch.int64)).abs()


@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sin_and_cos_are_within_one_ulp_of_libm(name: str) -> None:
    x = sin_cos_inputs()
    libm = getattr(math, name)
    want = torch.tensor([libm(v) for v in x.tolist()], dtype=torch.float64)
    got = getattr(exact, name)(x)
    assert bool((got.signbit() == want.signbit())[want != 0].all())
    apart = float64_ulps(got, want)
    worst = int(apart.argmax())
    assert int(apart[worst]) <= 1, (name, x[worst].item(), int(apart[worst]))


def ulps_from_truth(got: float, true: mpmath.mpf) -> float:
    """|got - true| in units of the float64 step at `true`."""
    return float(abs(mpmath.mpf(got) - true) / math.ulp(float(true)))


@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sin_and_cos_are_under_one_ulp_of_mpmath(name: str) -> None:
    mpmath.mp.prec = 120
    x = sin_cos_inputs()[::50]
    truth = getattr(mpmath, name)
    errors = [
        (ulps_from_truth(got, truth(value)), value)
        for value, got in zip(x.tolist(), getattr(exact, name)(x).tolist(), strict=True)
    ]
    worst, at = max(errors)
    assert worst < 1.0, f"{name}: worst {worst:.3f} ulp at x = {at!r}"


def multiples_of_half_pi() -> torch.Tensor:
    """The float64 nearest k pi/2 for every k below the domain's end, and each one's two
    neighbours: where the reduction cancels most."""
    mpmath.mp.prec = 120
    half_pi = mpmath.pi / 2
    nearest = torch.tensor([float(k * half_pi) for k in range(1, 2**19)], dtype=torch.float64)
    steps = nearest.view(torch.int64)
    return torch.cat([nearest, (steps - 1).view(torch.float64), (steps + 1).view(torch.float64)])


def test_multiples_of_half_pi_near_their_float() -> None:
    x = multiples_of_half_pi()
    for name in ("sin", "cos"):
        libm = getattr(math, name)
        want = torch.tensor([libm(v) for v in x.tolist()], dtype=torch.float64)
        got = getattr(exact, name)(x)
        assert bool((got.signbit() == want.signbit()).all()), name
        apart = float64_ulps(got, want)
        worst = int(apart.argmax())
        assert int(apart[worst]) <= 1, (name, x[worst].item(), int(apart[worst]))
    mpmath.mp.prec = 120
    sample = x[::97]
    for name in ("sin", "cos"):
        truth = getattr(mpmath, name)
        got = getattr(exact, name)(sample).tolist()
        worst, at = max(
            (ulps_from_truth(mine, truth(v)), v)
            for v, mine in zip(sample.tolist(), got, strict=True)
        )
        assert worst < 1.0, f"{name}: worst {worst:.3f} ulp at x = {at!r}"


def test_zeros_the_domains_end_and_special_values() -> None:
    inf, nan = math.inf, math.nan
    x = torch.tensor(
        [0.0, -0.0, LIMIT, -LIMIT, nan, inf, -inf, 5e-324, -1e-300], dtype=torch.float64
    )
    sines, cosines = exact.sin(x).tolist(), exact.cos(x).tolist()
    assert sines[:2] == [0.0, 0.0] and math.copysign(1, sines[1]) == -1
    assert cosines[:2] == [1.0, 1.0]
    mpmath.mp.prec = 120
    assert sines[2] == -sines[3] and cosines[2] == cosines[3]
    assert ulps_from_truth(sines[2], mpmath.sin(LIMIT)) < 1.0
    assert ulps_from_truth(cosines[2], mpmath.cos(LIMIT)) < 1.0
    assert all(math.isnan(v) for v in sines[4:7] + cosines[4:7])
    assert sines[7:] == [5e-324, -1e-300] and cosines[7:] == [1.0, 1.0]
    beyond = math.nextafter(LIMIT, inf)
    for outside in (beyond, -beyond, 1e6, 1e300):
        for fn in (exact.sin, exact.cos):
            with pytest.raises(ValueError, match="2\\*\\*19 pi/2"):
                fn(torch.tensor([0.5, outside], dtype=torch.float64))
    assert exact.sin(torch.empty(0, dtype=torch.float64)).shape == (0,)


def correctly_rounded_float32(value: mpmath.mpf) -> np.float32:
    """`value` rounded once to float32 (24 bits, to nearest, ties to even; a normal float32)."""
    with mpmath.workprec(24):
        return np.float32(float(+value))


def near_a_float32_midpoint(value: mpmath.mpf | np.ndarray, relative: float) -> np.ndarray:
    """Whether each value lies within `relative` of a point halfway between two float32s: where
    a value computed that closely may round to float32 either way."""
    wide = np.asarray(value, dtype=np.float64)
    rounded = wide.astype(np.float32)
    near = np.zeros(wide.shape, dtype=bool)
    for toward in (np.inf, -np.inf):
        neighbour = np.nextafter(rounded, np.float32(toward))
        midpoint = (rounded.astype(np.float64) + neighbour.astype(np.float64)) / 2
        near |= np.abs(wide - midpoint) <= relative * np.abs(wide)
    return near


@pytest.mark.parametrize(("theta", "head_dim"), [(10000.0, 32), (100000.0, 64), (5e5, 128)])
def test_inverse_frequencies_are_the_correctly_rounded_powers_inverted(
    theta: float, head_dim: int
) -> None:
    mpmath.mp.prec = 120
    cfg = ModelConfig(
        hidden_size=head_dim * 2, num_layers=1, num_heads=2, intermediate_size=8, rope_theta=theta
    )
    exponents = np.arange(0, head_dim, 2).astype(np.float32) / np.float32(head_dim)
    powers = [mpmath.power(mpmath.mpf(theta), mpmath.mpf(float(y))) for y in exponents]
    want = np.float32(1.0) / np.array([correctly_rounded_float32(p) for p in powers])
    got = inverse_frequencies(cfg).numpy()
    double_rounding = near_a_float32_midpoint(np.array([float(p) for p in powers]), 2.0**-46)
    differ = got != want
    assert not (differ & ~double_rounding).any(), (np.flatnonzero(differ), got, want)
    assert int(double_rounding.sum()) == 0  # none at these configs: every power is checked


@pytest.mark.parametrize("name", list(TABLE_CONFIGS))
def test_tables_are_cos_and_sin_of_the_float32_angles_rounded_once(name: str) -> None:
    cfg = TABLE_CONFIGS[name]
    half = cfg.dim_head // 2
    inv_freq = inverse_frequencies(cfg).numpy()
    angles = np.arange(cfg.max_positions, dtype=np.float32)[:, None] * inv_freq[None, :]
    cos, signed_sin = (table.numpy() for table in rope_tables(cfg))
    assert cos.shape == signed_sin.shape == (cfg.max_positions, 2 * half)
    assert np.array_equal(cos[:, :half], cos[:, half:])
    assert np.array_equal(-signed_sin[:, :half], signed_sin[:, half:])
    counted = {}
    for label, table, reference in (
        ("cos", cos[:, :half], np.cos(angles.astype(np.float64))),
        ("sin", signed_sin[:, half:], np.sin(angles.astype(np.float64))),
    ):
        double_rounding = near_a_float32_midpoint(reference, 2.0**-50)
        differ = table.view(np.int32) != reference.astype(np.float32).view(np.int32)
        assert not (differ & ~double_rounding).any(), (
            label,
            np.argwhere(differ & ~double_rounding),
        )
        counted[label] = int(double_rounding.sum())
    assert sum(counted.values()) <= 2, counted  # about 2**-26 of the elements: none expected


TABLES_PROBE = """
import hashlib, json
import torch
from whitney.local.engine.model import ModelConfig, inverse_frequencies, rope_tables

def digest(*tensors):
    return hashlib.sha256(b"".join(t.numpy().tobytes() for t in tensors)).hexdigest()

digests = {"capability": torch.backends.cpu.get_cpu_capability()}
for name, fields in json.loads(CONFIGS).items():
    cfg = ModelConfig(**fields | {"eos_token_ids": tuple(fields["eos_token_ids"])})
    digests[name] = [digest(inverse_frequencies(cfg)), digest(*rope_tables(cfg))]
print(json.dumps(digests))
"""


def tables_probe(capability: str) -> dict[str, str]:
    """The digests of every config's inverse frequencies and tables in a fresh interpreter with
    torch's and MKL's code forced to `capability`."""
    configs = json.dumps({name: dataclasses.asdict(cfg) for name, cfg in TABLE_CONFIGS.items()})
    return forced(f"CONFIGS = {configs!r}\n" + TABLES_PROBE, capability, "0", 600)


@ON_AVX512
def test_tables_are_the_same_bits_on_avx2_and_avx512() -> None:
    assert tables_probe("avx2") == tables_probe("avx512")


def float32_ulps(got: torch.Tensor, want: torch.Tensor) -> int:
    """The largest distance in float32 steps, elements of opposite signs counted through 0."""
    g, w = got.view(torch.int32).long(), want.view(torch.int32).long()
    g = torch.where(g < 0, -(g & 0x7FFFFFFF), g)
    w = torch.where(w < 0, -(w & 0x7FFFFFFF), w)
    return int((g - w).abs().max())


def transformers_rope(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """transformers' LlamaRotaryEmbedding of the config: inverse frequencies, cos and sin."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rope = {"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta, "factor": cfg.rope_factor}
    if cfg.rope_type == "llama3":
        rope |= {
            "low_freq_factor": cfg.rope_low_freq_factor,
            "high_freq_factor": cfg.rope_high_freq_factor,
            "original_max_position_embeddings": cfg.rope_original_max_positions,
        }
    config = LlamaConfig(
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_heads,
        head_dim=cfg.dim_head,
        max_position_embeddings=cfg.max_positions,
        rope_parameters=rope,
    )
    rotary = LlamaRotaryEmbedding(config)
    positions = torch.arange(cfg.max_positions)[None]
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions)
    return rotary.inv_freq, cos[0], sin[0]


@pytest.mark.parametrize("name", list(TABLE_CONFIGS))
def test_tables_are_within_a_float32_ulp_of_transformers(name: str) -> None:
    cfg = TABLE_CONFIGS[name]
    inv_freq, cos, sin = transformers_rope(cfg)
    half = cfg.dim_head // 2
    mine = inverse_frequencies(cfg)
    assert float32_ulps(mine, inv_freq.float()) <= 1
    table_cos, signed_sin = rope_tables(cfg)
    worst = float32_ulps(table_cos, cos), float32_ulps(signed_sin[:, half:], sin[:, half:])
    # torch's float32 cos and sin are faithful (under 1 ulp), the tables' nearly correctly
    # rounded: each is one of the two float32s around the true value
    assert max(worst) <= 1, f"{name}: cos {worst[0]} and sin {worst[1]} float32 ulps from torch's"
