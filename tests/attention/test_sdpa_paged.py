"""The torch backend's fused path (`sdpa_paged`) against the masked reference, on paged batches."""

import pytest
import torch

from radixkv.attention import sdpa_paged, sdpa_plan
from radixkv.kernels import reference
from tests.kernels.paged_batch import assert_close, make_paged_batch, randn

F32 = torch.float32


def run_both(seq_lens, prefix_lens, *, hq=6, hkv=2, d=16, page_size=4, seed=0):
    """(fused output, reference output) for one batch; new K/V are stored in the pool first,
    as the backend does, and passed separately as the model passes them."""
    batch = make_paged_batch(seq_lens, prefix_lens, page_size=page_size, num_kv_heads=hkv,
                             head_dim=d, dtype=F32, seed=seed)
    t = batch.out_cache_loc.shape[0]
    q = randn(t, hq, d, dtype=F32, seed=seed + 1)  # (T, Hq, D)
    k = randn(t, hkv, d, dtype=F32, seed=seed + 2)  # (T, Hkv, D)
    v = randn(t, hkv, d, dtype=F32, seed=seed + 3)
    reference.store_kv(batch.k_buffer, batch.v_buffer, batch.out_cache_loc, k, v)
    plan = sdpa_plan.plan(batch.req_to_token, batch.req_pool_indices, batch.seq_lens,
                           batch.prefix_lens, batch.extend_start_loc, t)
    fused = sdpa_paged.attention(q, k, v, batch.k_buffer, batch.v_buffer, plan, d**-0.5)
    expected = reference.extend_attention(q, *batch.extend_args(), d**-0.5)
    return fused, expected, plan


@pytest.mark.parametrize("seq_lens,prefix_lens", [
    ([37], [0]),  # cold prefill
    ([37], [29]),  # cached prefix + extend, split mid-page
    ([20, 9, 33], [0, 4, 32]),  # prefill, extend, and a 1-token chunk
])
def test_extend_matches_reference(seq_lens, prefix_lens):
    fused, expected, _ = run_both(seq_lens, prefix_lens)
    assert_close(fused, expected)


@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (6, 1)])  # MHA, GQA, MQA
def test_mixed_batch_of_decode_rows_and_prefill_chunks_matches_reference(hq, hkv):
    seq_lens, prefix_lens = [12, 40, 7, 25, 19], [11, 0, 6, 10, 18]  # rows 0, 2, 4 decode
    fused, expected, plan = run_both(seq_lens, prefix_lens, hq=hq, hkv=hkv, seed=3)
    assert len(plan.spans) == 2 and plan.decode is not None and not plan.decode.all_rows
    assert_close(fused, expected)


def test_decode_batch_with_unequal_lengths_is_padded_and_masked():
    fused, expected, plan = run_both([9, 30, 1], [8, 29, 0], seed=5)
    assert plan.decode.all_rows and plan.decode.mask is not None
    assert_close(fused, expected)


def test_lone_sequence_on_consecutive_slots_is_read_in_place():
    # page_size equal to the length: one page, consecutive slots
    fused, expected, plan = run_both([16], [15], page_size=16, seed=7)
    assert plan.decode.first_slot is not None
    assert_close(fused, expected)
    # scattered pages: the gather is used
    _, _, scattered = run_both([16], [15], page_size=2, seed=7)
    assert scattered.decode.first_slot is None


def test_merge_of_two_key_sets_equals_attention_over_their_union():
    q = randn(1, 3, 5, 8, dtype=F32, seed=1)  # (1, H, n, D)
    ka, kb = randn(1, 3, 7, 8, dtype=F32, seed=2), randn(1, 3, 4, 8, dtype=F32, seed=3)
    va, vb = randn(1, 3, 7, 8, dtype=F32, seed=4), randn(1, 3, 4, 8, dtype=F32, seed=5)
    oa, la = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, ka, va, 0.0, False, scale=0.3)
    ob, lb = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, kb, vb, 0.0, False, scale=0.3)
    union = torch.nn.functional.scaled_dot_product_attention(
        q, torch.cat([ka, kb], 2), torch.cat([va, vb], 2), scale=0.3)
    assert_close(sdpa_paged.merge(oa, la, ob, lb), union)


def shared_prefix_batch(prefix_lens, tails, groups=None, *, hq=6, hkv=2, d=16, seed=11):
    """Decode rows; row b reads prefix `groups[b]` (shared slots; -1: none), then its own tail."""
    if isinstance(prefix_lens, int):
        prefix_lens = [prefix_lens]
    groups = groups or [0] * len(tails)
    gen = torch.Generator().manual_seed(seed)
    total = sum(prefix_lens) + sum(tails) + 8
    k_buffer = torch.randn(total, hkv, d, generator=gen)
    v_buffer = torch.randn(total, hkv, d, generator=gen)
    free = (torch.randperm(total - 1, generator=gen) + 1).tolist()  # scattered slots
    prefixes = [torch.tensor([free.pop() for _ in range(n)], dtype=torch.int64) for n in prefix_lens]
    lens = [(prefix_lens[g] if g >= 0 else 0) + n for g, n in zip(groups, tails)]
    req_to_token = torch.zeros(len(tails) + 1, max(lens) + 1, dtype=torch.int32)
    for b, (g, n) in enumerate(zip(groups, tails)):
        own = torch.tensor([free.pop() for _ in range(n)], dtype=torch.int64)
        seq = torch.cat([prefixes[g], own]) if g >= 0 else own
        req_to_token[b + 1, : len(seq)] = seq.int()
    B = len(tails)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    rows = torch.arange(1, B + 1)
    starts = torch.arange(B, dtype=torch.int32)
    q = torch.randn(B, hq, d, generator=gen)
    plan = sdpa_plan.plan(req_to_token, rows, seq_lens, seq_lens - 1, starts, B)
    fused = sdpa_paged.attention(q, None, None, k_buffer, v_buffer, plan, d**-0.5)
    expected = reference.decode_attention(q, k_buffer, v_buffer, req_to_token, rows, seq_lens, d**-0.5)
    return fused, expected, plan


@pytest.mark.parametrize("tails", [[3, 3, 3, 3], [1, 7, 2, 12, 5]])
def test_rows_sharing_a_prefix_read_it_once_and_match_reference(tails):
    fused, expected, plan = shared_prefix_batch(600, tails)
    assert len(plan.decode.shared) == 1 and plan.decode.shared[0].slots.shape[0] == 600
    assert plan.decode.max_len == max(tails)  # the padded gather covers only the tails
    assert_close(fused, expected)


def test_short_shared_prefixes_are_not_worth_a_separate_pass():
    fused, expected, plan = shared_prefix_batch(40, [2, 3])
    assert plan.decode.shared == []
    assert_close(fused, expected)


def test_two_shared_prefixes_and_a_row_of_its_own_in_one_decode_batch():
    fused, expected, plan = shared_prefix_batch([700, 1100], [4, 9, 2, 30, 6, 1], groups=[0, 1, 0, -1, 1, 0])
    assert sorted(s.slots.shape[0] for s in plan.decode.shared) == [700, 1100]
    assert_close(fused, expected)


def shared_extend_batch(shared_len, own_prefix, new, *, hq=6, hkv=2, d=16, seed=5):
    """Extend requests: request b's prefix is the shared `shared_len` slots then `own_prefix[b]`
    slots of its own (shared_len 0 for b in `alone`), then `new[b]` new tokens."""
    gen = torch.Generator().manual_seed(seed)
    total = shared_len + sum(own_prefix) + sum(new) + 8
    k_buffer = torch.randn(total, hkv, d, generator=gen)
    v_buffer = torch.randn(total, hkv, d, generator=gen)
    free = (torch.randperm(total - 1, generator=gen) + 1).tolist()  # scattered slots
    shared = [free.pop() for _ in range(shared_len)]
    B = len(new)
    seqs = [shared + [free.pop() for _ in range(own_prefix[b] + new[b])] for b in range(B)]
    req_to_token = torch.zeros(B + 1, max(map(len, seqs)) + 1, dtype=torch.int32)
    for b, seq in enumerate(seqs):
        req_to_token[b + 1, : len(seq)] = torch.tensor(seq, dtype=torch.int32)
    seq_lens = torch.tensor([len(s) for s in seqs], dtype=torch.int32)
    prefix_lens = torch.tensor([shared_len + p for p in own_prefix], dtype=torch.int32)
    starts = torch.tensor([sum(new[:b]) for b in range(B)], dtype=torch.int32)
    loc = torch.cat([req_to_token[b + 1, prefix_lens[b]: seq_lens[b]].long() for b in range(B)])
    T = sum(new)
    q, k, v = (torch.randn(T, h, d, generator=gen) for h in (hq, hkv, hkv))
    reference.store_kv(k_buffer, v_buffer, loc, k, v)
    rows = torch.arange(1, B + 1)
    plan = sdpa_plan.plan(req_to_token, rows, seq_lens, prefix_lens, starts, T)
    fused = sdpa_paged.attention(q, k, v, k_buffer, v_buffer, plan, d**-0.5)
    expected = reference.extend_attention(q, k_buffer, v_buffer, req_to_token, rows, seq_lens, prefix_lens,
                                          starts, max(new), d**-0.5)
    return fused, expected, plan


@pytest.mark.parametrize("own_prefix,new", [
    ([0, 0, 0, 0], [7, 7, 7, 7]),  # four questions on one document
    ([0, 5, 0, 33], [3, 12, 1, 6]),  # some also have turns of their own, one is a 1-token row
])
def test_extends_sharing_a_prefix_attend_to_it_once_and_match_reference(own_prefix, new):
    fused, expected, plan = shared_extend_batch(700, own_prefix, new)
    extends = [i for i, n in enumerate(new) if n > 1]
    assert len(plan.shared_extends) == 1 and plan.shared_extends[0].slots.shape[0] == 700
    assert sorted(plan.shared_extends[0].spans) == list(range(len(extends)))
    assert_close(fused, expected)


def test_short_shared_extend_prefixes_are_attended_per_request():
    fused, expected, plan = shared_extend_batch(30, [0, 2], [5, 6])
    assert not plan.shared_extends
    assert_close(fused, expected)


@pytest.mark.parametrize("n,prefix", [(70, 1100), (20, 1100), (70, 100)])
def test_folding_query_heads_of_a_kv_head_into_rows_changes_nothing(n, prefix):
    """The folded flash call (64-191 new tokens on a long prefix) equals one call per query head."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 6, n, 16, generator=gen)
    k, v = (torch.randn(1, 2, prefix, 16, generator=gen) for _ in range(2))
    o, lse = sdpa_paged.unmasked(q, k, v, 0.25)
    want_o, want_lse = sdpa_paged._flash(q, k, v, 0.0, False, scale=0.25)
    assert_close(o, want_o)
    assert_close(lse, want_lse)


def test_a_long_cached_prefix_with_grouped_heads_matches_reference():
    fused, expected, _ = run_both([1100 + 90], [1100], hq=6, hkv=2)
    assert_close(fused, expected)


@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (6, 1)])
def test_short_extend_rows_go_through_one_padded_call_and_match_reference(hq, hkv):
    """Verify rows of speculative decoding (the last token + 1-4 drafts) beside plain decode
    rows and a long extend: the short ones are batched, and every output equals the reference."""
    seq_lens, prefix_lens = [30, 12, 50, 9, 44, 70], [27, 11, 45, 8, 40, 20]
    fused, expected, plan = run_both(seq_lens, prefix_lens, hq=hq, hkv=hkv, seed=5)
    assert plan.short is not None and plan.short.queries.shape == (3, 5)  # rows 0, 2, 4: 3-5 new tokens each
    assert len(plan.spans) - len(plan.short_spans) == 1 and plan.decode is not None  # the 50-token extend; 2 decode rows
    assert_close(fused, expected)


def test_a_lone_short_extend_row_keeps_the_flash_path():
    _, _, plan = run_both([30, 12], [26, 11])
    assert plan.short is None and len(plan.spans) == 1 and not plan.short_spans
