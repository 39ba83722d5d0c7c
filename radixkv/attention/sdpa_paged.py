"""Paged attention on torch's fused CPU attention kernel, without dense masks.

The `torch` backend's path on CPU. The reference in `radixkv.kernels.reference` builds a
(new tokens x whole sequence) boolean mask per request, which sends SDPA down its "math" path:
full score matrices, no causal skipping (12.5 s of a 20 s cold 2k-token prefill). Here each
request's attention is split where the mask has a simple shape:

- **Extend** (a request with 2+ new tokens after `P` cached ones): the new block attends to
  itself causally, and to the whole prefix without a mask. Both are flash calls
  (`_scaled_dot_product_flash_attention_for_cpu`, which skips masked tiles, handles GQA
  without repeating K/V heads, and returns the log-sum-exp of each row); the two partial
  results merge exactly by their log-sum-exps. The new block's K/V come straight from the
  forward; only the prefix is gathered from the pool.
- **Decode-shaped rows** (one new token: decode steps, and 1-token prefill chunks of a mixed
  batch): one padded gather of every such row's KV and one SDPA call for all of them, with a
  padding mask only when their lengths differ.
- **Shared prefixes in decode** (cascade attention): rows that read the same cached prefix
  (a system prompt, the trunk before a fork; the radix cache hands them the same pages) attend
  to it in one flash call whose query rows are all of theirs, so its K/V are read once per
  step instead of once per row; each row's own suffix goes through the padded path, and the
  two parts merge by log-sum-exp. With 32 requests on one 2k-token prompt this cuts the KV a
  step reads 32-fold.

- **Shared prefixes in extend** (cascade extend): requests of one prefill batch that extend the
  same cached prefix (16 questions about one 2k-token document) attend to it in one flash call
  whose query rows are all of their new tokens: the prefix's K/V are gathered and read once,
  and one large product replaces one per request. Each request's own part (the rest of its
  prefix, and its new tokens causally) merges with it by log-sum-exp.

- **Short extends** (rows of a few new tokens: speculative decoding's verify rows, the last
  token + its drafts): attended together like decode rows, one padded gather of each row's
  whole KV and one SDPA call with a causal-and-padding mask, instead of two flash calls per
  row (at 8 rows of 5 tokens, 143 ms a forward against 69 ms for plain decode before this).

Sliding-window layers keep the reference's masked path (the fused kernel has no window).
Every function here is tested against the reference. Which rows take which path is decided
once per forward by `sdpa_plan.plan`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixkv.attention import cpu_decode, cpu_extend
from radixkv.attention.sdpa_plan import DecodeRows, ExtendSpan, SdpaPlan, ShortRows

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
FOLD_MIN_PREFIX, FOLD_ROWS = 1024, (64, 1024)  # where folding GQA heads into rows pays (`unmasked`)


def short_rows(q: torch.Tensor, k_buffer, v_buffer, s: ShortRows, sm_scale: float) -> torch.Tensor:
    """Short extend rows in one padded SDPA call: (B * N, Hq, D) outputs, row-major over
    (row, new token), padding included (the caller keeps the valid ones)."""
    B, N = s.queries.shape
    Hq, D = q.shape[1:]
    H = k_buffer.shape[1]
    qs = q.index_select(0, s.queries.reshape(-1)).float().view(B, N, Hq, D).transpose(1, 2)  # (B, Hq, N, D)
    k = k_buffer.index_select(0, s.slots).float().view(B, s.max_len, H, D).transpose(1, 2)  # (B, Hkv, L, D)
    v = v_buffer.index_select(0, s.slots).float().view(B, s.max_len, H, D).transpose(1, 2)
    out = F.scaled_dot_product_attention(qs, k, v, attn_mask=s.mask, scale=sm_scale, enable_gqa=H != Hq)  # (B, Hq, N, D)
    return out.transpose(1, 2).reshape(B * N, Hq, D)


def attention(
    q: torch.Tensor,  # (T, Hq, D) new tokens' queries
    k: torch.Tensor,  # (T, Hkv, D) new tokens' keys (already stored in the pool)
    v: torch.Tensor,  # (T, Hkv, D)
    k_buffer: torch.Tensor,  # (S, Hkv, D) the pool's read view of this layer (dequantises what it gathers)
    v_buffer: torch.Tensor,  # (S, Hkv, D)
    p: SdpaPlan,
    sm_scale: float,
    loc: torch.Tensor | None = None,  # (T,) the new tokens' slots
) -> torch.Tensor:  # (T, Hq, D)
    """Causal attention of each request's new tokens over its prefix and themselves.

    When the pool keeps K/V in another format (`k_buffer` is a dequantising view), the new
    tokens' K/V are read back from their slots, so every token attends to what the pool stores
    -- the same values a later request, or another backend, will see -- whatever the chunking."""
    if loc is not None and not isinstance(k_buffer, torch.Tensor):
        k, v = k_buffer.index_select(0, loc), v_buffer.index_select(0, loc)  # (T, Hkv, D) as stored
    d = p.decode
    if d is not None and d.all_rows:
        return decode_rows(q, k_buffer, v_buffer, d, sm_scale)
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # (T, Hq, D) contiguous
    for g in p.shared_extends:
        shared_extend(q, k, v, k_buffer, v_buffer, [p.spans[i] for i in g.spans], g.slots, sm_scale, o)
    if p.kernel_rows is not None and cpu_extend.usable(q, k_buffer, v_buffer):
        cpu_extend.paged_extend(q, k_buffer, v_buffer, p.kernel_rows, sm_scale, o)  # every other row
        return o
    in_group = {i for g in p.shared_extends for i in g.spans} | p.short_spans
    for i, s in enumerate(p.spans):
        if i not in in_group:
            new = slice(s.start, s.start + s.num_new)
            o[new] = extend_span(q[new], k[new], v[new], k_buffer, v_buffer, s.prefix_slots, sm_scale)
    if p.short is not None:
        valid = p.short.valid.reshape(-1)  # (B * N,)
        o.index_copy_(0, p.short.queries.reshape(-1)[valid],
                      short_rows(q, k_buffer, v_buffer, p.short, sm_scale)[valid].to(o.dtype))
    if d is not None:
        o.index_copy_(0, d.rows, decode_rows(q.index_select(0, d.rows), k_buffer, v_buffer, d, sm_scale))
    return o


def extend_span(
    q: torch.Tensor,  # (n, Hq, D)
    k: torch.Tensor,  # (n, Hkv, D)
    v: torch.Tensor,  # (n, Hkv, D)
    k_buffer: torch.Tensor,  # (S, Hkv, D)
    v_buffer: torch.Tensor,  # (S, Hkv, D)
    prefix_slots: torch.Tensor | None,  # (P,)
    sm_scale: float,
) -> torch.Tensor:  # (n, Hq, D)
    """One request: causal over its n new tokens, unmasked over its P-token prefix, merged."""
    o, _ = extend_span_parts(q, k, v, k_buffer, v_buffer, prefix_slots, sm_scale)
    return o[0].transpose(0, 1).to(q.dtype)


def extend_span_parts(q, k, v, k_buffer, v_buffer, prefix_slots, sm_scale) -> tuple[torch.Tensor, torch.Tensor]:
    """`extend_span` before its last reshape: (1, Hq, n, D) float32 output and (1, Hq, n) lse."""
    qh = q.float().transpose(0, 1)[None]  # (1, Hq, n, D), a view of (n, Hq, D) memory
    o_new, lse_new = _flash(qh, k.float().transpose(0, 1)[None], v.float().transpose(0, 1)[None],
                            0.0, True, scale=sm_scale)  # (1, Hq, n, D), (1, Hq, n)
    if prefix_slots is None:
        return o_new, lse_new
    kp = k_buffer.index_select(0, prefix_slots).float().transpose(0, 1)[None]  # (1, Hkv, P, D)
    vp = v_buffer.index_select(0, prefix_slots).float().transpose(0, 1)[None]  # (1, Hkv, P, D)
    o_pre, lse_pre = unmasked(qh, kp, vp, sm_scale)  # (1, Hq, n, D), (1, Hq, n)
    return merge(o_new, lse_new, o_pre, lse_pre), torch.logaddexp(lse_new, lse_pre)


def unmasked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Flash attention of q (1, Hq, n, D) over every key of k, v (1, Hkv, P, D): (1, Hq, n, D) and
    (1, Hq, n) log-sum-exps.

    Without a mask, the query heads of one KV head are rows of one problem: folded into
    (1, Hkv, g * n, D), the kernel works in 64-row blocks instead of 32 and reads each K/V
    block once per group. Measured on 2 cores: 1.13-1.31x for 64-191 new tokens over a 1k-4k
    prefix, neutral to slower elsewhere, so only there."""
    Hq, n, D = q.shape[1:]
    H = k.shape[1]
    if H == Hq or k.shape[2] < FOLD_MIN_PREFIX or not FOLD_ROWS[0] <= n < FOLD_ROWS[1]:
        return _flash(q, k, v, 0.0, False, scale=sm_scale)
    o, lse = _flash(q.reshape(1, H, Hq // H * n, D), k, v, 0.0, False, scale=sm_scale)  # (1, Hkv, g*n, D)
    return o.reshape(1, Hq, n, D), lse.reshape(1, Hq, n)


def shared_extend(
    q: torch.Tensor,  # (T, Hq, D)
    k: torch.Tensor,  # (T, Hkv, D)
    v: torch.Tensor,  # (T, Hkv, D)
    k_buffer: torch.Tensor,  # (S, Hkv, D)
    v_buffer: torch.Tensor,  # (S, Hkv, D)
    spans: list[ExtendSpan],  # their prefix_slots: what follows the shared part
    shared_slots: torch.Tensor,  # (P,)
    sm_scale: float,
    out: torch.Tensor,  # (T, Hq, D) written at each span's rows
) -> None:
    """Several requests extending one cached prefix: every new token of theirs attends to the
    shared prefix in one flash call; each request's own part merges in by log-sum-exp."""
    dtype = q.dtype
    index = torch.cat([torch.arange(s.start, s.start + s.num_new, device=q.device) for s in spans])  # (M,)
    q_all = q.index_select(0, index).float().transpose(0, 1)[None]  # (1, Hq, M, D)
    kp = k_buffer.index_select(0, shared_slots).float().transpose(0, 1)[None]  # (1, Hkv, P, D)
    vp = v_buffer.index_select(0, shared_slots).float().transpose(0, 1)[None]
    o_shared, lse_shared = _flash(q_all, kp, vp, 0.0, False, scale=sm_scale)  # (1, Hq, M, D), (1, Hq, M)
    at = 0
    for s in spans:
        rows = slice(at, at + s.num_new)
        at += s.num_new
        new = slice(s.start, s.start + s.num_new)
        o_own, lse_own = extend_span_parts(q[new], k[new], v[new], k_buffer, v_buffer, s.prefix_slots, sm_scale)
        merged = merge(o_own, lse_own, o_shared[:, :, rows], lse_shared[:, :, rows])  # (1, Hq, n, D)
        out[new] = merged[0].transpose(0, 1).to(dtype)


def merge(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """Softmax attention over the union of two disjoint key sets from each one's result.

    o_*: (..., n, D) normalised outputs; lse_*: (..., n) log-sum-exp of each row's scores.
    """
    lse = torch.logaddexp(lse_a, lse_b)  # (..., n)
    w_a = torch.exp(lse_a - lse).unsqueeze(-1)  # (..., n, 1)
    w_b = torch.exp(lse_b - lse).unsqueeze(-1)
    return o_a * w_a + o_b * w_b  # (..., n, D)


def decode_rows(
    q: torch.Tensor,  # (B, Hq, D) one query per row
    k_buffer: torch.Tensor,  # (S, Hkv, D)
    v_buffer: torch.Tensor,
    d: DecodeRows,
    sm_scale: float,
) -> torch.Tensor:  # (B, Hq, D)
    """Each row's query over its whole KV: one gather and one SDPA call, plus one flash call per
    shared prefix.

    The query heads of one KV head form the rows of one attention problem, so K/V are gathered
    once per KV head and never repeated (GQA without expansion).
    """
    B, Hq, D = q.shape
    H = k_buffer.shape[1]
    if cpu_decode.usable(q, k_buffer, v_buffer):  # K/V read in place (C++)
        return kernel_decode_rows(q, k_buffer, v_buffer, d, sm_scale)
    if d.first_slot is not None:
        k = k_buffer.narrow(0, d.first_slot, d.max_len)  # (L, Hkv, D), a view of the pool
        v = v_buffer.narrow(0, d.first_slot, d.max_len)
    else:
        k = k_buffer.index_select(0, d.slots)  # (B * L, Hkv, D)
        v = v_buffer.index_select(0, d.slots)
    k = k.float().view(B, d.max_len, H, D).transpose(1, 2)  # (B, Hkv, L, D)
    v = v.float().view(B, d.max_len, H, D).transpose(1, 2)  # (B, Hkv, L, D)
    q_grouped = q.float().reshape(B, H, Hq // H, D)  # (B, Hkv, group, D)
    if not d.shared:
        out = F.scaled_dot_product_attention(q_grouped, k, v, attn_mask=d.mask, scale=sm_scale)
        return out.reshape(B, Hq, D).to(q.dtype)  # (B, Hkv, group, D) -> (B, Hq, D)
    out, lse = _flash(q_grouped, k, v, 0.0, False, attn_mask=d.mask, scale=sm_scale)  # (B, Hkv, g, D), (B, Hkv, g)
    out, lse = out.reshape(B, Hq, D), lse.reshape(B, Hq)
    for s in d.shared:
        out = _merge_shared(q, k_buffer, v_buffer, s, sm_scale, out, lse)
    return out.to(q.dtype)


def kernel_decode_rows(
    q: torch.Tensor,  # (B, Hq, D) fp32, each row's (Hq, D) contiguous
    k_buffer: torch.Tensor,  # (S, Hkv, D) fp32, contiguous (`cpu_decode.usable`)
    v_buffer: torch.Tensor,
    d: DecodeRows,
    sm_scale: float,
    store: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,  # new k, v (B, Hkv, D), slots (B,)
) -> torch.Tensor:  # (B, Hq, D)
    """`decode_rows` on the C++ kernel, which reads K/V in place; with `store`, the kernel first
    writes this step's new K/V at their slots (the torch backend's direct decode path)."""
    B = q.shape[0]
    out, lse = cpu_decode.paged_decode(q, k_buffer, v_buffer, d.slots.view(B, d.max_len), d.lens, sm_scale,
                                       with_lse=bool(d.shared), store=store)
    for s in d.shared:
        out = _merge_shared(q, k_buffer, v_buffer, s, sm_scale, out, lse)
    return out


def _merge_shared(q, k_buffer, v_buffer, s, sm_scale: float, out: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Rows `s.rows` of `out` (B, Hq, D) float32 with log-sum-exps `lse` (B, Hq) over their own
    part, merged with their attention over shared prefix `s` (one flash call for all of them;
    the query heads of a KV head are rows of one problem). Both decode paths end here."""
    B, Hq, D = q.shape
    H = k_buffer.shape[1]
    n, g = s.rows.shape[0], Hq // H
    q_s = q.index_select(0, s.rows).float().reshape(n, H, g, D)  # (n, Hkv, g, D)
    q_s = q_s.transpose(0, 1).reshape(1, H, n * g, D)  # (1, Hkv, n*g, D)
    k_s = k_buffer.index_select(0, s.slots).float().transpose(0, 1)[None]  # (1, Hkv, P, D)
    v_s = v_buffer.index_select(0, s.slots).float().transpose(0, 1)[None]
    o_s, lse_s = _flash(q_s, k_s, v_s, 0.0, False, scale=sm_scale)  # (1, Hkv, n*g, D), (1, Hkv, n*g)
    o_s = o_s[0].view(H, n, g, D).transpose(0, 1).reshape(n, Hq, D)
    lse_s = lse_s[0].view(H, n, g).transpose(0, 1).reshape(n, Hq)
    merged = merge(out.index_select(0, s.rows), lse.index_select(0, s.rows), o_s, lse_s)  # (n, Hq, D)
    return out.index_copy(0, s.rows, merged)
