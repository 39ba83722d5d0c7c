"""Launch-time helpers shared by the Triton kernels (no kernels here)."""

import os

import torch
import triton
import triton.language as tl


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


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
