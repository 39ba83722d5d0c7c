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


# KV storage formats the kernels dequantise while loading (`KV_FORMAT`); see radixkv.mem.kv_quant.
KV_FORMATS = {"dense": 0, "int8": 1, "int4": 2}


def check_kv_format(kv_format: str, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                    k_scale: torch.Tensor | None, v_scale: torch.Tensor | None,
                    head_dim: int, group: int) -> int:
    """Validate the K/V storage against `kv_format`; returns its `KV_FORMAT` code.

    dense: k/v (S, H_kv, D) float or fp8, no scales; int8: (S, H_kv, D) int8 codes, scales
    (S, H_kv); int4: (S, H_kv, D/2) uint8 (even d in the low nibble), scales (S, H_kv, D/group).
    """
    if kv_format not in KV_FORMATS:
        raise ValueError(f"kv_format={kv_format!r}: must be one of {list(KV_FORMATS)}")
    code = KV_FORMATS[kv_format]
    if code == 0:
        assert k_scale is None and v_scale is None, "dense KV takes no scales"
        assert k_buffer.dtype.is_floating_point and k_buffer.shape[2] == head_dim, k_buffer.shape
        return code
    assert k_scale is not None and v_scale is not None, f"{kv_format} KV needs k_scale and v_scale"
    assert k_scale.dtype == v_scale.dtype and k_scale.stride() == v_scale.stride()
    assert k_scale.shape[:2] == k_buffer.shape[:2], (k_scale.shape, k_buffer.shape)
    if code == 1:
        assert k_buffer.dtype == torch.int8 and k_buffer.shape[2] == head_dim
        assert k_scale.dim() == 2 and k_scale.dtype == torch.float32, k_scale.shape
    else:
        assert k_buffer.dtype == torch.uint8 and 2 * k_buffer.shape[2] == head_dim
        assert group > 0 and head_dim % group == 0, (head_dim, group)
        assert k_scale.dtype == torch.float16 and k_scale.shape[2:] == (head_dim // group, 2), k_scale.shape
        assert k_scale.stride(2) == 2 and k_scale.stride(3) == 1, k_scale.stride()
    return code


@triton.jit
def load_kv_slots(req_to_token, stride_req, req_row, positions, valid):
    """KV slots (int64, 0 where invalid) of `positions` of the request stored in `req_row`."""
    slots = tl.load(req_to_token + req_row * stride_req + positions, mask=valid, other=0)
    return slots.to(tl.int64)  # int64: slot * stride overflows int32 on large pools


@triton.jit
def load_dequantised(buffer, scale, slots, mask_n, stride_buf_s, buf_off, stride_sc_s, sc_off,
                     offs_d, mask_d, scale_group, KV_FORMAT: tl.constexpr):
    """One K or V tile (BLOCK_N, BLOCK_D) of `slots` and one KV head, in fp32 (0 where masked).

    Dequantises in registers, so no full-precision copy of the pool ever exists. `buf_off`,
    `sc_off`: the KV head's offset into the storage and the scales; `scale_group`: int4 values
    per scale."""
    mask = mask_n[:, None] & mask_d[None, :]  # (BLOCK_N, BLOCK_D)
    row = slots[:, None] * stride_buf_s + buf_off  # (BLOCK_N, 1)
    if KV_FORMAT == 0:  # float or fp8: a cast
        tile = tl.load(buffer + row + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    elif KV_FORMAT == 1:  # int8: code * scale[slot, head]
        codes = tl.load(buffer + row + offs_d[None, :], mask=mask, other=0)  # (BLOCK_N, BLOCK_D)
        s = tl.load(scale + slots * stride_sc_s + sc_off, mask=mask_n, other=0.0)  # (BLOCK_N,)
        tile = codes.to(tl.float32) * s[:, None]
    else:  # int4: nibble * scale + minimum, per (slot, head, d // group); even d in the low nibble
        packed = tl.load(buffer + row + offs_d[None, :] // 2, mask=mask, other=0)  # (BLOCK_N, BLOCK_D)
        nibble = (packed.to(tl.int32) >> ((offs_d[None, :] % 2) * 4)) & 0xF
        s_ptrs = scale + slots[:, None] * stride_sc_s + sc_off + (offs_d[None, :] // scale_group) * 2
        s = tl.load(s_ptrs, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_N, BLOCK_D) scale
        m = tl.load(s_ptrs + 1, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_N, BLOCK_D) minimum
        tile = nibble.to(tl.float32) * s + m
    return tile


@triton.jit
def load_kv_tile(k_buffer, v_buffer, k_scale, v_scale, req_to_token, stride_req, req_row, kv_pos,
                 mask_n, stride_buf_s, kv_off, stride_sc_s, sc_off, offs_d, mask_d, scale_group,
                 KV_FORMAT: tl.constexpr):
    """Dequantised fp32 K and V tiles (BLOCK_N, BLOCK_D) of `kv_pos` of one request and KV head
    (0 where masked); the caller casts them to its dot dtype."""
    slots = load_kv_slots(req_to_token, stride_req, req_row, kv_pos, mask_n)  # (BLOCK_N,)
    k_tile = load_dequantised(k_buffer, k_scale, slots, mask_n, stride_buf_s, kv_off, stride_sc_s,
                              sc_off, offs_d, mask_d, scale_group, KV_FORMAT)  # (BLOCK_N, BLOCK_D)
    v_tile = load_dequantised(v_buffer, v_scale, slots, mask_n, stride_buf_s, kv_off, stride_sc_s,
                              sc_off, offs_d, mask_d, scale_group, KV_FORMAT)  # (BLOCK_N, BLOCK_D)
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
