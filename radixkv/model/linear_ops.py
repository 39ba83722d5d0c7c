"""The prepacked linear layers as operators of a compiled graph: `radixkv::packed_linear` and
`radixkv::packed_linear_add` (x @ W.T + b, plus a residual added inside the GEMM).

A compiled graph cannot hold oneDNN's packed weight, so each `PackedLinear` (`cpu_runtime`) is
named in the graph by its `key`, a one-element int64 tensor holding an id; the operator finds
the layer's weight by that id. The schemas and fake kernels are defined here at import. The CPU
kernel comes from one of two places, chosen once per process on the first registration:

- `csrc/linear_ops.cpp`, built on first use like the other kernels (`radixkv.native`, against
  torch's headers): the weight registry and both products in C++, so a call costs about 1.5 us
  where a Python implementation costs 8 (121 calls per decode step of SmolLM2);
- without it (no compiler, `RADIXKV_CPU_KERNELS=0`, a failed build): Python implementations that
  call the layer's own `product`, with the same results.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from pathlib import Path
from typing import Protocol

import torch

from radixkv.native import NativeLibrary

NATIVE = NativeLibrary("linear_ops", Path(__file__).with_name("csrc") / "linear_ops.cpp", 1, lambda lib: None,
                       torch_ops=True)

_lib = torch.library.Library("radixkv", "FRAGMENT")  # kept alive: the definitions live as long as it
_lib.define("packed_linear(Tensor x, Tensor key, int out_features) -> Tensor")
_lib.define("packed_linear_add(Tensor x, Tensor residual, Tensor key) -> Tensor")


@torch.library.register_fake("radixkv::packed_linear")
def _(x, key, out_features):
    return x.new_empty((x.shape[0], out_features))  # (T, out)


@torch.library.register_fake("radixkv::packed_linear_add")
def _(x, residual, key):
    return torch.empty_like(residual)  # (T, out)


class Packed(Protocol):
    """What the operators need of a layer (`cpu_runtime.PackedLinear`)."""

    key: torch.Tensor
    packed: torch.Tensor
    bias: torch.Tensor | None
    out_features: int
    in_features: int

    def product(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor: ...


_ids = itertools.count(1)
_by_id: weakref.WeakValueDictionary[int, Packed] = weakref.WeakValueDictionary()
_impl: list[str] = []  # "native" or "python", once chosen
_impl_lock = threading.Lock()


def new_key() -> torch.Tensor:  # (1,) int64
    """A fresh id for a layer, as the tensor its graph nodes carry."""
    return torch.tensor([next(_ids)], dtype=torch.int64)


def implementation() -> str:
    """Which CPU kernel the operators run: "native" (C++) or "python"; chosen on first call."""
    with _impl_lock:
        if not _impl:
            if NATIVE.get() is not None:
                _impl.append("native")
            else:
                _lib.impl("packed_linear", _python_linear, "CPU")
                _lib.impl("packed_linear_add", _python_linear_add, "CPU")
                _impl.append("python")
        return _impl[0]


def register(layer: Packed, panel_width: int | None, panels_address: int) -> None:
    """Make `layer` what its key names (until it is collected). `panel_width`: the kernel's
    panel width over `layer.packed` (None: oneDNN only)."""
    uid = int(layer.key.item())
    _by_id[uid] = layer
    if implementation() == "native":
        torch.ops.radixkv.packed_register(layer.key, layer.packed, layer.bias, layer.out_features,
                                          layer.in_features, panel_width or 0, panels_address if panel_width else 0)
        weakref.finalize(layer, torch.ops.radixkv.packed_unregister, uid)


def _layer(key: torch.Tensor) -> Packed:
    layer = _by_id.get(int(key.item()))
    if layer is None:
        raise RuntimeError(f"radixkv::packed_linear: no live PackedLinear owns key {int(key.item())}")
    return layer


def _python_linear(x: torch.Tensor, key: torch.Tensor, out_features: int) -> torch.Tensor:  # (T, in) -> (T, out)
    return _layer(key).product(x)


def _python_linear_add(x: torch.Tensor, residual: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    return _layer(key).product(x, residual)  # (T, in) -> (T, out) + residual
