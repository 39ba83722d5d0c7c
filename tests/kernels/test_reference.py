"""The torch references against a per-token loop with the softmax written out, in float64."""

import math

import pytest
import torch

from radixkv.kernels import reference
from tests.kernels.paged_batch import make_paged_batch, randn


def naive_attention(q_vec, keys, values, scale):
    """One query (Hq, D) over L keys/values of (H_kv, D) each: explicit softmax, per head, float64."""
    group = q_vec.shape[0] // keys[0].shape[0]
    out = torch.empty(q_vec.shape, dtype=torch.float64)  # (Hq, D)
    for h in range(q_vec.shape[0]):
        scores = [float(q_vec[h].double() @ k[h // group].double()) * scale for k in keys]
        top = max(scores)
        weights = [math.exp(s - top) for s in scores]
        total = sum(weights)
        out[h] = sum(w / total * v[h // group].double() for w, v in zip(weights, values))
    return out


def naive_token_attention(batch, q_vec, b, position, window):
    """What the query at absolute `position` of request `b` sees, computed token by token."""
    row = int(batch.req_pool_indices[b])
    lo = 0 if window is None else max(0, position - window + 1)
    slots = [int(batch.req_to_token[row, j]) for j in range(lo, position + 1)]
    keys = [batch.k_buffer[s] for s in slots]  # L x (H_kv, D)
    values = [batch.v_buffer[s] for s in slots]  # L x (H_kv, D)
    return naive_attention(q_vec, keys, values, q_vec.shape[-1] ** -0.5)


@pytest.mark.parametrize("window", [None, 3])
def test_reference_extend_matches_per_token_softmax(window):
    batch = make_paged_batch([5, 7], [0, 3], page_size=2, num_kv_heads=2, head_dim=4,
                             dtype=torch.float32)
    q = randn(9, 4, 4, dtype=torch.float32)  # (T, Hq, D)
    o = reference.extend_attention(q, *batch.extend_args(), 4 ** -0.5, window)  # (T, Hq, D)
    t = 0
    for b, (seq_len, prefix_len) in enumerate([(5, 0), (7, 3)]):
        for position in range(prefix_len, seq_len):
            expected = naive_token_attention(batch, q[t].cpu(), b, position, window)
            torch.testing.assert_close(o[t].cpu().double(), expected, atol=1e-5, rtol=1e-5)
            t += 1


@pytest.mark.parametrize("window", [None, 3])
def test_reference_decode_matches_per_token_softmax(window):
    seq_lens = [1, 6, 4]
    batch = make_paged_batch(seq_lens, [n - 1 for n in seq_lens], page_size=4, num_kv_heads=1,
                             head_dim=4, dtype=torch.float32)
    q = randn(3, 3, 4, dtype=torch.float32)  # (B, Hq, D)
    o = reference.decode_attention(q, *batch.decode_args(), 4 ** -0.5, window)  # (B, Hq, D)
    for b, seq_len in enumerate(seq_lens):
        expected = naive_token_attention(batch, q[b].cpu(), b, seq_len - 1, window)
        torch.testing.assert_close(o[b].cpu().double(), expected, atol=1e-5, rtol=1e-5)


def test_reference_store_kv_writes_only_the_given_slots_in_buffer_dtype():
    k_buffer = torch.zeros(10, 2, 4, dtype=torch.float16)  # (S, H_kv, D)
    v_buffer = torch.zeros(10, 2, 4, dtype=torch.float16)  # (S, H_kv, D)
    loc = torch.tensor([7, 2, 5])  # (T,)
    k = torch.randn(3, 2, 4)  # (T, H_kv, D) fp32
    v = torch.randn(3, 2, 4)  # (T, H_kv, D)
    reference.store_kv(k_buffer, v_buffer, loc, k, v)
    assert torch.equal(k_buffer[loc], k.half()) and torch.equal(v_buffer[loc], v.half())
    untouched = torch.ones(10, dtype=torch.bool)
    untouched[loc] = False
    assert not k_buffer[untouched].any() and not v_buffer[untouched].any()


def test_a_sliding_window_reads_only_its_window_however_long_the_context():
    """A 300-token prefill and a decode at 301 with a window of 8: every query block gathers at
    most window_block + window - 1 keys (work proportional to the window), and every token
    still equals the per-token softmax over its window."""
    window = 8
    batch = make_paged_batch([300, 301], [0, 300], page_size=4, num_kv_heads=1, head_dim=4, dtype=torch.float32)
    plan = reference.plan_extend(batch.req_to_token, batch.req_pool_indices, batch.seq_lens, batch.prefix_lens,
                                 batch.extend_start_loc, window)
    block = reference.window_block(window)
    assert max(s.shape[0] for s in plan.slots) <= block + window - 1
    assert sum(m.numel() for m in plan.masks) <= 301 * (block + window - 1)  # not 300 * 300 / 2
    decode = reference.plan_decode(batch.req_to_token, batch.req_pool_indices, batch.seq_lens, window)
    assert decode.max_len == window
    q = randn(301, 2, 4, dtype=torch.float32)
    o = reference.extend_attention(q, *batch.extend_args(), 4 ** -0.5, window)
    for t in (0, 7, 8, 70, 299):
        assert torch.allclose(o[t].double(), naive_token_attention(batch, q[t], 0, t, window), atol=1e-5)
    assert torch.allclose(o[300].double(), naive_token_attention(batch, q[300], 1, 300, window), atol=1e-5)
