"""Triton extend attention against the torch reference on scattered pages.

Interpreted (CPU) runs pack 128 query rows per program (128 // group tokens) and 64 KV positions
per block, so the lengths below span several query blocks and KV blocks for group 4.
"""

import pytest
import torch

from radixkv.kernels import extend_attention, reference
from tests.kernels.paged_batch import assert_close, make_paged_batch, randn

# Prefixes: none, one token, mid-page (19 = 16 + 3), several pages; extends from 1 to 70 tokens.
SEQ_LENS = [37, 2, 89, 63]
PREFIX_LENS = [0, 1, 19, 40]


def run_both(seq_lens, prefix_lens, *, page_size=16, num_kv_heads=2, group=4, head_dim=64,
             dtype=torch.float32, window=None):
    batch = make_paged_batch(seq_lens, prefix_lens, page_size=page_size,
                             num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype)
    num_tokens = batch.out_cache_loc.shape[0]
    num_q_heads = num_kv_heads * group
    # q as a strided view of a fused QKV projection, the way a model produces it.
    qkv = randn(num_tokens, num_q_heads + 2 * num_kv_heads, head_dim, dtype=dtype)  # (T, Hq + 2 H_kv, D)
    q = qkv[:, :num_q_heads]  # (T, Hq, D)
    scale = head_dim ** -0.5
    out = extend_attention(q, *batch.extend_args(), scale, window)  # (T, Hq, D)
    expected = reference.extend_attention(q, *batch.extend_args(), scale, window)  # (T, Hq, D)
    assert out.dtype == dtype and out.shape == q.shape
    return out, expected


@pytest.mark.parametrize("window", [None, 8])
@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.parametrize("page_size", [1, 16])
def test_extend_matches_reference_across_layouts(page_size, group, window):
    assert_close(*run_both(SEQ_LENS, PREFIX_LENS, page_size=page_size, group=group, window=window))


@pytest.mark.parametrize("head_dim", [64, 80, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_extend_matches_reference_across_dtypes_and_head_dims(dtype, head_dim):
    assert_close(*run_both(SEQ_LENS, PREFIX_LENS, group=3, head_dim=head_dim, dtype=dtype, window=16))


def test_extend_spans_several_query_and_kv_blocks_without_gqa():
    # 150 new tokens after a 70-token prefix: two 128-token query blocks, four 64-token KV blocks.
    assert_close(*run_both([220, 9], [70, 0], group=1, num_kv_heads=1))


def test_extend_window_skips_blocks_far_behind_the_queries():
    # Window 5 over a 150-token prefix: only the last few KV positions may matter.
    assert_close(*run_both([160, 30], [150, 0], group=4, num_kv_heads=1, window=5))


def test_extend_multi_query_attention_shares_one_kv_head():
    assert_close(*run_both([40, 17], [8, 0], num_kv_heads=1, group=8, head_dim=96))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("window", [None, 32])
@pytest.mark.gpu
def test_extend_compiled_matches_reference(window, group, dtype):
    lens = [300, 1, 513, 129]
    assert_close(*run_both(lens, [0, 0, 257, 100], num_kv_heads=8, group=group, head_dim=128,
                           dtype=dtype, window=window))
