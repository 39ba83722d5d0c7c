"""The segmented LoRA matmul (SGMV, Punica's name): each segment of rows with its own adapter.

    y[s:e] += scaling[slot] * (x[s:e] @ A[slot].T) @ B[slot].T     for each segment (s, e, slot)

x (T, K); A (S, R, K) and B (S, N, R): every adapter slot's (fused) LoRA matrices, zero-padded
to rank R; segments: `seg_start`, `seg_len`, `seg_slot` (G,) int64, slot -1 for the base model
(nothing added). Two kernels: shrink (x @ A.T into a (T, R) buffer) and expand (that @ B.T,
scaled, added into y). `lora_sgmv_reference` in reference.py is the torch twin.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _shrink_kernel(x, a, out, seg_start, seg_len, seg_slot, K, R,
                   stride_xt, stride_as, stride_ar, stride_ot,
                   BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    seg, tb = tl.program_id(0), tl.program_id(1)
    slot = tl.load(seg_slot + seg)
    start = tl.load(seg_start + seg)
    n = tl.load(seg_len + seg)
    offs_t = tb * BLOCK_T + tl.arange(0, BLOCK_T)  # (BLOCK_T,) rows of this segment
    offs_r = tl.arange(0, BLOCK_R)
    mask_t = offs_t < tl.where(slot >= 0, n, 0)  # the base model's segments add nothing
    rows = (start + offs_t).to(tl.int64)
    safe_slot = tl.maximum(slot, 0).to(tl.int64)
    acc = tl.zeros((BLOCK_T, BLOCK_R), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        xt = tl.load(x + rows[:, None] * stride_xt + offs_k[None, :],
                     mask=mask_t[:, None] & (offs_k < K)[None, :], other=0.0)  # (BLOCK_T, BLOCK_K)
        at = tl.load(a + safe_slot * stride_as + offs_r[None, :] * stride_ar + offs_k[:, None],
                     mask=(offs_r < R)[None, :] & (offs_k < K)[:, None], other=0.0)  # (BLOCK_K, BLOCK_R)
        acc += tl.dot(xt.to(tl.float32), at.to(tl.float32))
    tl.store(out + rows[:, None] * stride_ot + offs_r[None, :], acc,
             mask=mask_t[:, None] & (offs_r < R)[None, :])


@triton.jit
def _expand_kernel(h, b, y, scaling, seg_start, seg_len, seg_slot, N, R,
                   stride_ht, stride_bs, stride_bn, stride_yt,
                   BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    seg, tb, nb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(seg_slot + seg)
    start = tl.load(seg_start + seg)
    n = tl.load(seg_len + seg)
    offs_t = tb * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, BLOCK_R)
    mask_t = offs_t < tl.where(slot >= 0, n, 0)  # the base model's segments add nothing
    rows = (start + offs_t).to(tl.int64)
    safe_slot = tl.maximum(slot, 0).to(tl.int64)
    ht = tl.load(h + rows[:, None] * stride_ht + offs_r[None, :],
                 mask=mask_t[:, None] & (offs_r < R)[None, :], other=0.0)  # (BLOCK_T, BLOCK_R)
    bt = tl.load(b + safe_slot * stride_bs + offs_n[None, :] * stride_bn + offs_r[:, None],
                 mask=(offs_n < N)[None, :] & (offs_r < R)[:, None], other=0.0)  # (BLOCK_R, BLOCK_N)
    scale = tl.load(scaling + safe_slot)
    delta = tl.dot(ht.to(tl.float32), bt.to(tl.float32)) * scale  # (BLOCK_T, BLOCK_N)
    mask = mask_t[:, None] & (offs_n < N)[None, :]
    ptrs = y + rows[:, None] * stride_yt + offs_n[None, :]
    old = tl.load(ptrs, mask=mask, other=0.0)
    tl.store(ptrs, (old.to(tl.float32) + delta).to(y.dtype.element_ty), mask=mask)


def lora_sgmv(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: torch.Tensor,
              seg_start: torch.Tensor, seg_len: torch.Tensor, seg_slot: torch.Tensor, max_len: int) -> torch.Tensor:
    """Add each segment's adapter delta into y (T, N) in place (see the module docstring); returns y.
    `max_len`: the longest segment (sizes the grid)."""
    T, K = x.shape
    S, R, _ = a.shape
    N = b.shape[1]
    G = seg_start.shape[0]
    if T == 0 or G == 0:
        return y
    assert x.stride(1) == a.stride(2) == b.stride(2) == y.stride(1) == 1
    block_r = max(16, triton.next_power_of_2(R))
    block_t, block_k, block_n = 16, 32, 64
    h = torch.zeros((T, R), dtype=torch.float32, device=x.device)
    tiles = triton.cdiv(max_len, block_t)
    _shrink_kernel[(G, tiles)](x, a, h, seg_start, seg_len, seg_slot, K, R,
                               x.stride(0), a.stride(0), a.stride(1), h.stride(0),
                               BLOCK_T=block_t, BLOCK_R=block_r, BLOCK_K=block_k)
    _expand_kernel[(G, tiles, triton.cdiv(N, block_n))](h, b, y, scaling, seg_start, seg_len, seg_slot, N, R,
                                                         h.stride(0), b.stride(0), b.stride(1), y.stride(0),
                                                         BLOCK_T=block_t, BLOCK_N=block_n, BLOCK_R=block_r)
    return y
