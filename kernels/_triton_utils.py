"""Launch-time helpers shared by the Triton kernels (no kernels here)."""

import os

import torch
import triton
import triton.language as tl


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def check_paged_args(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                     req_to_token: torch.Tensor) -> int:
    """Validate the layout the kernels index by hand; returns the GQA group size."""
    num_q_heads, num_kv_heads = q.shape[1], k_buffer.shape[1]
    assert num_q_heads % num_kv_heads == 0, (num_q_heads, num_kv_heads)
    assert q.stride(-1) == k_buffer.stride(-1) == req_to_token.stride(-1) == 1
    assert k_buffer.stride() == v_buffer.stride()
    return num_q_heads // num_kv_heads


def block_d(head_dim: int) -> int:
    """Head dim padded to a power of two (the kernels mask the padding lanes)."""
    return triton.next_power_of_2(head_dim)


def dot_fp32(dtype: torch.dtype) -> bool:
    """Whether `tl.dot` operands must be upcast to fp32.

    The interpreter returns garbage for bf16 `tl.dot`, so interpreted kernels upcast every dot;
    compiled kernels keep fp16/bf16 operands (tensor cores, fp32 accumulation).
    """
    return interpreting() or dtype == torch.float32


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs get exact ("ieee") dots; Triton's default tf32 would cost ~1e-3 accuracy."""
    return "ieee" if dtype == torch.float32 or interpreting() else "tf32"


@triton.jit
def load_kv_slots(req_to_token, stride_req, req_row, positions, valid):
    """KV slots (int64, 0 where invalid) of `positions` of the request stored in `req_row`."""
    slots = tl.load(req_to_token + req_row * stride_req + positions, mask=valid, other=0)
    return slots.to(tl.int64)  # int64: slot * stride overflows int32 on large pools


@triton.jit
def load_kv_tile(k_buffer, v_buffer, req_to_token, stride_req, req_row, kv_pos, mask_n,
                 stride_buf_s, kv_off, offs_d, mask_d, DOT_FP32: tl.constexpr):
    """K and V tiles (BLOCK_N, BLOCK_D) of `kv_pos` of one request and KV head (0 where masked)."""
    slots = load_kv_slots(req_to_token, stride_req, req_row, kv_pos, mask_n)  # (BLOCK_N,)
    kv_ptrs = slots[:, None] * stride_buf_s + kv_off + offs_d[None, :]  # (BLOCK_N, BLOCK_D)
    kv_mask = mask_n[:, None] & mask_d[None, :]
    k_tile = tl.load(k_buffer + kv_ptrs, mask=kv_mask, other=0.0)  # (BLOCK_N, BLOCK_D)
    v_tile = tl.load(v_buffer + kv_ptrs, mask=kv_mask, other=0.0)  # (BLOCK_N, BLOCK_D)
    if DOT_FP32:
        k_tile = k_tile.to(tl.float32)
        v_tile = v_tile.to(tl.float32)
    return k_tile, v_tile


@triton.jit
def online_softmax_step(m_i, l_i, acc, s, v_tile, DOT_PRECISION: tl.constexpr):
    """Fold one block of scores `s` (rows, BLOCK_N; log2 units, -inf where hidden) and its
    values into the running max `m_i`, denominator `l_i` and output `acc` (rows, BLOCK_D)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))  # (rows,)
    alpha = tl.exp2(m_i - m_new)  # (rows,)
    p = tl.exp2(s - m_new[:, None])  # (rows, BLOCK_N)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v_tile.dtype), v_tile, input_precision=DOT_PRECISION)
    return m_new, l_i, acc
