"""Quantised KV formats: round-trip error bounds, sizes, pools of every format behind one interface."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.errors import ConfigError
from radixkv.mem import KVLayout, make_kv_pool
from radixkv.mem import kv_quant
from radixkv.mem.kv_quant import KV_CACHE_DTYPES

# Worst-case error of one value relative to the largest magnitude in its scale group.
BOUNDS = {"auto": 0.0, "float32": 0.0, "fp16": 2**-11, "bf16": 2**-8, "fp8_e4m3": 2**-4,
          "fp8_e5m2": 2**-3, "int8": 0.5 / 127, "int4": 1.0 / 15}


@pytest.mark.parametrize("fmt", KV_CACHE_DTYPES)
def test_round_trip_error_is_within_the_format_bound(fmt):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, 64, generator=gen) * torch.logspace(-2, 1, 64)[:, None, None]  # (N, H, D)
    y = kv_quant.round_trip(x, fmt)
    assert y.shape == x.shape and y.dtype == x.dtype
    if fmt.startswith("fp8"):  # relative to each value (floating point), not to a group maximum
        bound = BOUNDS[fmt] * x.abs() + 2 ** -9
    elif fmt == "int4":  # half a step of (max - min) / 15 <= max|x| / 15, plus float16 rounding of the pair
        group_max = x.view(64, 3, 4, 16).abs().amax(-1, keepdim=True).expand(64, 3, 4, 16).reshape(x.shape)
        bound = BOUNDS[fmt] * group_max * 1.01 + 1e-4 * group_max
    else:
        bound = BOUNDS[fmt] * x.abs().amax(-1, keepdim=True)
    assert ((y - x).abs() <= bound * 1.0001 + 1e-7).all(), (y - x).abs().max()


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 6), st.sampled_from([2, 8, 32, 64, 96]), st.floats(1e-2, 1e3))  # float16 pairs: normal range
def test_int_formats_round_trip_exactly_on_their_grid(n, d, magnitude):
    gen = torch.Generator().manual_seed(n * d)
    x = torch.randn(n, 2, d, generator=gen) * magnitude
    codes, scale = kv_quant.quantize_int8(x)
    assert torch.equal(kv_quant.quantize_int8(kv_quant.dequantize_int8(codes, scale, torch.float32))[0], codes)
    g = kv_quant.int4_group(d)
    packed, scale4 = kv_quant.quantize_int4(x, g)
    assert packed.shape == (n, 2, d // 2) and packed.dtype == torch.uint8 and scale4.shape == (n, 2, d // g, 2)
    once = kv_quant.dequantize_int4(packed, scale4, g, torch.float32)
    twice = kv_quant.dequantize_int4(*kv_quant.quantize_int4(once, g), g, torch.float32)
    step = scale4[..., 0].float().repeat_interleave(g, -1)  # (n, 2, d)
    assert ((twice - once).abs() <= 0.01 * step + 1e-6 * once.abs()).all()  # values on the grid stay put


def test_zero_heads_stay_zero_without_nan():
    x = torch.zeros(3, 2, 64)
    for fmt in KV_CACHE_DTYPES:
        assert torch.equal(kv_quant.round_trip(x, fmt), x)


def test_bytes_per_token_per_format():
    # SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64, float32
    sizes = {fmt: KVLayout(30, 3, 64, 1, torch.float32, fmt).bytes_per_token for fmt in KV_CACHE_DTYPES}
    per = 2 * 30 * 3
    assert sizes == {"auto": per * 256, "float32": per * 256, "fp16": per * 128, "bf16": per * 128,
                     "fp8_e4m3": per * 64, "fp8_e5m2": per * 64, "int8": per * (64 + 4),
                     "int4": per * (32 + 4 * 4)}
    budget = 64 * 2**20
    fits = {f: KVLayout(30, 3, 64, 16, torch.float32, f).num_pages_for(max_bytes=budget) for f in ("auto", "int8", "int4")}
    assert fits["int8"] > 3.5 * fits["auto"] and fits["int4"] > 5 * fits["auto"]
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        KVLayout(30, 3, 64, 1, torch.float32, "int3")
    with pytest.raises(ConfigError, match="even head_dim"):
        KVLayout(30, 3, 63, 1, torch.float32, "int4")


@pytest.mark.parametrize("fmt", KV_CACHE_DTYPES)
def test_every_pool_stores_once_and_reads_back_what_its_format_keeps(fmt):
    layout = KVLayout(2, 3, 64, 4, torch.float32, fmt)
    pool = make_kv_pool(layout, num_pages=6)
    gen = torch.Generator().manual_seed(1)
    k, v = torch.randn(5, 3, 64, generator=gen), torch.randn(5, 3, 64, generator=gen)
    slots = torch.tensor([4, 5, 9, 17, 22])
    pool.store(1, slots, k, v)
    kr, vr = pool.gather(1, slots[[2, 0]])
    assert torch.equal(kr, kv_quant.round_trip(k, fmt)[[2, 0]]) and torch.equal(vr, kv_quant.round_trip(v, fmt)[[2, 0]])
    assert torch.equal(pool.k_view(1).narrow(0, 4, 2), kv_quant.round_trip(k, fmt)[:2])
    assert pool.k_view(1).shape == (28, 3, 64)
    # the padding page reads as zeros; pages move whole (copy-on-write, host tier)
    assert pool.k_view(0).narrow(0, 0, 4).abs().sum() == 0
    pool.copy_page(1, 5)
    assert torch.equal(pool.k_view(1).narrow(0, 20, 2), pool.k_view(1).narrow(0, 4, 2))
    for layer in range(2):  # fill pages 1-2 of every layer, then move them to pages 3-4
        pool.store(layer, torch.arange(4, 12), torch.randn(8, 3, 64, generator=gen), torch.randn(8, 3, 64, generator=gen))
    saved = pool.read_pages(torch.tensor([1, 2]))
    pool.write_pages(torch.tensor([3, 4]), saved)
    assert torch.equal(pool.v_view(1).narrow(0, 12, 8), pool.v_view(1).narrow(0, 4, 8))
    assert pool.nbytes == 7 * 4 * layout.bytes_per_token
