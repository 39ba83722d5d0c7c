"""Extend (prefill) attention: new tokens attend to their cached prefix and causally to each other.

Each program owns one request, one block of its new tokens and one KV head. Its BLOCK_M query rows
are (token, head-in-group) pairs, so the `group` query heads that share a KV head read each K/V
tile once ("packed GQA"); KV heads are never repeated in memory. Quantised pools (int8, int4,
fp8) are dequantised tile by tile as they are loaded (`_triton_utils.load_dequantised`).
"""

import math

import torch
import triton
import triton.language as tl

from ._triton_utils import (block_d, check_kv_format, check_paged_args, dot_fp32, dot_precision,
                            interpreting, load_kv_tile, online_softmax_step)


@triton.jit
def _extend_attention_kernel(
    q, k_buffer, v_buffer, k_scale, v_scale, o, req_to_token,
    req_pool_indices, seq_lens, prefix_lens, extend_start_loc,
    stride_q_t, stride_q_h, stride_o_t, stride_o_h,
    stride_buf_s, stride_buf_h, stride_sc_s, stride_sc_h, stride_req,
    qk_scale, window, group, head_dim, scale_group,
    KV_FORMAT: tl.constexpr, HAS_WINDOW: tl.constexpr, GROUP_P: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    BLOCK_T: tl.constexpr = BLOCK_M // GROUP_P  # new tokens per program
    b = tl.program_id(0)
    kv_head = tl.program_id(2)
    seq_len = tl.load(seq_lens + b)
    prefix_len = tl.load(prefix_lens + b)
    extend_len = seq_len - prefix_len
    t0 = tl.program_id(1) * BLOCK_T
    if t0 >= extend_len:
        return
    req_row = tl.load(req_pool_indices + b).to(tl.int64)
    start = tl.load(extend_start_loc + b).to(tl.int64)

    offs_m = tl.arange(0, BLOCK_M)  # (BLOCK_M,) row = token * GROUP_P + head-in-group
    offs_n = tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    offs_d = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
    tok = t0 + offs_m // GROUP_P  # (BLOCK_M,) index among this request's new tokens
    head = kv_head * group + offs_m % GROUP_P  # (BLOCK_M,) query head
    mask_m = (tok < extend_len) & (offs_m % GROUP_P < group)  # (BLOCK_M,)
    mask_d = offs_d < head_dim  # (BLOCK_D,)
    q_pos = prefix_len + tok  # (BLOCK_M,) absolute position of each query row

    q_ptrs = q + (start + tok)[:, None] * stride_q_t + head[:, None] * stride_q_h + offs_d[None, :]
    q_tile = tl.load(q_ptrs, mask=mask_m[:, None] & mask_d[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
    if DOT_FP32:
        q_tile = q_tile.to(tl.float32)

    # Finite init: padding rows see only -inf scores, and exp2(-inf - -inf) would be NaN.
    m_i = tl.full((BLOCK_M,), -1.0e30, tl.float32)  # (BLOCK_M,) running max, log2 units
    l_i = tl.zeros((BLOCK_M,), tl.float32)  # (BLOCK_M,) running softmax denominator
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)  # (BLOCK_M, BLOCK_D)

    # KV blocks wholly after the last query (causal) or before the first window are skipped.
    kv_hi = prefix_len + tl.minimum(t0 + BLOCK_T, extend_len)
    kv_lo = 0
    if HAS_WINDOW:
        kv_lo = tl.maximum(prefix_len + t0 - window + 1, 0)
    kv_off = kv_head * stride_buf_h
    sc_off = kv_head * stride_sc_h
    for n0 in range(kv_lo, kv_hi, BLOCK_N):
        kv_pos = n0 + offs_n  # (BLOCK_N,)
        mask_n = kv_pos < kv_hi
        k_tile, v_tile = load_kv_tile(k_buffer, v_buffer, k_scale, v_scale, req_to_token, stride_req,
                                      req_row, kv_pos, mask_n, stride_buf_s, kv_off, stride_sc_s,
                                      sc_off, offs_d, mask_d, scale_group, KV_FORMAT)  # fp32
        # (BLOCK_N, BLOCK_D) each, cast to the dot dtype: fp32, or q's fp16/bf16 for tensor cores
        k_tile = k_tile.to(q_tile.dtype)
        v_tile = v_tile.to(q_tile.dtype)
        s = tl.dot(q_tile, tl.trans(k_tile), input_precision=DOT_PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N)
        visible = mask_n[None, :] & (kv_pos[None, :] <= q_pos[:, None])  # (BLOCK_M, BLOCK_N)
        if HAS_WINDOW:
            visible = visible & (kv_pos[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_i, l_i, acc = online_softmax_step(m_i, l_i, acc, s, v_tile, DOT_PRECISION)

    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]  # (BLOCK_M, BLOCK_D)
    o_ptrs = o + (start + tok)[:, None] * stride_o_t + head[:, None] * stride_o_h + offs_d[None, :]
    tl.store(o_ptrs, out.to(o.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


def extend_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_extend_len: int,
    sm_scale: float,
    sliding_window: int | None = None,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    kv_format: str = "dense",
    group: int = 0,
) -> torch.Tensor:
    """Causal attention of the new tokens of B requests over their whole KV (prefix + new).

    q: (T, Hq, D) new tokens of all requests, flattened (request b's tokens start at
    `extend_start_loc[b]`); k_buffer, v_buffer: (num_slots, H_kv, D), already holding the new
    tokens' K/V; req_to_token: (max_reqs, max_context_len) int32 slot of each token position;
    req_pool_indices: (B,) int64; seq_lens, prefix_lens: (B,) int32 lengths in tokens;
    max_extend_len: max(seq_lens - prefix_lens) in tokens (sizes the grid, no device sync);
    sm_scale: softmax scale, usually D ** -0.5; sliding_window: in tokens, a query at position i
    sees kv positions j with i - window < j <= i.
    kv_format: how the buffers store K/V ("dense": float or fp8 values; "int8": codes with
    k_scale, v_scale (num_slots, H_kv); "int4": (num_slots, H_kv, D/2) packed bytes with scales
    (num_slots, H_kv, D/group), `group` values per scale), as `KVPool.kernel_buffers` gives them.
    Returns o: (T, Hq, D) in q's dtype.
    """
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    kv_code = check_kv_format(kv_format, k_buffer, v_buffer, k_scale, v_scale, head_dim, group)
    q_per_kv = check_paged_args(q, k_buffer, v_buffer, req_to_token)  # query heads per KV head
    o = torch.empty_like(q)  # (T, Hq, D)
    if num_tokens == 0 or max_extend_len == 0:
        return o

    group_p = triton.next_power_of_2(q_per_kv)
    bd = block_d(head_dim)
    if interpreting():
        # Interpreter cost is programs x loop iterations: few, large blocks.
        block_m, block_n, launch = max(128, group_p), 64, {}
    else:
        block_m, block_n = max(64, group_p), (64 if bd <= 64 else 32)
        launch = {"num_warps": 4, "num_stages": 2}
    block_t = block_m // group_p
    grid = (seq_lens.shape[0], triton.cdiv(max_extend_len, block_t), num_kv_heads)
    stride_sc = k_scale.stride()[:2] if k_scale is not None else (0, 0)
    _extend_attention_kernel[grid](
        q, k_buffer, v_buffer, k_scale, v_scale, o, req_to_token,
        req_pool_indices, seq_lens, prefix_lens, extend_start_loc,
        q.stride(0), q.stride(1), o.stride(0), o.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), *stride_sc, req_to_token.stride(0),
        sm_scale * math.log2(math.e), sliding_window or 0, q_per_kv, head_dim, max(group, 1),
        KV_FORMAT=kv_code, HAS_WINDOW=sliding_window is not None, GROUP_P=group_p,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=bd,
        DOT_FP32=dot_fp32(q.dtype), DOT_PRECISION=dot_precision(q.dtype),
        **launch,
    )
    return o
