"""Write the new tokens' K and V into their KV-pool slots."""

import torch
import triton
import triton.language as tl

from ._triton_utils import block_d


@triton.jit
def _store_kv_kernel(
    k_buffer, v_buffer, out_cache_loc, k, v,
    stride_buf_s, stride_buf_h,
    stride_k_t, stride_k_h,
    stride_v_t, stride_v_h,
    num_tokens, num_kv_heads, head_dim,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # (BLOCK_T,)
    offs_h = tl.arange(0, BLOCK_H)  # (BLOCK_H,)
    offs_d = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
    mask_t = offs_t < num_tokens
    slots = tl.load(out_cache_loc + offs_t, mask=mask_t, other=0).to(tl.int64)  # (BLOCK_T,)
    mask = (mask_t[:, None, None] & (offs_h < num_kv_heads)[None, :, None]
            & (offs_d < head_dim)[None, None, :])  # (BLOCK_T, BLOCK_H, BLOCK_D)
    t = offs_t.to(tl.int64)[:, None, None]
    h = offs_h[None, :, None]
    d = offs_d[None, None, :]
    dst = slots[:, None, None] * stride_buf_s + h * stride_buf_h + d  # (BLOCK_T, BLOCK_H, BLOCK_D)
    k_tile = tl.load(k + t * stride_k_t + h * stride_k_h + d, mask=mask)
    tl.store(k_buffer + dst, k_tile.to(k_buffer.dtype.element_ty), mask=mask)
    v_tile = tl.load(v + t * stride_v_t + h * stride_v_h + d, mask=mask)
    tl.store(v_buffer + dst, v_tile.to(v_buffer.dtype.element_ty), mask=mask)


def store_kv(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    out_cache_loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Write `k`, `v` (T, H_kv, D) at KV slots `out_cache_loc` (T,), cast to the buffer dtype.

    `k_buffer`, `v_buffer` are one layer's pool viewed as (num_slots, H_kv, D) with
    slot = page * page_size + offset; the last dim of every tensor must be contiguous.
    """
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert k_buffer.stride(-1) == v_buffer.stride(-1) == k.stride(-1) == v.stride(-1) == 1
    assert k_buffer.stride() == v_buffer.stride()
    block_h = triton.next_power_of_2(num_kv_heads)
    bd = block_d(head_dim)
    # About 4K elements per program: few programs for the interpreter, enough work per GPU block.
    block_t = max(1, min(triton.next_power_of_2(num_tokens), 4096 // (block_h * bd)))
    _store_kv_kernel[(triton.cdiv(num_tokens, block_t),)](
        k_buffer, v_buffer, out_cache_loc, k, v,
        k_buffer.stride(0), k_buffer.stride(1),
        k.stride(0), k.stride(1),
        v.stride(0), v.stride(1),
        num_tokens, num_kv_heads, head_dim,
        BLOCK_T=block_t, BLOCK_H=block_h, BLOCK_D=bd,
    )
