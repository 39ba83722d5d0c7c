"""Decode attention: one new query per request over its paged KV, split-KV ("flash decoding").

Stage 1 splits each request's visible KV range into `num_kv_splits` chunks; one program owns one
(request, KV head, chunk) and all `group` query heads of that KV head, so each K/V tile is read
once. It writes a partial output and its log-sum-exp in fp32. Stage 2 merges the chunks.
Quantised pools (int8, int4, fp8) are dequantised tile by tile as stage 1 loads them.
"""

import math

import torch
import triton
import triton.language as tl

from ._triton_utils import (block_d, check_kv_format, check_paged_args, dot_fp32, dot_precision,
                            interpreting, load_kv_tile, online_softmax_step)


@triton.jit
def _decode_partial_kernel(
    q, k_buffer, v_buffer, k_scale, v_scale, partial_o, partial_lse, req_to_token,
    req_pool_indices, seq_lens,
    stride_q_b, stride_q_h, stride_buf_s, stride_buf_h, stride_sc_s, stride_sc_h, stride_req,
    stride_po_b, stride_po_h, stride_po_s, stride_lse_b, stride_lse_h,
    qk_scale, window, group, head_dim, scale_group,
    KV_FORMAT: tl.constexpr, HAS_WINDOW: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, DOT_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    seq_len = tl.load(seq_lens + b)
    req_row = tl.load(req_pool_indices + b).to(tl.int64)

    # Visible range [lo, seq_len); chunks are whole BLOCK_N blocks, so short requests use fewer
    # splits and the rest write an empty partial (lse = -inf) that stage 2 weighs as zero.
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(seq_len - window, 0)
    chunk = tl.cdiv(tl.cdiv(seq_len - lo, num_splits), BLOCK_N) * BLOCK_N
    chunk_lo = tl.minimum(lo + split * chunk, seq_len)
    chunk_hi = tl.minimum(chunk_lo + chunk, seq_len)

    offs_h = tl.arange(0, BLOCK_H)  # (BLOCK_H,) query head within the group
    offs_n = tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    offs_d = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
    head = kv_head * group + offs_h  # (BLOCK_H,)
    mask_h = offs_h < group
    mask_d = offs_d < head_dim
    q_ptrs = q + b * stride_q_b + head[:, None] * stride_q_h + offs_d[None, :]
    q_tile = tl.load(q_ptrs, mask=mask_h[:, None] & mask_d[None, :], other=0.0)  # (BLOCK_H, BLOCK_D)
    if DOT_FP32:
        q_tile = q_tile.to(tl.float32)

    m_i = tl.full((BLOCK_H,), -1.0e30, tl.float32)  # (BLOCK_H,) running max, log2 units
    l_i = tl.zeros((BLOCK_H,), tl.float32)  # (BLOCK_H,) running denominator
    acc = tl.zeros((BLOCK_H, BLOCK_D), tl.float32)  # (BLOCK_H, BLOCK_D)
    kv_off = kv_head * stride_buf_h
    sc_off = kv_head * stride_sc_h
    for n0 in range(chunk_lo, chunk_hi, BLOCK_N):
        kv_pos = n0 + offs_n  # (BLOCK_N,)
        mask_n = kv_pos < chunk_hi
        k_tile, v_tile = load_kv_tile(k_buffer, v_buffer, k_scale, v_scale, req_to_token, stride_req,
                                      req_row, kv_pos, mask_n, stride_buf_s, kv_off, stride_sc_s,
                                      sc_off, offs_d, mask_d, scale_group, KV_FORMAT)  # fp32
        # (BLOCK_N, BLOCK_D) each, cast to the dot dtype: fp32, or q's fp16/bf16 for tensor cores
        k_tile = k_tile.to(q_tile.dtype)
        v_tile = v_tile.to(q_tile.dtype)
        s = tl.dot(q_tile, tl.trans(k_tile), input_precision=DOT_PRECISION) * qk_scale  # (BLOCK_H, BLOCK_N)
        s = tl.where(mask_n[None, :], s, float("-inf"))
        m_i, l_i, acc = online_softmax_step(m_i, l_i, acc, s, v_tile, DOT_PRECISION)

    empty = l_i == 0.0  # (BLOCK_H,) true for the whole program when its chunk is empty
    out = acc / tl.where(empty, 1.0, l_i)[:, None]  # (BLOCK_H, BLOCK_D)
    lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))  # (BLOCK_H,) log2 units
    po_ptrs = (partial_o + b * stride_po_b + head[:, None] * stride_po_h + split * stride_po_s
               + offs_d[None, :])
    tl.store(po_ptrs, out, mask=mask_h[:, None] & mask_d[None, :])
    tl.store(partial_lse + b * stride_lse_b + head * stride_lse_h + split, lse, mask=mask_h)


@triton.jit
def _decode_merge_kernel(
    partial_o, partial_lse, o,
    stride_po_b, stride_po_h, stride_po_s, stride_lse_b, stride_lse_h,
    stride_o_b, stride_o_h, num_splits, head_dim,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)  # (BLOCK_S,)
    offs_d = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
    mask_s = offs_s < num_splits
    mask_d = offs_d < head_dim
    lse = tl.load(partial_lse + b * stride_lse_b + head * stride_lse_h + offs_s,
                  mask=mask_s, other=float("-inf"))  # (BLOCK_S,) log2 units
    weight = tl.exp2(lse - tl.max(lse, 0))  # (BLOCK_S,) split 0 is never empty, so max is finite
    po_ptrs = (partial_o + b * stride_po_b + head * stride_po_h + offs_s[:, None] * stride_po_s
               + offs_d[None, :])
    part = tl.load(po_ptrs, mask=mask_s[:, None] & mask_d[None, :], other=0.0)  # (BLOCK_S, BLOCK_D)
    out = tl.sum(part * weight[:, None], 0) / tl.sum(weight, 0)  # (BLOCK_D,)
    tl.store(o + b * stride_o_b + head * stride_o_h + offs_d, out.to(o.dtype.element_ty), mask=mask_d)


def default_num_kv_splits(batch_size: int, num_kv_heads: int, device: torch.device) -> int:
    """Splits per request so stage 1 fills the device, without reading seq_lens (no sync).

    Requests too short for that many BLOCK_N chunks leave the extra splits empty, which costs
    one trivial program each. The interpreter gains nothing from splits, so it uses at most 4.
    """
    programs = batch_size * num_kv_heads
    if device.type == "cuda" and not interpreting():
        target = 2 * torch.cuda.get_device_properties(device).multi_processor_count
        return max(1, min(32, triton.cdiv(target, programs)))
    return max(1, min(4, triton.cdiv(4, programs)))


def decode_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    sliding_window: int | None = None,
    num_kv_splits: int | None = None,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    kv_format: str = "dense",
    group: int = 0,
) -> torch.Tensor:
    """Attention of one query per request (at position seq_lens[b] - 1) over its paged KV.

    q: (B, Hq, D); k_buffer, v_buffer: (num_slots, H_kv, D), already holding this step's K/V;
    req_to_token: (max_reqs, max_context_len) int32 slots; req_pool_indices: (B,) int64;
    seq_lens: (B,) int32 KV length in tokens including the new token (>= 1);
    sm_scale: softmax scale; sliding_window: in tokens (the query sees the last `window`
    positions); num_kv_splits: chunks per request (None: `default_num_kv_splits`).
    kv_format, k_scale, v_scale, group: the storage format, as in `extend_attention`.
    Returns o: (B, Hq, D) in q's dtype.
    """
    batch_size, num_q_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    kv_code = check_kv_format(kv_format, k_buffer, v_buffer, k_scale, v_scale, head_dim, group)
    q_per_kv = check_paged_args(q, k_buffer, v_buffer, req_to_token)  # query heads per KV head
    o = torch.empty_like(q)  # (B, Hq, D)
    if batch_size == 0:
        return o
    splits = num_kv_splits or default_num_kv_splits(batch_size, num_kv_heads, q.device)
    partial_o = torch.empty(batch_size, num_q_heads, splits, head_dim,
                            dtype=torch.float32, device=q.device)  # (B, Hq, S, D)
    partial_lse = torch.empty(batch_size, num_q_heads, splits,
                              dtype=torch.float32, device=q.device)  # (B, Hq, S)

    bd = block_d(head_dim)
    if interpreting():
        block_h, block_n, launch = triton.next_power_of_2(q_per_kv), 128, {}
    else:
        # tl.dot needs every dim >= 16 when compiled; padding heads are masked.
        block_h, block_n = max(16, triton.next_power_of_2(q_per_kv)), 64
        launch = {"num_warps": 4, "num_stages": 2}
    stride_sc = k_scale.stride()[:2] if k_scale is not None else (0, 0)
    _decode_partial_kernel[(batch_size, num_kv_heads, splits)](
        q, k_buffer, v_buffer, k_scale, v_scale, partial_o, partial_lse, req_to_token,
        req_pool_indices, seq_lens,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1), *stride_sc,
        req_to_token.stride(0),
        partial_o.stride(0), partial_o.stride(1), partial_o.stride(2),
        partial_lse.stride(0), partial_lse.stride(1),
        sm_scale * math.log2(math.e), sliding_window or 0, q_per_kv, head_dim, max(group, 1),
        KV_FORMAT=kv_code, HAS_WINDOW=sliding_window is not None,
        BLOCK_H=block_h, BLOCK_N=block_n, BLOCK_D=bd,
        DOT_FP32=dot_fp32(q.dtype), DOT_PRECISION=dot_precision(q.dtype),
        **launch,
    )
    _decode_merge_kernel[(batch_size, num_q_heads)](
        partial_o, partial_lse, o,
        partial_o.stride(0), partial_o.stride(1), partial_o.stride(2),
        partial_lse.stride(0), partial_lse.stride(1),
        o.stride(0), o.stride(1), splits, head_dim,
        BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=bd,
    )
    return o
