"""Decode attention read straight from the paged pool on the CPU (`csrc/paged_decode.cpp`).

The SDPA path of `sdpa_paged.decode_rows` first gathers every row's K/V into a padded copy
(`index_select` over the slots), then runs one SDPA call over it: at 8 rows of ~500 tokens that
is most of a decode step's attention (2.9 ms a layer, against 0.5 ms for this kernel, measured
by `tests/attention/test_cpu_decode.py`'s shapes on 2 cores). The kernel reads each row's K/V
rows where the pool keeps them, one work item per (row, KV head) so a GQA group's query heads
share every read, and returns log-sum-exps too, so the cascade path can merge a shared prefix.

It is one of the C++ kernels built on first use (`radixkv.native`); without it `library()` is
None and the SDPA path runs (tests compare the two).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from radixkv.errors import CacheInvariantError
from radixkv.native import NativeLibrary


def _declare(lib: ctypes.CDLL) -> None:
    p, i = ctypes.c_void_p, ctypes.c_int64
    lib.radixkv_paged_decode.argtypes = [p, p, p, p, p, p, p, i, i, i, i, i, i, ctypes.c_float]
    lib.radixkv_paged_decode.restype = ctypes.c_int64


KERNEL = NativeLibrary("paged_decode", Path(__file__).with_name("csrc") / "paged_decode.cpp", 2, _declare)


def library() -> ctypes.CDLL | None:
    """The built kernel library, building it on first use; None when it cannot be had."""
    return KERNEL.get()


def usable(q: torch.Tensor, k_buffer, v_buffer) -> bool:
    """Whether the kernel can serve these tensors: CPU fp32, contiguous pool buffers."""
    return (isinstance(k_buffer, torch.Tensor) and isinstance(v_buffer, torch.Tensor) and q.device.type == "cpu"
            and q.dtype == k_buffer.dtype == v_buffer.dtype == torch.float32
            and k_buffer.is_contiguous() and v_buffer.is_contiguous() and library() is not None)


def paged_decode(
    q: torch.Tensor,  # (B, Hq, D) fp32
    k_buffer: torch.Tensor,  # (S, Hkv, D) fp32, contiguous
    v_buffer: torch.Tensor,  # (S, Hkv, D)
    slots: torch.Tensor,  # (B, L) int64: row b reads its first lens[b] slots
    lens: torch.Tensor,  # (B,) int64
    sm_scale: float,
    with_lse: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # (B, Hq, D), (B, Hq) or None
    """Each row's query over its slots' K/V, read in place (see the module docstring)."""
    B, Hq, D = q.shape
    S, Hkv, Dk = k_buffer.shape
    assert Dk == D and Hq % Hkv == 0 and slots.shape[0] == B and lens.shape == (B,), (q.shape, k_buffer.shape)
    assert slots.dtype == lens.dtype == torch.int64
    q = q.contiguous()
    slots = slots.contiguous()
    out = torch.empty_like(q)
    lse = torch.empty(B, Hq, dtype=torch.float32) if with_lse else None
    bad = library().radixkv_paged_decode(q.data_ptr(), k_buffer.data_ptr(), v_buffer.data_ptr(), slots.data_ptr(),
                                         lens.data_ptr(), out.data_ptr(), None if lse is None else lse.data_ptr(),
                                         B, Hq, Hkv, D, slots.shape[1], S, float(sm_scale))
    if bad:
        raise CacheInvariantError(f"paged decode: {bad} of {B} rows list slots outside the pool's {S} "
                                  f"or more than their {slots.shape[1]} columns")
    return out, lse
