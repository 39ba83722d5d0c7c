"""The torch backend's direct decode path: a pure decode batch on a dense fp32 pool stores the
new tokens' K/V and attends in one `cpu_decode` call per layer. Checked against the reference
backend (store through the pool, then gather + masked SDPA) on the same pool contents: the
outputs, what the pool holds afterwards, every layer, and the batches that must not take it."""

import pytest
import torch

from radixkv.attention import cpu_decode
from radixkv.attention.backend import ReferenceBackend, TorchBackend
from radixkv.attention.forward_batch import ForwardBatch, ForwardMode
from radixkv.attention.sdpa_plan import DecodeRows
from radixkv.errors import CacheInvariantError
from radixkv.mem.kv_pool import KVLayout, make_kv_pool

pytestmark = pytest.mark.skipif(cpu_decode.library() is None, reason="no C++ compiler to build the kernel")

HQ, HKV, D, PAGE, LAYERS = 6, 2, 32, 4, 3


def decode_setup(lens: list[int], shared: int = 0, kv_cache_dtype: str = "auto", seed: int = 0):
    """Two identical pools (random contents) and request tables for rows of `lens` tokens
    (the newest one is this step's), the first `shared` on the same slots; pages scattered."""
    g = torch.Generator().manual_seed(seed)
    layout = KVLayout(LAYERS, HKV, D, PAGE, kv_cache_dtype=kv_cache_dtype)
    num_pages = sum(-(-n // PAGE) for n in lens) + 8
    pools = [make_kv_pool(layout, num_pages) for _ in range(2)]
    fill = [torch.randn(pools[0].num_slots, HKV, D, generator=g) for _ in range(2 * LAYERS)]
    for pool in pools:
        for layer in range(LAYERS):  # the same history in both, written the pool's own way
            slots = torch.arange(pool.num_slots)
            pool.store(layer, slots, fill[2 * layer], fill[2 * layer + 1])
    pages = (torch.randperm(num_pages, generator=g) + 1).tolist()  # page 0 is padding
    table = torch.zeros(len(lens), max(lens), dtype=torch.int32)
    shared_pages = [pages.pop() for _ in range(shared // PAGE)]
    for b, n in enumerate(lens):
        own = [pages.pop() for _ in range(-(-(n - shared) // PAGE))]
        slots = [p * PAGE + i for p in shared_pages + own for i in range(PAGE)][:n]
        table[b, :n] = torch.tensor(slots, dtype=torch.int32)
    loc = [int(table[b, n - 1]) for b, n in enumerate(lens)]
    fb = ForwardBatch.build(ForwardMode.DECODE, [[1]] * len(lens), list(range(len(lens))),
                            [n - 1 for n in lens], loc)
    return pools, table, fb


def run(cls, pool, table, fb, qkv_steps):
    backend = cls(pool, table)
    backend.begin_forward(fb)
    outs = [backend.forward(q, k, v, layer, D ** -0.5, None, fb) for layer, (q, k, v) in enumerate(qkv_steps)]
    return backend, outs


def qkv_views(B: int, seed: int):
    """Per layer, q, k, v as the model produces them: column views of one fused projection
    (rows (HQ + 2 HKV) * D floats apart, not contiguous)."""
    g = torch.Generator().manual_seed(seed)
    steps = []
    for _ in range(LAYERS):
        fused = torch.randn(B, (HQ + 2 * HKV) * D, generator=g)
        q, k, v = fused.split([HQ * D, HKV * D, HKV * D], dim=1)
        steps.append((q.view(B, HQ, D), k.view(B, HKV, D), v.view(B, HKV, D)))
    return steps


@pytest.mark.parametrize("lens,shared", [
    ([1], 0),
    ([9, 30, 17, 64], 0),  # ragged
    ([1100, 1090, 1080], 1064),  # a shared prefix worth reading once: merged with the kernel's lse
])
def test_direct_decode_matches_the_reference_backend_and_stores_the_same(lens, shared):
    (ours_pool, ref_pool), table, fb = decode_setup(lens, shared)
    steps = qkv_views(len(lens), seed=len(lens))
    assert len(lens) == 1 or not steps[0][0].is_contiguous()
    backend, ours = run(TorchBackend, ours_pool, table, fb, steps)
    assert isinstance(backend._direct_decode, DecodeRows)  # the direct path served this batch
    assert bool(backend._direct_decode.shared) == bool(shared)
    _, ref = run(ReferenceBackend, ref_pool, table, fb, steps)
    for layer in range(LAYERS):
        torch.testing.assert_close(ours[layer], ref[layer], atol=2e-5, rtol=1e-4)
        assert torch.equal(ours_pool.k_view(layer), ref_pool.k_view(layer))  # every slot, not only the new
        assert torch.equal(ours_pool.v_view(layer), ref_pool.v_view(layer))


def test_quantised_pools_and_extend_batches_keep_the_store_then_attend_path():
    (pool, ref_pool), table, fb = decode_setup([12, 7], kv_cache_dtype="int8")
    steps = qkv_views(2, seed=5)
    backend, ours = run(TorchBackend, pool, table, fb, steps)
    assert backend._direct_decode is None
    _, ref = run(ReferenceBackend, ref_pool, table, fb, steps)
    torch.testing.assert_close(ours[0], ref[0], atol=2e-5, rtol=1e-4)

    (pool, _), table, _ = decode_setup([12, 7])
    extend = ForwardBatch.build(ForwardMode.EXTEND, [[1, 1], [1]], [0, 1], [9, 6],
                                [int(table[0, 9]), int(table[0, 10]), int(table[1, 6])])
    backend = TorchBackend(pool, table)
    backend.begin_forward(extend)
    q, k, v = torch.randn(3, HQ, D), torch.randn(3, HKV, D), torch.randn(3, HKV, D)
    backend.forward(q, k, v, 0, D ** -0.5, None, extend)
    assert backend._direct_decode is None


def test_a_new_tokens_slot_outside_the_pool_raises_and_writes_nothing():
    B, S = 2, 64
    q = torch.randn(B, 4, 16)
    k_buffer, v_buffer = torch.randn(S, 2, 16), torch.randn(S, 2, 16)
    before = k_buffer.clone(), v_buffer.clone()
    slots, lens = torch.tensor([[0, 1, 2], [3, 4, 5]]), torch.tensor([3, 3])
    k_new, v_new = torch.randn(B, 2, 16), torch.randn(B, 2, 16)
    with pytest.raises(CacheInvariantError, match="1 of 2 new tokens"):
        cpu_decode.paged_decode(q, k_buffer, v_buffer, slots, lens, 0.25, store=(k_new, v_new, torch.tensor([2, S])))
    assert torch.equal(k_buffer, before[0]) and torch.equal(v_buffer, before[1])
    out, _ = cpu_decode.paged_decode(q, k_buffer, v_buffer, slots, lens, 0.25, store=(k_new, v_new, torch.tensor([2, 5])))
    assert torch.equal(k_buffer[2], k_new[0]) and torch.equal(v_buffer[5], v_new[1])
    assert torch.isfinite(out).all()
