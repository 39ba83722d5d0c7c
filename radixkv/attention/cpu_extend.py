"""Extend attention read straight from the paged pool on the CPU (`csrc/paged_extend.cpp`).

The flash path of `sdpa_paged.attention` runs torch's flash kernel per request, once over its
cached prefix (gathered) and once causally over its new tokens, and merges the two by
log-sum-exp. For a batch of many requests with tens to hundreds of new tokens each -- a
multi-turn chat's follow-ups, a batch of short prompts -- those calls are small and the Python
around them is per request and layer. This kernel does the whole batch in one call per layer:
every request's new tokens over its prefix and themselves, causal, K/V read from the pool's
slots (see the source for how). Measured in the engine on 2 cores, kernel on vs off in one
process (whole forwards): 7 requests x 66 new tokens over 600 cached 406 -> 352 ms; 8 cold
340-token prompts 1,652 -> 1,474 ms; 106 new over 2,038 cached 156 -> 151 ms; a cold 2,144-token
prompt 1,735 -> 1,682 ms.

It serves dense fp32 pools at head_dim 64 on AVX-512 CPUs (where it was measured); elsewhere
`library()` is None and the flash path runs (tests compare the two).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch

from radixkv.attention.cpu_decode import rows_contiguous
from radixkv.errors import CacheInvariantError
from radixkv.native import NativeLibrary



def _declare(lib: ctypes.CDLL) -> None:
    p, i = ctypes.c_void_p, ctypes.c_int64
    lib.radixkv_paged_extend.argtypes = [p, i, p, p, p, p, p, p, p, i, i, i, i, i, i, i, ctypes.c_float]
    lib.radixkv_paged_extend.restype = ctypes.c_int64
    lib.radixkv_paged_extend_vector_bits.restype = ctypes.c_int64


KERNEL = NativeLibrary("paged_extend", Path(__file__).with_name("csrc") / "paged_extend.cpp", 1, _declare)


def library() -> ctypes.CDLL | None:
    """The built kernel, building it on first use; None when it cannot be had or was built
    without AVX-512 (it computes nothing there)."""
    lib = KERNEL.get()
    return lib if lib is not None and lib.radixkv_paged_extend_vector_bits() == 512 else None


@dataclass(frozen=True)
class ExtendRows:
    """The requests one kernel call attends, planned once per forward."""

    slots: torch.Tensor  # (B, L) int64 each request's KV slots, its first kv_len used
    kv_len: torch.Tensor  # (B,) int64 keys each request attends: its prefix + its new tokens
    q_start: torch.Tensor  # (B,) int64 the first row of its new tokens in T
    q_len: torch.Tensor  # (B,) int64 its new tokens (the last of its keys)


def usable(q: torch.Tensor, k_buffer, v_buffer) -> bool:
    """Whether the kernel serves these tensors: CPU fp32, head_dim 64, contiguous pool buffers."""
    return (isinstance(k_buffer, torch.Tensor) and isinstance(v_buffer, torch.Tensor) and q.device.type == "cpu"
            and q.dtype == k_buffer.dtype == v_buffer.dtype == torch.float32 and q.shape[-1] == 64
            and k_buffer.is_contiguous() and v_buffer.is_contiguous() and library() is not None)


def paged_extend(
    q: torch.Tensor,  # (T, Hq, 64) fp32
    k_buffer: torch.Tensor,  # (S, Hkv, 64) fp32, contiguous, the new tokens' K/V already stored
    v_buffer: torch.Tensor,  # (S, Hkv, 64)
    rows: ExtendRows,
    sm_scale: float,
    out: torch.Tensor,  # (T, Hq, 64) fp32 contiguous: the requests' rows are written
) -> None:
    """Causal attention of each request's new tokens over its slots (see the module docstring)."""
    q = rows_contiguous(q)
    T, Hq, D = q.shape
    S, Hkv, _ = k_buffer.shape
    assert out.is_contiguous() and out.shape == q.shape, (out.stride(), out.shape)
    B, L = rows.slots.shape
    bad = library().radixkv_paged_extend(q.data_ptr(), q.stride(0), k_buffer.data_ptr(), v_buffer.data_ptr(),
                                         rows.slots.data_ptr(), rows.kv_len.data_ptr(), rows.q_start.data_ptr(),
                                         rows.q_len.data_ptr(), out.data_ptr(), B, T, Hq, Hkv, D, L, S,
                                         float(sm_scale))
    if bad < 0:
        raise RuntimeError(f"paged extend: no kernel for head_dim {D}, {Hq} / {Hkv} heads")
    if bad:
        raise CacheInvariantError(f"paged extend: {bad} of {B} requests list slots outside the pool's {S}, "
                                  f"or more than their {L} columns, or rows outside the batch's {T}")
