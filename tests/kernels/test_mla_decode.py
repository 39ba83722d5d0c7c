"""The Triton MLA decode kernel (absorbed latent attention) against its torch reference, and
against the general decode kernel run as MQA over the same latents (interpreted on CPU)."""

import pytest
import torch
from radixkv.kernels import decode_attention, mla_decode_attention, reference

from radixkv.mem.kv_pool import KVLayout, make_kv_pool
from tests.kernels.paged_batch import assert_close, make_paged_batch, randn

SEQ_LENS = [1, 19, 150, 64]


def latent_batch(seq_lens, rank, rope, page_size, dtype):
    batch = make_paged_batch(seq_lens, [n - 1 for n in seq_lens], page_size=page_size, num_kv_heads=1,
                             head_dim=rank + rope, dtype=dtype)
    return batch, batch.k_buffer  # (S, 1, R + P): the latents


@pytest.mark.parametrize("num_kv_splits", [1, 3])
@pytest.mark.parametrize("rank, rope, heads", [(32, 8, 4), (48, 16, 20), (64, 0, 3)])
@pytest.mark.parametrize("page_size", [1, 16])
def test_mla_decode_matches_reference(page_size, rank, rope, heads, num_kv_splits):
    batch, latent = latent_batch(SEQ_LENS, rank, rope, page_size, torch.float32)
    q = randn(len(SEQ_LENS), heads, rank + rope, dtype=torch.float32)  # (B, H, R + P)
    args = (batch.req_to_token, batch.req_pool_indices, batch.seq_lens, 0.1, rank)
    out = mla_decode_attention(q, latent, *args, num_kv_splits=num_kv_splits)
    want = reference.mla_decode_reference(q, latent, *args)
    assert out.shape == q.shape and bool((out[..., rank:] == 0).all())
    assert_close(out, want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_mla_decode_in_half_precision(dtype):
    batch, latent = latent_batch(SEQ_LENS, 32, 8, 16, dtype)
    q = randn(len(SEQ_LENS), 8, 40, dtype=dtype)
    args = (batch.req_to_token, batch.req_pool_indices, batch.seq_lens, 0.15, 32)
    assert_close(mla_decode_attention(q, latent, *args, num_kv_splits=2), reference.mla_decode_reference(q, latent, *args))


def test_mla_decode_equals_the_general_kernel_as_multi_query_attention():
    """Values = the latent itself: the general decode kernel's first R columns are the MLA output."""
    batch, latent = latent_batch(SEQ_LENS, 32, 8, 4, torch.float32)
    q = randn(len(SEQ_LENS), 6, 40, dtype=torch.float32)
    common = (batch.req_to_token, batch.req_pool_indices, batch.seq_lens, 0.12)
    mqa = decode_attention(q, latent, latent, *common)  # (B, H, R + P)
    assert_close(mla_decode_attention(q, latent, *common, 32)[..., :32], mqa[..., :32])


def test_mla_decode_reads_an_fp8_latent_pool():
    layout = KVLayout(1, 1, 40, 4, torch.float32, "fp8_e4m3", latent=True, latent_rope_dim=8)
    pool = make_kv_pool(layout, 8)
    slots = torch.arange(4, 4 + 20)
    pool.store(0, slots, randn(20, 1, 40, dtype=torch.float32), None)
    table = torch.zeros(2, 32, dtype=torch.int32)
    table[0, :20] = slots.to(torch.int32)
    table[1, :7] = slots[:7].to(torch.int32)
    q = randn(2, 4, 40, dtype=torch.float32)
    args = (table, torch.tensor([0, 1]), torch.tensor([20, 7], dtype=torch.int32), 0.2, 32)
    got = mla_decode_attention(q, pool.kernel_buffers(0).k, *args)
    want = reference.mla_decode_reference(q, pool.k_view(0).index_select(0, torch.arange(pool.num_slots)), *args)
    assert_close(got, want)
