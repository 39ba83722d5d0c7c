"""The preallocated KV pool: per-layer K and V pages on one torch device.

Layout per layer: `(num_pages + 1, page_size, num_kv_heads, head_dim)`; page 0 is the padding
sink (see `allocator.PADDING_PAGE`). Viewed flat, the same storage is `(num_slots, num_kv_heads,
head_dim)` with `slot = page * page_size + offset`, which is what attention kernels index.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixkv.errors import ConfigError
from radixkv.mem.allocator import PADDING_PAGE


@dataclass(frozen=True, slots=True)
class KVLayout:
    """Shape of the KV cache of one model; sizes in tokens, pages and bytes derive from it."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "page_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"KVLayout.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def bytes_per_token(self) -> int:
        """K and V of every layer for one token: `2 * layers * kv_heads * head_dim * dtype_bytes`."""
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * itemsize

    @property
    def bytes_per_page(self) -> int:
        return self.bytes_per_token * self.page_size

    def num_pages_for(self, *, max_tokens: int | None = None, max_bytes: int | None = None) -> int:
        """Usable pages fitting a token budget or a byte budget (exactly one must be given)."""
        if (max_tokens is None) == (max_bytes is None):
            raise ConfigError("give exactly one of max_tokens or max_bytes")
        if max_tokens is not None:
            if max_tokens < self.page_size:
                raise ConfigError(
                    f"max_total_tokens={max_tokens} is smaller than one page ({self.page_size})"
                )
            return max_tokens // self.page_size
        # one extra page is the padding sink
        pages = max_bytes // self.bytes_per_page - 1
        if pages < 1:
            raise ConfigError(
                f"KV memory budget of {max_bytes} bytes is smaller than two pages "
                f"({2 * self.bytes_per_page} bytes)"
            )
        return pages


class KVPool:
    """K and V page storage for every layer, allocated once."""

    def __init__(self, layout: KVLayout, num_pages: int, device: torch.device | str = "cpu"):
        if num_pages < 1:
            raise ConfigError(f"num_pages must be >= 1, got {num_pages}")
        self.layout = layout
        self.num_pages = num_pages
        self.page_size = layout.page_size
        self.device = torch.device(device)
        shape = (num_pages + 1, layout.page_size, layout.num_kv_heads, layout.head_dim)
        # Uninitialised: a slot is always written before it is read, except the padding page,
        # which padded positions read and must hold finite values (zeros). Memory is touched
        # only as pages are used, so a large pool costs nothing at start-up.
        self.k_pages = [
            torch.empty(shape, dtype=layout.dtype, device=self.device)
            for _ in range(layout.num_layers)
        ]  # per layer: (num_pages + 1, page_size, H_kv, D)
        self.v_pages = [torch.empty_like(k) for k in self.k_pages]
        for k, v in zip(self.k_pages, self.v_pages):
            k[PADDING_PAGE].zero_()
            v[PADDING_PAGE].zero_()

    @property
    def num_slots(self) -> int:
        return (self.num_pages + 1) * self.page_size

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k_pages + self.v_pages)

    def k_slots(self, layer: int) -> torch.Tensor:
        return self.k_pages[layer].view(self.num_slots, *self.k_pages[layer].shape[2:])  # (S, H_kv, D)

    def v_slots(self, layer: int) -> torch.Tensor:
        return self.v_pages[layer].view(self.num_slots, *self.v_pages[layer].shape[2:])  # (S, H_kv, D)

    def store(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write new tokens' K/V: slots (T,), k and v (T, H_kv, D)."""
        self.k_slots(layer)[slots] = k.to(self.layout.dtype)
        self.v_slots(layer)[slots] = v.to(self.layout.dtype)

    def copy_page(self, src: int, dst: int) -> None:
        """Copy one page's K/V in every layer (copy-on-write of a shared partial page)."""
        for k, v in zip(self.k_pages, self.v_pages):
            k[dst].copy_(k[src])
            v[dst].copy_(v[src])
