"""Attention backends: paged attention over the KV pool, reached through `req_to_token`.

All backends have one interface and run the same math:
- `torch` (the CPU default): torch's fused flash kernel without dense masks
  (`radixkv.attention.sdpa_paged`); sliding-window layers, and non-CPU devices, take the
  reference path.
- `triton` (the CUDA default): the Triton kernels in `radixkv.kernels` (on CPU only under
  `TRITON_INTERPRET=1`, for tests).
- `reference`: `radixkv.kernels.reference` (gather + masked SDPA), the ground truth the others
  are tested against; slow, for debugging numerics.

Each layer's call stores the new tokens' K/V into their slots, then attends over prefix + new
tokens. An extend batch may mix requests with many new tokens (prefill chunks) and requests
with one (decode steps riding in the same forward).

`begin_forward(fb)` is called once per model forward, before the first layer: per-forward work
that every layer shares (gather indices, masks) happens there.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod

import torch

from radixkv.attention import cpu_decode, sdpa_paged, sdpa_plan
from radixkv.attention.forward_batch import ForwardBatch, ForwardMode
from radixkv.errors import ConfigError
from radixkv.mem.kv_pool import KVPool

BACKENDS = ("torch", "triton", "reference")

# One direct decode forward: each layer's K and V buffers (S, Hkv, D) fp32, the rows' slots
# (B, L) int64, their lengths (B,) int64, the new tokens' slots (B,) int64.
DirectDecode = tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]


class AttentionBackend(ABC):
    """Runs one layer's attention for the current `ForwardBatch`."""

    name: str

    def __init__(self, pool: KVPool, req_to_token: torch.Tensor):
        self.pool = pool
        self.req_to_token = req_to_token  # (R, L) int32
        self._fb: ForwardBatch | None = None

    def begin_forward(self, fb: ForwardBatch) -> None:
        """Start a model forward over `fb` (every layer's `forward` then receives this batch)."""
        self._fb = fb

    def direct_decode(self, fb: ForwardBatch) -> DirectDecode | None:
        """When every layer of this forward attends by one `paged_decode` call that stores the
        new K/V and reads the pool in place, that call's inputs (`graph_op` hands them to its
        C++ kernel once per forward); else None. Call after `begin_forward(fb)`."""
        return None

    def forward(
        self,
        q: torch.Tensor,  # (T, Hq, D)
        k: torch.Tensor,  # (T, Hkv, D)
        v: torch.Tensor,  # (T, Hkv, D)
        layer: int,
        sm_scale: float,
        sliding_window: int | None,
        fb: ForwardBatch,
    ) -> torch.Tensor:  # (T, Hq, D)
        if fb is not self._fb:
            raise RuntimeError("attention called outside begin_forward() of this batch")
        self.pool.store(layer, fb.out_cache_loc, k, v)  # the pool's one store path
        return self.attend(q, k, v, layer, sm_scale, sliding_window, fb)

    @abstractmethod
    def attend(self, q, k, v, layer, sm_scale, sliding_window, fb) -> torch.Tensor:
        """Attention of the new tokens `q` (their K/V `k`, `v` already stored) -> (T, Hq, D)."""


class ReferenceBackend(AttentionBackend):
    """Gather + masked SDPA (`radixkv.kernels.reference`); plans built once per forward and window."""

    name = "reference"

    def __init__(self, pool: KVPool, req_to_token: torch.Tensor):
        super().__init__(pool, req_to_token)
        from radixkv.kernels import reference

        self.ref = reference
        self._plans: dict[int | None, object] = {}

    def begin_forward(self, fb: ForwardBatch) -> None:
        super().begin_forward(fb)
        self._plans = {}

    def attend(self, q, k, v, layer, sm_scale, sliding_window, fb):
        # the pool's read views: the raw tensors, or views dequantising the slots gathered
        k_buf, v_buf = self.pool.k_view(layer), self.pool.v_view(layer)  # (S, Hkv, D)
        plan = self._plans.get(sliding_window)
        if fb.mode is ForwardMode.DECODE:
            if plan is None:
                plan = self._plans[sliding_window] = self.ref.plan_decode(
                    self.req_to_token, fb.req_pool_indices, fb.seq_lens, sliding_window)
            return self.ref.decode_attention_planned(q, k_buf, v_buf, plan, sm_scale)
        if plan is None:
            plan = self._plans[sliding_window] = self.ref.plan_extend(
                self.req_to_token, fb.req_pool_indices, fb.seq_lens, fb.prefix_lens,
                fb.extend_start_loc, sliding_window)
        return self.ref.extend_attention_planned(q, k_buf, v_buf, plan, sm_scale)


class TorchBackend(ReferenceBackend):
    """torch's fused CPU attention without dense masks; the reference path for windowed layers."""

    name = "torch"

    def __init__(self, pool: KVPool, req_to_token: torch.Tensor):
        super().__init__(pool, req_to_token)
        self.fused = pool.device.type == "cpu"
        self._sdpa_plan: sdpa_plan.SdpaPlan | None = None
        self._direct: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # per layer: fp32 K, V (S, Hkv, D)
        self._direct_lists: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None  # K's, V's
        self._direct_decode: sdpa_plan.DecodeRows | None | bool = False  # False: not decided this forward

    def begin_forward(self, fb: ForwardBatch) -> None:
        super().begin_forward(fb)
        self._sdpa_plan = None
        self._direct_decode = False

    def forward(self, q, k, v, layer, sm_scale, sliding_window, fb):
        """A pure decode batch on a dense fp32 pool stores and attends in one C++ call per layer
        (`cpu_decode`): at small batch the separate store and the Python around it cost more than
        the attention itself. Every other batch takes the store-then-attend path."""
        if fb is self._fb and sliding_window is None and q.dtype == k.dtype == torch.float32:
            d = self._direct_decode if self._direct_decode is not False else self._plan_direct_decode(fb)
            if d is not None:
                kb, vb = self._direct[layer]
                return sdpa_paged.kernel_decode_rows(q, kb, vb, d, sm_scale, store=(k, v, fb.out_cache_loc))
        return super().forward(q, k, v, layer, sm_scale, sliding_window, fb)

    def direct_decode(self, fb: ForwardBatch) -> DirectDecode | None:
        if fb is not self._fb:
            return None
        d = self._direct_decode if self._direct_decode is not False else self._plan_direct_decode(fb)
        if d is None or d.shared:  # shared prefixes are merged in Python (`kernel_decode_rows`)
            return None
        if self._direct_lists is None:  # the pool's buffers, fixed for the backend's life
            self._direct_lists = [k for k, _ in self._direct], [v for _, v in self._direct]
        return (*self._direct_lists, d.slots.view(-1, d.max_len), d.lens, fb.out_cache_loc)

    def _plan_direct_decode(self, fb: ForwardBatch) -> sdpa_plan.DecodeRows | None:
        """This forward's decode rows when the direct path serves it, else None (decided once)."""
        self._direct_decode = None
        if not self.fused or fb.mode is not ForwardMode.DECODE or self.pool.layout.latent:
            return None
        if self._direct is None:
            kv = [self.pool.kernel_buffers(layer) for layer in range(self.pool.layout.num_layers)]
            self._direct = [(b.k, b.v) for b in kv] if all(
                b.kv_format == "dense" and b.k.dtype == torch.float32 and b.k.is_contiguous() and b.v.is_contiguous()
                for b in kv) else []
        if not self._direct or cpu_decode.library() is None:
            return None
        d = self._plan(fb).decode
        if d is not None and d.all_rows:
            self._direct_decode = d
        return self._direct_decode

    def _plan(self, fb: ForwardBatch) -> sdpa_plan.SdpaPlan:
        if self._sdpa_plan is None:
            self._sdpa_plan = sdpa_plan.plan(self.req_to_token, fb.req_pool_indices, fb.seq_lens,
                                              fb.prefix_lens, fb.extend_start_loc, fb.num_tokens)
        return self._sdpa_plan

    def attend(self, q, k, v, layer, sm_scale, sliding_window, fb):
        if sliding_window is not None or not self.fused:
            return super().attend(q, k, v, layer, sm_scale, sliding_window, fb)
        return sdpa_paged.attention(q, k, v, self.pool.k_view(layer), self.pool.v_view(layer),
                                    self._plan(fb), sm_scale, fb.out_cache_loc)


class TritonBackend(AttentionBackend):
    """Triton kernels: store KV, extend attention, split-KV decode attention; latent (MLA) pools
    decode with the MLA kernel, which returns only the latent values (zeros in the RoPE columns)."""

    name = "triton"

    def __init__(self, pool: KVPool, req_to_token: torch.Tensor):
        if pool.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ConfigError(
                "attention_backend='triton' needs a CUDA device (or TRITON_INTERPRET=1 for "
                "slow CPU testing); use attention_backend='torch' on CPU"
            )
        super().__init__(pool, req_to_token)
        import radixkv.kernels as kernels

        self.kernels = kernels

    def attend(self, q, k, v, layer, sm_scale, sliding_window, fb):
        kv = self.pool.kernel_buffers(layer)  # raw storage: the kernels dequantise tile by tile
        fmt = dict(k_scale=kv.k_scale, v_scale=kv.v_scale, kv_format=kv.kv_format, group=kv.group)
        if fb.mode is ForwardMode.EXTEND:
            return self.kernels.extend_attention(
                q, kv.k, kv.v, self.req_to_token, fb.req_pool_indices, fb.seq_lens,
                fb.prefix_lens, fb.extend_start_loc, fb.max_extend_len, sm_scale, sliding_window,
                **fmt)
        if self.pool.layout.latent and kv.kv_format == "dense":  # MLA: one read of each latent for all heads
            return self.kernels.mla_decode_attention(
                q, kv.k, self.req_to_token, fb.req_pool_indices, fb.seq_lens, sm_scale,
                self.pool.layout.latent_values)
        return self.kernels.decode_attention(
            q, kv.k, kv.v, self.req_to_token, fb.req_pool_indices, fb.seq_lens,
            sm_scale, sliding_window, **fmt)


def make_backend(name: str, pool: KVPool, req_to_token: torch.Tensor) -> AttentionBackend:
    """The backend called `name` (one of `BACKENDS`) over `pool`."""
    classes = {"torch": TorchBackend, "triton": TritonBackend, "reference": ReferenceBackend}
    if name not in classes:
        raise ConfigError(f"unknown attention backend {name!r}; choose one of {BACKENDS}")
    return classes[name](pool, req_to_token)
