"""Triton split-KV decode attention against the torch reference on scattered pages.

Interpreted (CPU) runs read 128 KV positions per block; chunks are whole blocks, so 3 splits
over ~300 tokens leave every split busy while a 1-token request leaves two of them empty.
"""

import pytest
import torch

from radixkv.kernels import decode_attention, extend_attention, reference
from tests.kernels.paged_batch import assert_close, make_paged_batch, randn

# Mixed lengths: a lone first token, mid-page ends, and one long enough for several chunks.
SEQ_LENS = [1, 19, 300, 64]


def run_both(seq_lens, *, page_size=16, num_kv_heads=2, group=4, head_dim=64,
             dtype=torch.float32, window=None, num_kv_splits=None):
    batch = make_paged_batch(seq_lens, [n - 1 for n in seq_lens], page_size=page_size,
                             num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype)
    q = randn(len(seq_lens), num_kv_heads * group, head_dim, dtype=dtype)  # (B, Hq, D)
    scale = head_dim ** -0.5
    out = decode_attention(q, *batch.decode_args(), scale, window, num_kv_splits)  # (B, Hq, D)
    expected = reference.decode_attention(q, *batch.decode_args(), scale, window)  # (B, Hq, D)
    assert out.dtype == dtype and out.shape == q.shape
    return out, expected


@pytest.mark.parametrize("num_kv_splits", [1, 3])
@pytest.mark.parametrize("window", [None, 8])
@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.parametrize("page_size", [1, 16])
def test_decode_matches_reference_across_layouts(page_size, group, window, num_kv_splits):
    assert_close(*run_both(SEQ_LENS, page_size=page_size, group=group, window=window,
                           num_kv_splits=num_kv_splits))


@pytest.mark.parametrize("head_dim", [64, 80, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_matches_reference_across_dtypes_and_head_dims(dtype, head_dim):
    assert_close(*run_both(SEQ_LENS, group=3, head_dim=head_dim, dtype=dtype, window=200,
                           num_kv_splits=2))


def test_decode_chooses_splits_itself():
    assert_close(*run_both([5, 260], num_kv_heads=1, group=8, head_dim=96))


def test_decode_more_splits_than_blocks_leaves_empty_splits_harmless():
    assert_close(*run_both([1, 2, 130], num_kv_heads=1, group=2, num_kv_splits=4))


def test_decode_equals_the_last_token_of_extend():
    seq_lens, prefix_lens = [33, 70], [30, 0]
    batch = make_paged_batch(seq_lens, prefix_lens, page_size=16, num_kv_heads=2, head_dim=64,
                             dtype=torch.float32)
    q = randn(batch.out_cache_loc.shape[0], 6, 64, dtype=torch.float32)  # (T, Hq, D)
    extended = extend_attention(q, *batch.extend_args(), 0.125, 20)  # (T, Hq, D)
    last = batch.extend_start_loc.long() + (batch.seq_lens - batch.prefix_lens).long() - 1  # (B,)
    decoded = decode_attention(q[last], *batch.decode_args(), 0.125, 20, 2)  # (B, Hq, D)
    assert_close(decoded, extended[last])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("num_kv_splits", [None, 1, 8])
def test_decode_compiled_matches_reference(num_kv_splits, group, dtype):
    assert_close(*run_both([1, 700, 4097, 33] * 4, num_kv_heads=8, group=group, head_dim=128,
                           dtype=dtype, window=None, num_kv_splits=num_kv_splits))
