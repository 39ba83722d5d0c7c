import pytest
import torch

from radixkv.errors import ConfigError
from radixkv.mem import KVLayout, ReqToTokenTable, make_kv_pool


def test_bytes_per_token_counts_k_and_v_of_every_layer():
    # SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64
    assert KVLayout(30, 3, 64, 1, torch.float32).bytes_per_token == 2 * 30 * 3 * 64 * 4
    assert KVLayout(30, 3, 64, 16, torch.bfloat16).bytes_per_token == 2 * 30 * 3 * 64 * 2


def test_num_pages_from_token_and_byte_budgets():
    layout = KVLayout(2, 2, 8, 4, torch.float32)  # 256 bytes/token, 1024 bytes/page
    assert layout.num_pages_for(max_tokens=100) == 25
    assert layout.num_pages_for(max_bytes=10 * 1024) == 9  # one page is the padding sink
    with pytest.raises(ConfigError, match="smaller than one page"):
        layout.num_pages_for(max_tokens=3)
    with pytest.raises(ConfigError, match="exactly one"):
        layout.num_pages_for(max_tokens=8, max_bytes=8)
    with pytest.raises(ConfigError, match="head_dim"):
        KVLayout(2, 2, 0, 4)


def test_pool_shapes_and_store_through_flat_slots():
    layout = KVLayout(num_layers=2, num_kv_heads=3, head_dim=4, page_size=2)
    pool = make_kv_pool(layout, num_pages=5)
    k_pages, v_pages = pool.storage[0]
    assert k_pages.shape == (6, 2, 3, 4)
    assert pool.nbytes == 2 * 2 * 6 * 2 * 3 * 4 * 4
    k = torch.randn(3, 3, 4)
    v = torch.randn(3, 3, 4)
    pool.store(1, torch.tensor([5, 2, 11]), k, v)
    k_pages, v_pages = pool.storage[1]
    assert torch.equal(k_pages[2, 1], k[0])  # slot 5 = page 2, offset 1
    assert torch.equal(v_pages[5, 1], v[2])  # slot 11 = page 5, offset 1
    assert pool.storage[0][0][0].abs().sum() == 0  # the padding page starts zeroed
    assert pool.k_view(1) is not None and torch.equal(pool.k_view(1).index_select(0, torch.tensor([2])), k[1:2])


def test_copy_page_copies_every_layer():
    pool = make_kv_pool(KVLayout(3, 1, 2, 4), num_pages=3)
    for k_pages, v_pages in pool.storage:
        k_pages[1].normal_()
        v_pages[1].normal_()
    pool.copy_page(1, 3)
    for k_pages, v_pages in pool.storage:
        assert torch.equal(k_pages[3], k_pages[1])
        assert torch.equal(v_pages[3], v_pages[1])


def test_request_table_rows():
    table = ReqToTokenTable(max_reqs=2, max_context_len=8)
    r0, r1 = table.alloc(), table.alloc()
    with pytest.raises(RuntimeError, match="in use"):
        table.alloc()
    table.write(r1, 2, [9, 8, 7])
    assert table.read(r1, 5).tolist() == [0, 0, 9, 8, 7]
    with pytest.raises(ValueError, match="max_context_len"):
        table.write(r0, 6, [1, 2, 3])
    table.free(r0)
    with pytest.raises(ValueError, match="not in use"):
        table.free(r0)
    assert table.alloc() == r0
