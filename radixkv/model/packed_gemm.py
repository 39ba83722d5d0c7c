"""Decode-sized products read straight from oneDNN's packed weights (`csrc/packed_gemm.cpp`).

`PackedLinear` holds each weight once, in the blocked layout oneDNN chose for it. oneDNN's
kernels over that buffer run prefill-sized products at the matmul limit, but at 1-16 rows (a
decode step) they read the weights at 55-85 % of the memory's rate (`benchmarks/roofline.py`).
For those rows our kernel reads the same buffer, no second copy: when oneDNN packed an (N, K)
weight as panels `P[N / NB][K][NB]` (NB columns of W^T contiguous per k; on AVX-512 machines
NB = 64), `panel_width` says NB, found once per memory layout by packing a probe weight of the
same shape whose values encode their own column and row. Any other layout (padding,
another ISA's blocking): None, and oneDNN keeps every product of that weight.

Used for at most `MAX_ROWS` rows, where it measured faster than oneDNN on the 2-core AVX-512
development machine (1.7x at 1 row, 1.5x at 8, 1.1x at 16, 1.07x at 24, equal at 32), and only
where the kernel was built for AVX-512 (the machine it was measured on).
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import torch

from radixkv.native import NativeLibrary

MAX_ROWS = 24


def _declare(lib: ctypes.CDLL) -> None:
    p, i = ctypes.c_void_p, ctypes.c_int64
    lib.radixkv_packed_gemm.argtypes = [p, i, p, p, p, p, i, i, i, i]
    lib.radixkv_packed_gemm.restype = None
    lib.radixkv_packed_gemm_vector_bits.restype = i


KERNEL = NativeLibrary("packed_gemm", Path(__file__).with_name("csrc") / "packed_gemm.cpp", 1, _declare)


def library() -> ctypes.CDLL | None:
    """The kernel, when built for AVX-512 (see the module docstring); else None."""
    lib = KERNEL.get()
    if lib is None or lib.radixkv_packed_gemm_vector_bits() != 512:
        return None
    _entry[0] = lib.radixkv_packed_gemm
    return lib


# The loaded entry point, kept here rather than on any layer: a compiled forward saves the
# modules' attributes into its package, which cannot hold a ctypes function.
_entry: list = [None]


def raw_buffer(packed: torch.Tensor) -> torch.Tensor:  # (nbytes / 4,) fp32, sharing the packed memory
    """The packed weight's memory as a flat fp32 tensor (a view: valid while `packed` lives)."""
    count = torch.ops.mkldnn._nbytes(packed) // 4
    return torch.frombuffer((ctypes.c_float * count).from_address(torch.ops.mkldnn.data_ptr(packed)),
                            dtype=torch.float32, count=count)


_widths: dict[bytes, int | None] = {}
_widths_lock = threading.Lock()


def panel_width(packed: torch.Tensor, out_features: int, in_features: int) -> int | None:
    """NB when `packed` (oneDNN's copy of an (N, K) weight) is laid out as P[N / NB][K][NB]."""
    key = torch.ops.mkldnn._get_mkldnn_serialized_md(packed).numpy().tobytes()
    with _widths_lock:
        if key not in _widths:
            _widths[key] = _probe(key, out_features, in_features)
        return _widths[key]


def _probe(key: bytes, N: int, K: int) -> int | None:
    # W[n, k] = (n mod 2048) * 8192 + (k mod 8192): below 2^24, so exact in fp32; the position of
    # every value in the packed copy then says which column and row it came from.
    n = (torch.arange(N) % 2048).float() * 8192
    k = (torch.arange(K) % 8192).float()
    probe = torch.ops.mkldnn._reorder_linear_weight(n[:, None] + k[None, :])
    if torch.ops.mkldnn._get_mkldnn_serialized_md(probe).numpy().tobytes() != key:
        return None  # oneDNN laid the probe out otherwise: nothing to conclude
    found = raw_buffer(probe)
    if found.numel() != N * K:
        return None  # padded
    for nb in (64, 48, 32, 16):
        if N % nb == 0 and torch.equal(found.view(N // nb, K, nb), n.view(N // nb, 1, nb) + k.view(1, K, 1)):
            return nb
    return None


class PanelGemm:
    """The kernel bound to one packed weight (and its bias): `gemm(x, residual)` for decode rows.
    Its owner keeps `packed` alive (`PackedLinear`).

    Everything fixed per layer (the buffer's address, the bias) is looked up once here, so a call
    costs one check of `x` and one foreign call (121 of them per decode step).
    """

    def __init__(self, packed: torch.Tensor, width: int, out_features: int, in_features: int,
                 bias: torch.Tensor | None):
        self._weight = torch.ops.mkldnn.data_ptr(packed)
        self._bias = None if bias is None else bias.contiguous()
        self._bias_ptr = None if bias is None else self._bias.data_ptr()
        self.width, self.out_features, self.in_features = width, out_features, in_features

    @classmethod
    def of(cls, packed: torch.Tensor, out_features: int, in_features: int,
           bias: torch.Tensor | None) -> PanelGemm | None:
        """The kernel for this weight, or None (not built here, or another layout: oneDNN only)."""
        width = panel_width(packed, out_features, in_features) if library() is not None else None
        return None if width is None else cls(packed, width, out_features, in_features, bias)

    def serves(self, x: torch.Tensor) -> bool:
        """Whether `x` is for the kernel: 1 to `MAX_ROWS` fp32 CPU rows, each contiguous."""
        return (x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS and x.dtype == torch.float32
                and x.device.type == "cpu" and x.stride(1) == 1)

    def __call__(
        self,
        x: torch.Tensor,  # (M, K) fp32, rows contiguous (`serves(x)`)
        residual: torch.Tensor | None = None,  # (M, N)
    ) -> torch.Tensor:  # (M, N): x @ W.T (+ bias) (+ residual)
        M, K = x.shape
        N = self.out_features
        assert K == self.in_features and x.stride(1) == 1, (x.shape, x.stride(), self.in_features)
        if residual is not None:
            assert residual.shape == (M, N), (residual.shape, M, N)
            residual = residual.contiguous().float()
        out = torch.empty(M, N, dtype=torch.float32)
        _entry[0](x.data_ptr(), x.stride(0), self._weight, self._bias_ptr,
                 None if residual is None else residual.data_ptr(), out.data_ptr(), M, N, K, self.width)
        return out
