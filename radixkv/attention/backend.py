"""Attention backends: paged attention over the KV pool, reached through `req_to_token`.

Both backends have one interface and run the same math: `torch` uses the reference
implementations in `radixkv.kernels.reference` (gather + SDPA; the CPU default), `triton` the
Triton kernels in `radixkv.kernels` (the CUDA default; on CPU only under `TRITON_INTERPRET=1`,
for tests). Each layer's call stores the new tokens' K/V into their slots, then attends over
prefix + new tokens (extend) or over the whole sequence (decode).

`begin_forward(fb)` is called once per model forward, before the first layer: per-forward work
that every layer shares (the torch backend's gather indices and masks) happens there.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod

import torch

from radixkv.attention.forward_batch import ForwardBatch, ForwardMode
from radixkv.errors import ConfigError
from radixkv.mem.kv_pool import KVPool

BACKENDS = ("torch", "triton")


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
        k_buf = self.pool.k_slots(layer)  # (S, Hkv, D)
        v_buf = self.pool.v_slots(layer)  # (S, Hkv, D)
        self.store_kv(k_buf, v_buf, fb.out_cache_loc, k, v)
        if fb.mode is ForwardMode.DECODE:
            return self.decode(q, k_buf, v_buf, sm_scale, sliding_window, fb)
        return self.extend(q, k_buf, v_buf, sm_scale, sliding_window, fb)

    @abstractmethod
    def store_kv(self, k_buf, v_buf, loc, k, v) -> None: ...

    @abstractmethod
    def extend(self, q, k_buf, v_buf, sm_scale, sliding_window, fb) -> torch.Tensor: ...

    @abstractmethod
    def decode(self, q, k_buf, v_buf, sm_scale, sliding_window, fb) -> torch.Tensor: ...


class TorchBackend(AttentionBackend):
    """Reference attention (gather + SDPA); plans are built once per forward and window size."""

    name = "torch"

    def __init__(self, pool: KVPool, req_to_token: torch.Tensor):
        super().__init__(pool, req_to_token)
        from radixkv.kernels import reference

        self.ref = reference
        self._plans: dict[int | None, object] = {}

    def begin_forward(self, fb: ForwardBatch) -> None:
        super().begin_forward(fb)
        self._plans = {}

    def store_kv(self, k_buf, v_buf, loc, k, v) -> None:
        self.ref.store_kv(k_buf, v_buf, loc, k, v)

    def extend(self, q, k_buf, v_buf, sm_scale, sliding_window, fb):
        plan = self._plans.get(sliding_window)
        if plan is None:
            plan = self._plans[sliding_window] = self.ref.plan_extend(
                self.req_to_token, fb.req_pool_indices, fb.seq_lens, fb.prefix_lens,
                fb.extend_start_loc, sliding_window)
        return self.ref.extend_attention_planned(q, k_buf, v_buf, plan, sm_scale)

    def decode(self, q, k_buf, v_buf, sm_scale, sliding_window, fb):
        plan = self._plans.get(sliding_window)
        if plan is None:
            plan = self._plans[sliding_window] = self.ref.plan_decode(
                self.req_to_token, fb.req_pool_indices, fb.seq_lens, sliding_window)
        return self.ref.decode_attention_planned(q, k_buf, v_buf, plan, sm_scale)


class TritonBackend(AttentionBackend):
    """Triton kernels: store KV, extend attention, split-KV decode attention."""

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

    def store_kv(self, k_buf, v_buf, loc, k, v) -> None:
        self.kernels.store_kv(k_buf, v_buf, loc, k, v)

    def extend(self, q, k_buf, v_buf, sm_scale, sliding_window, fb):
        return self.kernels.extend_attention(
            q, k_buf, v_buf, self.req_to_token, fb.req_pool_indices, fb.seq_lens,
            fb.prefix_lens, fb.extend_start_loc, fb.max_extend_len, sm_scale, sliding_window)

    def decode(self, q, k_buf, v_buf, sm_scale, sliding_window, fb):
        return self.kernels.decode_attention(
            q, k_buf, v_buf, self.req_to_token, fb.req_pool_indices, fb.seq_lens,
            sm_scale, sliding_window)


def make_backend(name: str, pool: KVPool, req_to_token: torch.Tensor) -> AttentionBackend:
    """The backend called `name` ('torch' or 'triton') over `pool`."""
    classes = {"torch": TorchBackend, "triton": TritonBackend}
    if name not in classes:
        raise ConfigError(f"unknown attention backend {name!r}; choose one of {BACKENDS}")
    return classes[name](pool, req_to_token)
