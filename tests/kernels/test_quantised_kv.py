"""Triton attention over quantised KV pools (fp16, fp8, int8, int4) against the torch reference.

The kernels read the pool's raw storage (`KVPool.kernel_buffers`) and dequantise tile by tile;
the reference reads the whole pool dequantised up front (`k_view`), so both see identical values
and must agree to fp32 rounding. A separate test bounds what quantisation itself costs against
the unquantised K/V. The Triton interpreter reads float8 tensors, so fp8 runs here too.
"""

import pytest
import torch

from radixkv.kernels import decode_attention, extend_attention, reference
from radixkv.mem.kv_pool import KernelKV, KVLayout, KVPool, make_kv_pool
from tests.kernels.paged_batch import DEVICE, PagedBatch, assert_close, make_paged_batch, randn

FORMATS = ["fp16", "fp8_e4m3", "fp8_e5m2", "int8", "int4"]
# Prefixes: none, one token, mid-page, several pages (as in test_extend_attention).
SEQ_LENS = [37, 2, 89, 63]
PREFIX_LENS = [0, 1, 19, 40]
# Same math on the same dequantised values: differences are fp32 rounding (measured <= 1.2e-6).
EXACT = {"atol": 1e-4, "rtol": 1e-4}
# Kernel on the quantised pool vs reference on the unquantised K/V (unit-variance K, V and q),
# worst over 20 seeds x head_dim 64/80/128 x extend/decode, about 2x margin on top:
# (max abs, rms). Max abs is large for int4 and fp8 because the first tokens of a request attend
# to one or two positions, so their output is one V row carrying its full rounding error.
QUANT_ERROR = {
    "fp16": (3e-3, 3e-4),  # measured 1.5e-3, 1.2e-4
    "fp8_e4m3": (0.4, 3.5e-2),  # measured 0.21, 1.7e-2
    "fp8_e5m2": (0.7, 6.5e-2),  # measured 0.35, 3.2e-2
    "int8": (6e-2, 8e-3),  # measured 3.1e-2, 3.8e-3
    "int4": (1.2, 0.13),  # measured 0.70, 6.7e-2
}


def quantised_batch(fmt: str, seq_lens: list[int], prefix_lens: list[int], *, head_dim: int,
                    num_kv_heads: int = 2, page_size: int = 16,
                    dtype: torch.dtype = torch.float32) -> tuple[PagedBatch, KVPool]:
    """A scattered paged batch, and a one-layer pool of format `fmt` holding its K/V in every
    slot (garbage slots included, so out-of-range reads still show)."""
    batch = make_paged_batch(seq_lens, prefix_lens, page_size=page_size, num_kv_heads=num_kv_heads,
                             head_dim=head_dim, dtype=dtype)
    num_slots = batch.k_buffer.shape[0]
    layout = KVLayout(num_layers=1, num_kv_heads=num_kv_heads, head_dim=head_dim,
                      page_size=page_size, dtype=dtype, kv_cache_dtype=fmt)
    pool = make_kv_pool(layout, num_slots // page_size - 1, DEVICE)
    pool.store(0, torch.arange(num_slots, device=DEVICE), batch.k_buffer, batch.v_buffer)
    return batch, pool


def format_kwargs(kv: KernelKV) -> dict:
    return {"k_scale": kv.k_scale, "v_scale": kv.v_scale, "kv_format": kv.kv_format, "group": kv.group}


def dequantised(pool: KVPool) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole layer-0 pool in the model dtype: (S, H_kv, D) each (fine in a test)."""
    return pool.k_view(0).narrow(0, 0, pool.num_slots), pool.v_view(0).narrow(0, 0, pool.num_slots)


def run_extend(fmt, *, head_dim=64, group=4, dtype=torch.float32, window=None):
    """(kernel on the quantised pool, reference on it dequantised, reference on the original K/V)."""
    batch, pool = quantised_batch(fmt, SEQ_LENS, PREFIX_LENS, head_dim=head_dim, dtype=dtype)
    kv = pool.kernel_buffers(0)
    k_deq, v_deq = dequantised(pool)  # (S, H_kv, D) each
    q = randn(batch.out_cache_loc.shape[0], 2 * group, head_dim, dtype=dtype)  # (T, Hq, D)
    scale = head_dim ** -0.5
    rest = batch.extend_args()[2:]
    out = extend_attention(q, kv.k, kv.v, *rest, scale, window, **format_kwargs(kv))  # (T, Hq, D)
    assert out.dtype == dtype and out.shape == q.shape
    return (out, reference.extend_attention(q, k_deq, v_deq, *rest, scale, window),
            reference.extend_attention(q, *batch.extend_args(), scale, window))


def run_decode(fmt, *, head_dim=64, group=4, dtype=torch.float32, window=None, num_kv_splits=2):
    """(kernel on the quantised pool, reference on it dequantised, reference on the original K/V)."""
    batch, pool = quantised_batch(fmt, SEQ_LENS, [n - 1 for n in SEQ_LENS], head_dim=head_dim,
                                  dtype=dtype)
    kv = pool.kernel_buffers(0)
    k_deq, v_deq = dequantised(pool)  # (S, H_kv, D) each
    q = randn(len(SEQ_LENS), 2 * group, head_dim, dtype=dtype, seed=2)  # (B, Hq, D)
    scale = head_dim ** -0.5
    rest = batch.decode_args()[2:]
    out = decode_attention(q, kv.k, kv.v, *rest, scale, window, num_kv_splits,
                           **format_kwargs(kv))  # (B, Hq, D)
    assert out.dtype == dtype and out.shape == q.shape
    return (out, reference.decode_attention(q, k_deq, v_deq, *rest, scale, window),
            reference.decode_attention(q, *batch.decode_args(), scale, window))


# head_dim 64: two int4 groups of 32; 80: one whole-head int4 group and masked padding lanes.
@pytest.mark.parametrize("head_dim, group", [(64, 4), (80, 3)])
@pytest.mark.parametrize("fmt", FORMATS)
def test_extend_on_quantised_pool_matches_reference_on_dequantised_pool(fmt, head_dim, group):
    out, expected, _ = run_extend(fmt, head_dim=head_dim, group=group)
    torch.testing.assert_close(out, expected, **EXACT)


@pytest.mark.parametrize("head_dim, group", [(64, 4), (80, 3)])
@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_on_quantised_pool_matches_reference_on_dequantised_pool(fmt, head_dim, group):
    out, expected, _ = run_decode(fmt, head_dim=head_dim, group=group)
    torch.testing.assert_close(out, expected, **EXACT)


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantisation_error_against_unquantised_kv_is_bounded(fmt):
    max_abs, rms = QUANT_ERROR[fmt]
    for out, _, full_precision in (run_extend(fmt), run_decode(fmt)):
        err = (out - full_precision).float()
        assert err.abs().max() < max_abs, (fmt, err.abs().max().item())
        assert err.pow(2).mean().sqrt() < rms, (fmt, err.pow(2).mean().sqrt().item())


def test_quantised_pool_under_a_half_precision_model_with_a_window():
    # fp16 q and output, int4 storage: the dequantised tiles meet q in q's dot dtype.
    assert_close(*run_extend("int4", dtype=torch.float16, window=16)[:2])
    assert_close(*run_decode("int4", dtype=torch.float16, window=16)[:2])


def test_unknown_kv_format_is_refused():
    batch, pool = quantised_batch("int8", [3], [0], head_dim=64, num_kv_heads=1)
    kv = pool.kernel_buffers(0)
    q = randn(1, 1, 64, dtype=torch.float32)  # (B, Hq, D)
    with pytest.raises(ValueError, match="kv_format"):
        decode_attention(q, kv.k, kv.v, *batch.decode_args()[2:], 0.125,
                         k_scale=kv.k_scale, v_scale=kv.v_scale, kv_format="int2")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_compiled_kernels_on_quantised_pools_match_reference(dtype, fmt):
    # Compiled kernels round the dequantised tiles to q's dtype for the dot: dtype tolerances.
    assert_close(*run_extend(fmt, head_dim=128, dtype=dtype)[:2])
    assert_close(*run_decode(fmt, head_dim=128, dtype=dtype, num_kv_splits=None)[:2])
