"""MLA decode attention: one absorbed query per request over its paged latents ("flash MLA").

Multi-head latent attention in the absorbed form (`radixkv.model.mla`) is multi-query attention
whose one KV head is the latent `[c, k_pe]` (`kv_lora_rank + qk_rope_head_dim` values) and whose
values are its first `kv_lora_rank` columns. Stage 1 splits each request's KV into chunks; one
program owns (request, block of `BLOCK_H` query heads, chunk), so every latent tile is read once
for all those heads: scores are `q_c . c + q_pe . k_pe` (two dots, the latent part and the RoPE
part, each padded to its own power of two rather than their sum), and the output accumulates
`p . c`. Stage 2 is the split merge of `decode_attention`.

Reads dense latents (float, or fp8 kept as bytes and viewed as fp8); quantised-integer latents
go through the general decode kernel. `reference.mla_decode_reference` is the torch ground truth.
"""

import math

import torch
import triton
import triton.language as tl

from ._triton_utils import dot_fp32, dot_precision, interpreting
from .decode_attention import _decode_merge_kernel, default_num_kv_splits


@triton.jit
def _mla_decode_partial_kernel(
    q, latent, partial_o, partial_lse, req_to_token, req_pool_indices, seq_lens,
    stride_q_b, stride_q_h, stride_lat_s, stride_req,
    stride_po_b, stride_po_h, stride_po_s, stride_lse_b, stride_lse_h,
    qk_scale, num_heads, rank, rope,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
    DOT_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    head_block = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    seq_len = tl.load(seq_lens + b)
    req_row = tl.load(req_pool_indices + b).to(tl.int64)
    chunk = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    chunk_lo = tl.minimum(split * chunk, seq_len)
    chunk_hi = tl.minimum(chunk_lo + chunk, seq_len)

    offs_h = head_block * BLOCK_H + tl.arange(0, BLOCK_H)  # (BLOCK_H,)
    offs_n = tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    offs_r = tl.arange(0, BLOCK_R)  # (BLOCK_R,) latent columns
    offs_p = tl.arange(0, BLOCK_P)  # (BLOCK_P,) RoPE columns
    mask_h = offs_h < num_heads
    mask_r = offs_r < rank
    mask_p = offs_p < rope
    q_row = q + b * stride_q_b + offs_h[:, None] * stride_q_h
    q_c = tl.load(q_row + offs_r[None, :], mask=mask_h[:, None] & mask_r[None, :], other=0.0)  # (BLOCK_H, BLOCK_R)
    q_pe = tl.load(q_row + rank + offs_p[None, :], mask=mask_h[:, None] & mask_p[None, :],
                   other=0.0)  # (BLOCK_H, BLOCK_P)
    if DOT_FP32:
        q_c = q_c.to(tl.float32)
        q_pe = q_pe.to(tl.float32)

    m_i = tl.full((BLOCK_H,), -1.0e30, tl.float32)  # (BLOCK_H,) running max, log2 units
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, BLOCK_R), tl.float32)  # (BLOCK_H, BLOCK_R)
    for n0 in range(chunk_lo, chunk_hi, BLOCK_N):
        kv_pos = n0 + offs_n  # (BLOCK_N,)
        mask_n = kv_pos < chunk_hi
        slots = tl.load(req_to_token + req_row * stride_req + kv_pos, mask=mask_n, other=0).to(tl.int64)
        row = latent + slots[:, None] * stride_lat_s  # (BLOCK_N, 1)
        c = tl.load(row + offs_r[None, :], mask=mask_n[:, None] & mask_r[None, :], other=0.0)  # (BLOCK_N, BLOCK_R)
        pe = tl.load(row + rank + offs_p[None, :], mask=mask_n[:, None] & mask_p[None, :], other=0.0)
        c = c.to(q_c.dtype)
        pe = pe.to(q_pe.dtype)
        s = tl.dot(q_c, tl.trans(c), input_precision=DOT_PRECISION)  # (BLOCK_H, BLOCK_N)
        s += tl.dot(q_pe, tl.trans(pe), input_precision=DOT_PRECISION)
        s = tl.where(mask_n[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # (BLOCK_H,)
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])  # (BLOCK_H, BLOCK_N)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c, input_precision=DOT_PRECISION)
        m_i = m_new

    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]  # (BLOCK_H, BLOCK_R)
    lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))  # (BLOCK_H,)
    po_ptrs = partial_o + b * stride_po_b + offs_h[:, None] * stride_po_h + split * stride_po_s + offs_r[None, :]
    tl.store(po_ptrs, out, mask=mask_h[:, None] & mask_r[None, :])
    tl.store(partial_lse + b * stride_lse_b + offs_h * stride_lse_h + split, lse, mask=mask_h)


def mla_decode_attention(
    q: torch.Tensor,
    latent: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    kv_lora_rank: int,
    num_kv_splits: int | None = None,
) -> torch.Tensor:
    """Absorbed MLA attention of one query per request over its paged latents.

    q: (B, H, R + P) absorbed queries (`W_UK^T q_nope` then the rotated `q_pe`); latent:
    (num_slots, 1, R + P) or (num_slots, R + P), the pool's latents with this step's stored;
    req_to_token, req_pool_indices, seq_lens as in `decode_attention`; R = kv_lora_rank.
    Returns (B, H, R + P) in q's dtype: the latent values in the first R columns, zeros in the
    RoPE columns (the model drops them).
    """
    batch_size, num_heads, dim = q.shape
    latent = latent.reshape(latent.shape[0], -1)  # (S, R + P)
    assert latent.shape[1] == dim and q.stride(-1) == latent.stride(-1) == 1, (q.shape, latent.shape)
    rope = dim - kv_lora_rank
    assert 0 < kv_lora_rank and rope >= 0
    o = torch.zeros_like(q)  # (B, H, R + P)
    if batch_size == 0:
        return o
    if latent.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) and interpreting():
        latent = latent.to(q.dtype)  # the interpreter has no fp8 loads
    splits = num_kv_splits or default_num_kv_splits(batch_size, 1, q.device)
    partial_o = torch.empty(batch_size, num_heads, splits, kv_lora_rank, dtype=torch.float32, device=q.device)
    partial_lse = torch.empty(batch_size, num_heads, splits, dtype=torch.float32, device=q.device)
    if interpreting():
        block_h, block_n, launch = min(16, triton.next_power_of_2(num_heads)), 64, {}
    else:
        block_h, block_n, launch = 16, 32, {"num_warps": 4, "num_stages": 2}
    block_p = max(16, triton.next_power_of_2(max(rope, 1)))
    _mla_decode_partial_kernel[(batch_size, triton.cdiv(num_heads, block_h), splits)](
        q, latent, partial_o, partial_lse, req_to_token, req_pool_indices, seq_lens,
        q.stride(0), q.stride(1), latent.stride(0), req_to_token.stride(0),
        partial_o.stride(0), partial_o.stride(1), partial_o.stride(2),
        partial_lse.stride(0), partial_lse.stride(1),
        sm_scale * math.log2(math.e), num_heads, kv_lora_rank, rope,
        BLOCK_H=block_h, BLOCK_N=block_n, BLOCK_R=max(16, triton.next_power_of_2(kv_lora_rank)), BLOCK_P=block_p,
        DOT_FP32=dot_fp32(q.dtype), DOT_PRECISION=dot_precision(q.dtype), **launch,
    )
    values = o[..., :kv_lora_rank]  # (B, H, R), a strided view of o
    _decode_merge_kernel[(batch_size, num_heads)](
        partial_o, partial_lse, values,
        partial_o.stride(0), partial_o.stride(1), partial_o.stride(2),
        partial_lse.stride(0), partial_lse.stride(1),
        values.stride(0), values.stride(1), splits, kv_lora_rank,
        BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=triton.next_power_of_2(kv_lora_rank),
    )
    return o
