"""The C++ paged decode kernel (`radixkv.attention.cpu_decode`) against torch's SDPA path of
`decode_rows` (the kernel switched off), on planned decode batches: ragged lengths, GQA groups,
shared prefixes (cascade), scattered and consecutive slots; and its fallbacks."""

import math

import pytest
import torch

from radixkv import native
from radixkv.attention import cpu_decode
from radixkv.errors import CacheInvariantError
from radixkv.attention.sdpa_paged import decode_rows
from radixkv.attention.sdpa_plan import _plan_decode

pytestmark = pytest.mark.skipif(cpu_decode.library() is None, reason="no C++ compiler to build the kernel")


def planned(lens, shared_prefix=0, scattered=True, slots=4096, seed=0):
    """A decode plan over a request table whose rows have `lens` tokens, the first
    `shared_prefix` of them on the same slots (a cached system prompt)."""
    g = torch.Generator().manual_seed(seed)
    B = len(lens)
    table = torch.zeros(B + 1, max(lens) + 1, dtype=torch.int32)
    free = torch.randperm(slots - 1, generator=g) + 1 if scattered else torch.arange(1, slots)
    at = shared_prefix
    table[:B, :shared_prefix] = free[:shared_prefix].int()
    for b, n in enumerate(lens):
        own = n - shared_prefix
        table[b, shared_prefix:n] = free[at: at + own].int()
        at += own
    return _plan_decode(table, torch.arange(B), torch.tensor(lens), torch.arange(B), list(range(B)), B)


@pytest.mark.parametrize("lens,heads,kv_heads,dim,shared,scattered", [
    ([1], 4, 4, 64, 0, True),
    ([37], 9, 3, 64, 0, False),  # one row on consecutive slots: the in-place narrow of the SDPA path
    ([5, 90, 17], 9, 3, 64, 0, True),  # ragged: padding never read
    ([333], 14, 2, 64, 0, True),  # batch 1: a work item per KV head; 7 query heads each (4 + 3 in the V pass)
    ([48, 16, 31, 15], 10, 2, 64, 0, True),  # whole 16-slot blocks of scores, a block and a tail, only a tail
    ([200] * 8, 8, 2, 128, 0, True),
    ([700, 650, 690, 701, 699], 6, 1, 64, 600, True),  # a shared prefix: cascade merges with the kernel's lse
    ([1100, 1030, 1200], 4, 2, 32, 1024, False),
])
def test_the_kernel_matches_the_sdpa_path(lens, heads, kv_heads, dim, shared, scattered):
    torch.manual_seed(len(lens) * dim + heads)
    k_buffer, v_buffer = torch.randn(4096, kv_heads, dim), torch.randn(4096, kv_heads, dim)
    q = torch.randn(len(lens), heads, dim)
    d = planned(lens, shared, scattered)
    assert bool(d.shared) == bool(shared)
    ours = decode_rows(q, k_buffer, v_buffer, d, 1 / math.sqrt(dim))
    lib = cpu_decode.library()
    cpu_decode.KERNEL.set(None)
    try:
        ref = decode_rows(q, k_buffer, v_buffer, d, 1 / math.sqrt(dim))
    finally:
        cpu_decode.KERNEL.set(lib)
    torch.testing.assert_close(ours, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("sharpness", [1.0, 60.0])  # 60: scores spread over hundreds, most weights underflow
def test_log_sum_exps_are_those_of_the_scaled_scores(sharpness):
    torch.manual_seed(3)
    B, Hq, Hkv, D, L = 3, 6, 2, 64, 50
    k_buffer, v_buffer = torch.randn(512, Hkv, D), torch.randn(512, Hkv, D)
    q = torch.randn(B, Hq, D) * sharpness
    slots = torch.randperm(512)[: B * L].view(B, L).long()
    lens = torch.tensor([50, 1, 23])
    out, lse = cpu_decode.paged_decode(q, k_buffer, v_buffer, slots, lens, 0.125, with_lse=True)
    for b in range(B):
        n = int(lens[b])
        k = k_buffer[slots[b, :n]].repeat_interleave(Hq // Hkv, dim=1)  # (n, Hq, D)
        v = v_buffer[slots[b, :n]].repeat_interleave(Hq // Hkv, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b], k) * 0.125  # (Hq, n)
        torch.testing.assert_close(lse[b], torch.logsumexp(scores, -1), atol=1e-5 * sharpness, rtol=1e-5)
        torch.testing.assert_close(out[b], torch.einsum("hn,nhd->hd", scores.softmax(-1), v), atol=1e-5, rtol=1e-4)


def test_other_dtypes_and_views_take_the_sdpa_path():
    q = torch.randn(2, 4, 64)
    k = torch.randn(64, 4, 64)
    assert cpu_decode.usable(q, k, k)
    assert not cpu_decode.usable(q.bfloat16(), k.bfloat16(), k.bfloat16())
    assert not cpu_decode.usable(q, k.transpose(0, 1), k)  # not the pool's contiguous layout


def test_without_a_compiler_or_when_switched_off_there_is_no_kernel(monkeypatch, tmp_path):
    lib = cpu_decode.library()
    try:
        monkeypatch.setenv("RADIXKV_CACHE_DIR", str(tmp_path))
        monkeypatch.setenv("CXX", "/bin/false")  # "compiles" nothing, and fails
        cpu_decode.KERNEL.forget()
        assert cpu_decode.library() is None
        assert not list((tmp_path / "kernels").glob("*.so"))
        monkeypatch.delenv("CXX")
        monkeypatch.setenv(native.ENV_SWITCH, "0")
        cpu_decode.KERNEL.forget()
        assert cpu_decode.library() is None
        monkeypatch.delenv(native.ENV_SWITCH)
        cpu_decode.KERNEL.forget()
        assert cpu_decode.library() is not None  # built afresh into the new cache root
        assert len(list((tmp_path / "kernels").glob("paged_decode-*.so"))) == 1
    finally:
        cpu_decode.KERNEL.set(lib)


def test_slots_outside_the_pool_raise_instead_of_reading_past_it():
    q, k = torch.randn(2, 4, 64), torch.randn(64, 2, 64)
    slots = torch.tensor([[0, 1, 2], [3, 64, 5]])  # row 1 lists slot 64 of a 64-slot pool
    with pytest.raises(CacheInvariantError, match="1 of 2 rows"):
        cpu_decode.paged_decode(q, k, k, slots, torch.tensor([3, 3]), 0.125)
    out, _ = cpu_decode.paged_decode(q, k, k, slots, torch.tensor([3, 1]), 0.125)  # beyond its length: unread
    assert torch.isfinite(out).all()
    with pytest.raises(CacheInvariantError):
        cpu_decode.paged_decode(q, k, k, slots, torch.tensor([4, 1]), 0.125)  # longer than its columns
