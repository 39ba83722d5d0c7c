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
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from radixkv.attention.backend import AttentionBackend
from radixkv.attention.forward_batch import ForwardBatch

_active: list[tuple[AttentionBackend, ForwardBatch]] = []


@contextmanager
def forward_context(backend: AttentionBackend, fb: ForwardBatch) -> Iterator[None]:
    """Within this block, `radixkv::attention` runs `backend` over `fb` (begun here)."""
    backend.begin_forward(fb)
    _active.append((backend, fb))
    try:
        yield
    finally:
        _active.pop()


@torch.library.custom_op("radixkv::attention", mutates_args=())
def paged_attention(
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


@paged_attention.register_fake
def _(q, k, v, layer, sm_scale, sliding_window):
    return torch.empty_like(q)


class GraphAttention:
    """What a model's layers call as their backend while being traced: each call becomes one
    `radixkv::attention` node (the `fb` argument is the forward context's, not a graph input)."""

    name = "graph"

    def forward(self, q, k, v, layer: int, sm_scale: float, sliding_window: int | None, fb) -> torch.Tensor:
        return torch.ops.radixkv.attention(q, k, v, layer, sm_scale, sliding_window)
