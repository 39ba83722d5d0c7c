"""Running the model fast on a CPU: compute threads, the memory allocator, prepacked weights.

Three things decide CPU inference speed beyond the model math, each measured on the 2-core
development machine (`benchmarks/roofline.py`):

- **Threads.** Torch defaults to every core of the machine, not the cores this process may use
  (a container or `taskset` limits those), and oversubscribed cores slow generation by an
  order of magnitude. `choose_num_threads` takes the process's CPU affinity.
- **The allocator.** glibc returns large freed blocks to the OS (`munmap`, heap trimming), so
  every per-step temporary of a few MB (a decode step's gathered KV, a prefill's activations)
  comes back as fresh pages that fault in one by one: the KV gather of a batch-8 decode step
  ran at 3 GB/s instead of 17. `tune_malloc` keeps freed memory in the process.
- **Prepacked weights.** `F.linear` at 1-32 rows reads fp32 weights at 3-10 GB/s through MKL
  on this CPU; oneDNN with the weight reordered once into its blocked layout runs the same
  products at the memory or matmul limit (the 49,152 x 576 output layer at batch 8: 8 ms
  instead of 28-45 ms). `prepack_linears` swaps every `nn.Linear` of a loaded model for a
  `PackedLinear` that holds only the packed copy. At decode-sized row counts our own kernel
  reads that same copy (`packed_gemm`), faster than oneDNN's there.
"""

from __future__ import annotations

import ctypes
import logging
import os

import torch
from torch import nn

from radixkv.model import linear_ops, packed_gemm

logger = logging.getLogger(__name__)

# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling on 64-bit


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask), or the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def choose_num_threads(requested: int | None) -> int:
    """Set torch's intra-op threads to `requested`, or to the usable cores; returns the choice."""
    n = requested if requested is not None else usable_cores()
    torch.set_num_threads(n)
    return n


_malloc_tuned = False


def tune_malloc() -> bool:
    """Keep freed heap memory in the process (glibc only); whether it took effect.

    Large temporaries then reuse warm pages instead of faulting in fresh ones every step. The
    cost: the process does not hand memory back to the OS after a peak, as a server should not.
    """
    global _malloc_tuned
    if _malloc_tuned:
        return True
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = (mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX) == 1
          and mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1
          and mallopt(_M_TOP_PAD, 64 << 20) == 1)
    _malloc_tuned = ok
    return ok


def packing_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN prepacking: CPU, fp32 (its bf16 path needs AVX-512 or AVX-NE-CONVERT)."""
    return (device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


class PackedLinear(nn.Module):
    """`y = x @ W.T + b` with W held only in oneDNN's blocked layout (CPU, fp32).

    The packed copy works for any number of rows; it is not a regular tensor (no `.data`), so
    the module keeps `in_features` / `out_features` for code that asks.

    A compiled graph cannot hold the packed copy (the compiler neither traces nor caches oneDNN
    tensors), so under tracing the product becomes one `radixkv::packed_linear` node whose input
    is the module's `key`, a one-element tensor naming this module (`linear_ops`). The graph then
    refers to no particular model: the same compiled code (and its on-disk cache) serves any
    load of the same architecture, each call finding its own weights.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):  # weight: (out, in)
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())
        self.bias = None if bias is None else bias.detach().float().clone()
        self.small = packed_gemm.PanelGemm.of(self.packed, self.out_features, self.in_features, self.bias)
        self.register_buffer("key", linear_ops.new_key(), persistent=False)  # (1,) int64 names this module
        linear_ops.register(self, None if self.small is None else self.small.width, torch.ops.mkldnn.data_ptr(self.packed))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """(T, in) -> (T, out), plus `residual` (T, out) if given, added inside the GEMM."""
        if torch.compiler.is_compiling():
            if residual is not None:
                return torch.ops.radixkv.packed_linear_add(x, residual, self.key)
            return torch.ops.radixkv.packed_linear(x, self.key, self.out_features)
        return self.product(x, residual)

    def product(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if self.small is not None and self.small.serves(x):  # decode-sized rows: our kernel, same buffer
            return self.small(x, residual)
        if residual is not None:
            return torch.ops.mkldnn._linear_pointwise.binary(x, residual, self.packed, self.bias, "add")
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def linear_add(linear: nn.Module, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """`linear(x) + residual`, fused into one kernel when `linear` is packed."""
    if isinstance(linear, PackedLinear):
        return linear(x, residual)
    return linear(x) + residual


def prepack_linears(model: nn.Module) -> int:
    """Replace every `nn.Linear` under `model` by a `PackedLinear`; returns how many.

    The dense weights are dropped (no second copy in memory). Call after loading weights.
    """
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, PackedLinear(child.weight, child.bias))
                count += 1
    return count
