"""Paged attention as one opaque operator of a compiled model graph (`radixkv::attention`).

A compiled forward (`radixkv.model.compiled`) traces the model's layers into one graph; the
attention of each layer -- storing the new tokens' K/V into the pool, then attending over each
request's pages -- stays outside it, as this custom op. The op's arguments are the tensors the
layer computed and the layer's constants; what the graph cannot hold (the backend, the
`ForwardBatch` with its per-forward plans, the pool) comes from the *forward context* that
`forward_context` sets around each call of the compiled graph, as vLLM's graphs do. The paged
backends therefore run unchanged under compilation, and the graph does not depend on a batch's
layout: one graph serves every batch size and prompt length.

The op declares no mutated arguments: the pool it writes is not a graph input, so the compiler
cannot reorder around it, and every layer's call stays in program order.

On the CPU its kernel is C++ (`csrc/attention_ops.cpp`, built on first use): a pure decode step
on a dense fp32 pool -- the backend's direct path, one `paged_decode` call per layer -- runs
there without Python (the Python around that call cost ~40 us a layer, more than a short
decode step's attention); every other batch is handed to `radixkv::attention_py`, the Python
implementation, which is also the operator's kernel where the C++ one cannot be built.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from radixkv.attention.backend import AttentionBackend
from radixkv.attention.forward_batch import ForwardBatch
from radixkv.native import NativeLibrary

NATIVE = NativeLibrary("attention_ops", Path(__file__).with_name("csrc") / "attention_ops.cpp", 1, lambda lib: None,
                       torch_ops=True)

_active: list[tuple[AttentionBackend, ForwardBatch]] = []
_native_state: list[bool] = []  # [whether the C++ kernel is registered], once looked for
_native_lock = threading.Lock()

_SCHEMA = "(Tensor q, Tensor k, Tensor v, int layer, float sm_scale, int? sliding_window) -> Tensor"
_lib = torch.library.Library("radixkv", "FRAGMENT")  # kept alive: the definitions live as long as it
_lib.define("attention" + _SCHEMA)
_lib.define("attention_py" + _SCHEMA)


def native_kernel() -> bool:
    """Whether `radixkv::attention` has its C++ CPU kernel (`csrc/attention_ops.cpp`), building
    it on the first call; without it every call takes the Python implementation."""
    with _native_lock:
        if not _native_state:
            _native_state.append(NATIVE.get() is not None)
        return _native_state[0]


@contextmanager
def forward_context(backend: AttentionBackend, fb: ForwardBatch) -> Iterator[None]:
    """Within this block, `radixkv::attention` runs `backend` over `fb` (begun here).

    When the backend serves the whole forward by its direct decode path, the C++ kernel gets
    that path's inputs here, once, and runs each layer's call without Python."""
    backend.begin_forward(fb)
    _active.append((backend, fb))
    direct = backend.direct_decode(fb) if fb.out_cache_loc.is_cpu and native_kernel() else None
    if direct is not None:
        torch.ops.radixkv.direct_decode_begin(*direct)
    try:
        yield
    finally:
        if direct is not None:
            torch.ops.radixkv.direct_decode_end()
        _active.pop()


def _python_attention(
    q: torch.Tensor,  # (T, Hq, D)
    k: torch.Tensor,  # (T, Hkv, D)
    v: torch.Tensor,  # (T, Hkv, D)
    layer: int,
    sm_scale: float,
    sliding_window: int | None,
) -> torch.Tensor:  # (T, Hq, D)
    """Store k, v into the pool's slots for this forward, then attend (the active backend)."""
    if not _active:
        raise RuntimeError("radixkv::attention called outside forward_context()")
    backend, fb = _active[-1]
    return backend.forward(q, k, v, layer, sm_scale, sliding_window, fb)


# Every device: the Python path; on the CPU the C++ kernel, once loaded, takes precedence.
_lib.impl("attention", _python_attention, "CompositeExplicitAutograd")
_lib.impl("attention_py", _python_attention, "CompositeExplicitAutograd")


@torch.library.register_fake("radixkv::attention")
def _(q, k, v, layer, sm_scale, sliding_window):
    return torch.empty_like(q)


class GraphAttention:
    """What a model's layers call as their backend while being traced: each call becomes one
    `radixkv::attention` node (the `fb` argument is the forward context's, not a graph input)."""

    name = "graph"

    def forward(self, q, k, v, layer: int, sm_scale: float, sliding_window: int | None, fb) -> torch.Tensor:
        return torch.ops.radixkv.attention(q, k, v, layer, sm_scale, sliding_window)
