"""The C++ paged extend kernel (`radixkv.attention.cpu_extend`) inside `sdpa_paged.attention`:
against the masked reference and against the flash path (the kernel switched off), on paged
batches with head_dim 64 -- cold prompts, cached prefixes split mid-page, mixed prefill and
decode rows, GQA groups of 1, 3 and 7, token counts around its 8- and 16-token tiles, a padded key stride -- and
next to a shared-prefix group, which keeps its cascade path; bad slots raise."""

import pytest
import torch

from radixkv.attention import cpu_extend, sdpa_paged, sdpa_plan
from radixkv.errors import CacheInvariantError
from radixkv.kernels import reference
from tests.kernels.paged_batch import assert_close, make_paged_batch, randn

pytestmark = pytest.mark.skipif(cpu_extend.library() is None, reason="kernel not built here (no compiler or AVX-512)")

F32, D = torch.float32, 64


def setup(seq_lens, prefix_lens, hq, hkv, seed):
    batch = make_paged_batch(seq_lens, prefix_lens, page_size=4, num_kv_heads=hkv, head_dim=D, dtype=F32, seed=seed)
    t = batch.out_cache_loc.shape[0]
    q, k, v = randn(t, hq, D, dtype=F32, seed=seed + 1), randn(t, hkv, D, dtype=F32, seed=seed + 2), \
        randn(t, hkv, D, dtype=F32, seed=seed + 3)
    reference.store_kv(batch.k_buffer, batch.v_buffer, batch.out_cache_loc, k, v)
    plan = sdpa_plan.plan(batch.req_to_token, batch.req_pool_indices, batch.seq_lens, batch.prefix_lens,
                          batch.extend_start_loc, t)
    return batch, q, k, v, plan


def flash_path(q, k, v, batch, plan):
    lib = cpu_extend.KERNEL.get()
    cpu_extend.KERNEL.set(None)
    try:
        return sdpa_paged.attention(q, k, v, batch.k_buffer, batch.v_buffer, plan, D ** -0.5)
    finally:
        cpu_extend.KERNEL.set(lib)


@pytest.mark.parametrize("seq_lens,prefix_lens,hq,hkv", [
    ([37], [0], 9, 3),  # one cold prompt
    ([37], [29], 9, 3),  # a cached prefix, split mid-page
    ([600 + 66] * 3, [600] * 3, 9, 3),  # multi-turn follow-ups
    ([20, 9, 33, 17, 4], [0, 4, 32, 1, 0], 4, 4),  # prefill, extend, a 1-token chunk; MHA
    ([12, 40, 7, 25, 19], [11, 0, 6, 10, 18], 14, 2),  # decode rows among extends; groups of 7
    ([2, 16, 17, 31, 33], [0, 0, 0, 0, 1], 9, 3),  # around the 8- and 16-token tiles
    ([512, 300], [448, 0], 9, 3),  # 512 keys: the key buffer's row stride padded off a multiple of 1 KB
])
def test_the_kernel_matches_the_reference_and_the_flash_path(seq_lens, prefix_lens, hq, hkv):
    batch, q, k, v, plan = setup(seq_lens, prefix_lens, hq, hkv, seed=len(seq_lens) + hq)
    assert plan.kernel_rows is not None
    ours = sdpa_paged.attention(q, k, v, batch.k_buffer, batch.v_buffer, plan, D ** -0.5)
    assert_close(ours, reference.extend_attention(q, *batch.extend_args(), D ** -0.5))
    torch.testing.assert_close(ours, flash_path(q, k, v, batch, plan), atol=2e-5, rtol=1e-4)


def test_a_shared_prefix_group_keeps_its_cascade_and_the_rest_take_the_kernel():
    """Requests 0-2 extend one 1,064-token prefix (a cascade group); 3 and 4 have their own."""
    gen = torch.Generator().manual_seed(11)
    shared_len, own, new, alone = 1064, [0, 5, 0, 12, 0], [30, 20, 9, 40, 1], {3, 4}
    total = shared_len + sum(own) + sum(new) + 8
    k_buffer, v_buffer = torch.randn(total, 3, D, generator=gen), torch.randn(total, 3, D, generator=gen)
    free = (torch.randperm(total - 1, generator=gen) + 1).tolist()
    shared = [free.pop() for _ in range(shared_len)]
    seqs = [([] if b in alone else shared) + [free.pop() for _ in range(own[b] + new[b])] for b in range(5)]
    req_to_token = torch.zeros(6, max(map(len, seqs)) + 1, dtype=torch.int32)
    for b, seq in enumerate(seqs):
        req_to_token[b + 1, : len(seq)] = torch.tensor(seq, dtype=torch.int32)
    seq_lens = torch.tensor([len(s) for s in seqs], dtype=torch.int32)
    prefix_lens = seq_lens - torch.tensor(new, dtype=torch.int32)
    starts = torch.tensor([sum(new[:b]) for b in range(5)], dtype=torch.int32)
    loc = torch.cat([req_to_token[b + 1, prefix_lens[b]: seq_lens[b]].long() for b in range(5)])
    q, k, v = (torch.randn(sum(new), h, D, generator=gen) for h in (9, 3, 3))
    reference.store_kv(k_buffer, v_buffer, loc, k, v)
    rows = torch.arange(1, 6)
    plan = sdpa_plan.plan(req_to_token, rows, seq_lens, prefix_lens, starts, sum(new))
    assert len(plan.shared_extends) == 1 and sorted(plan.shared_extends[0].spans) == [0, 1, 2]
    assert plan.kernel_rows.q_start.tolist() == [int(starts[3]), int(starts[4])]  # the others: cascade
    ours = sdpa_paged.attention(q, k, v, k_buffer, v_buffer, plan, D ** -0.5)
    expected = reference.extend_attention(q, k_buffer, v_buffer, req_to_token, rows, seq_lens, prefix_lens, starts,
                                          max(new), D ** -0.5)
    assert_close(ours, expected)


def test_slots_outside_the_pool_raise_and_other_layouts_take_the_flash_path():
    batch, q, k, v, plan = setup([30, 20], [10, 0], 9, 3, seed=2)
    rows = plan.kernel_rows
    bad = cpu_extend.ExtendRows(rows.slots.clone(), rows.kv_len, rows.q_start, rows.q_len)
    bad.slots[1, 3] = batch.k_buffer.shape[0]
    with pytest.raises(CacheInvariantError, match="1 of 2 requests"):
        cpu_extend.paged_extend(q, batch.k_buffer, batch.v_buffer, bad, D ** -0.5, torch.empty(q.shape))
    assert not cpu_extend.usable(q[..., :32], batch.k_buffer[..., :32], batch.v_buffer[..., :32])  # head_dim 32
    assert not cpu_extend.usable(q.half(), batch.k_buffer.half(), batch.v_buffer.half())
