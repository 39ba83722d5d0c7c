import pytest
import torch

from radixkv.kernels import reference, store_kv
from tests.kernels.paged_batch import DEVICE, make_paged_batch, randn


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("src_dtype, buf_dtype", [(torch.float32, torch.float32),
                                                  (torch.float32, torch.float16),
                                                  (torch.float16, torch.float16)])
def test_store_kv_matches_reference_on_scattered_slots(page_size, src_dtype, buf_dtype):
    batch = make_paged_batch([19, 40, 3], [0, 17, 1], page_size=page_size, num_kv_heads=3,
                             head_dim=80, dtype=buf_dtype)
    num_tokens = batch.out_cache_loc.shape[0]
    # k and v as strided views of a fused projection, the way a model produces them.
    kv = randn(num_tokens, 2, 3, 80, dtype=src_dtype)  # (T, 2, H_kv, D)
    k, v = kv[:, 0], kv[:, 1]  # (T, H_kv, D) each, non-contiguous
    expected_k, expected_v = batch.k_buffer.clone(), batch.v_buffer.clone()
    reference.store_kv(expected_k, expected_v, batch.out_cache_loc, k, v)
    store_kv(batch.k_buffer, batch.v_buffer, batch.out_cache_loc, k, v)
    assert torch.equal(batch.k_buffer, expected_k)
    assert torch.equal(batch.v_buffer, expected_v)


def test_store_kv_with_no_tokens_is_a_no_op():
    k_buffer = torch.zeros(4, 1, 64, device=DEVICE)  # (S, H_kv, D)
    v_buffer = torch.zeros(4, 1, 64, device=DEVICE)  # (S, H_kv, D)
    empty = torch.empty(0, 1, 64, device=DEVICE)  # (0, H_kv, D)
    store_kv(k_buffer, v_buffer, torch.empty(0, dtype=torch.int64, device=DEVICE), empty, empty)
    assert not k_buffer.any() and not v_buffer.any()
