"""Decode attention read straight from the paged pool on the CPU (`csrc/paged_decode.cpp`).

The SDPA path of `sdpa_paged.decode_rows` first gathers every row's K/V into a padded copy
(`index_select` over the slots), then runs one SDPA call over it: at 8 rows of ~500 tokens that
is most of a decode step's attention (2.9 ms a layer, against 0.5 ms for this kernel, measured
by `tests/attention/test_cpu_decode.py`'s shapes on 2 cores). The kernel reads each row's K/V
rows where the pool keeps them, one work item per (row, KV head) so a GQA group's query heads
share every read, and returns log-sum-exps too, so the cascade path can merge a shared prefix.

The torch backend's *direct* decode path (`TorchBackend.forward`, a pure decode batch on a
dense fp32 pool) also hands the kernel the step's new K/V to store first, so each layer's store
+ attention is one call: at batch 8 of 32-token contexts the separate store (two `index_copy_`)
and the Python around it took longer than the attention (55 us of ~170 us a layer).

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
    lib.radixkv_paged_decode.argtypes = [p, p, p, p, p, p, p, i, i, i, i, i, i, ctypes.c_float, p, p, p, i, i, i, i]
    lib.radixkv_paged_decode.restype = ctypes.c_int64


KERNEL = NativeLibrary("paged_decode", Path(__file__).with_name("csrc") / "paged_decode.cpp", 3, _declare)


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
    store: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,  # k, v (T, Hkv, D) fp32, loc (T,) int64
) -> tuple[torch.Tensor, torch.Tensor | None]:  # (B, Hq, D), (B, Hq) or None
    """Each row's query over its slots' K/V, read in place (see the module docstring).

    With `store`, first writes those new tokens' K/V into the buffers at `loc` -- what
    `DenseKVPool.store` does for an fp32 pool -- in the same call."""
    B, Hq, D = q.shape
    S, Hkv, Dk = k_buffer.shape
    assert Dk == D and Hq % Hkv == 0 and slots.shape[0] == B and lens.shape == (B,), (q.shape, k_buffer.shape)
    assert slots.dtype == lens.dtype == torch.int64 and slots.is_contiguous() and lens.is_contiguous()
    q = rows_contiguous(q)
    out = torch.empty((B, Hq, D), dtype=torch.float32)
    lse = torch.empty(B, Hq, dtype=torch.float32) if with_lse else None
    k_new = v_new = loc = None
    T = 0
    if store is not None:
        k_new, v_new, loc = rows_contiguous(store[0]), rows_contiguous(store[1]), store[2].contiguous()
        T = loc.shape[0]
        assert k_new.shape == v_new.shape == (T, Hkv, D) and k_new.dtype == v_new.dtype == torch.float32, k_new.shape
        assert loc.dtype == torch.int64, loc.dtype
    bad = library().radixkv_paged_decode(q.data_ptr(), k_buffer.data_ptr(), v_buffer.data_ptr(), slots.data_ptr(),
                                         lens.data_ptr(), out.data_ptr(), None if lse is None else lse.data_ptr(),
                                         B, Hq, Hkv, D, slots.shape[1], S, float(sm_scale),
                                         None if k_new is None else k_new.data_ptr(),
                                         None if v_new is None else v_new.data_ptr(),
                                         None if loc is None else loc.data_ptr(), T, q.stride(0),
                                         0 if k_new is None else k_new.stride(0), 0 if v_new is None else v_new.stride(0))
    if bad < 0:
        raise CacheInvariantError(f"paged decode: {-bad} of {T} new tokens' slots lie outside the pool's {S}")
    if bad:
        raise CacheInvariantError(f"paged decode: {bad} of {B} rows list slots outside the pool's {S} "
                                  f"or more than their {slots.shape[1]} columns")
    return out, lse


def rows_contiguous(x: torch.Tensor) -> torch.Tensor:
    """x (N, H, D) fp32 with each row's (H, D) contiguous (rows may lie any stride apart, as
    the views of a fused QKV output do): x itself, or a contiguous copy."""
    assert x.dtype == torch.float32, x.dtype
    _, H, D = x.shape
    if x.stride(2) == 1 and x.stride(1) == D and x.stride(0) >= H * D:
        return x
    return x.contiguous()
