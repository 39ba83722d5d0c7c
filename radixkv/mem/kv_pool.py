"""The preallocated KV pool: per-layer K and V pages on one torch device, behind one interface.

Every pool stores a layer's tokens as page-major tensors: leading dims `(num_pages + 1,
page_size)`, page 0 being the padding sink (see `allocator.PADDING_PAGE`), so a token's *slot*
is `page * page_size + offset`. What each token becomes depends on the format
(`KVLayout.kv_cache_dtype`, see `radixkv.mem.kv_quant`):

- `DenseKVPool`: K and V `(P+1, page_size, H_kv, D)` in a float dtype (fp8 as bytes);
- `Int8KVPool`: int8 codes of that shape plus float32 scales `(P+1, page_size, H_kv)`;
- `Int4KVPool`: packed bytes `(P+1, page_size, H_kv, D/2)` plus float16 (scale, minimum) pairs
  `(P+1, page_size, H_kv, D/group, 2)`.

The one write path is `store(layer, slots, k, v)` (quantise on store). Attention reads through
`k_view(layer)` / `v_view(layer)`: `(num_slots, H_kv, D)` objects answering `index_select(0,
slots)` and `narrow(0, first, n)` in the model dtype -- the tensor itself for a plain pool, a
dequantising view otherwise, so a gather dequantises only the tokens it reads and the pool is
never copied to full precision. Triton kernels take `kernel_buffers(layer)` (codes + scales) and
dequantise tile by tile. Host-tier transfers and copy-on-write move whole pages of every
storage tensor (`read_pages`, `write_pages`, `copy_page`), whatever the format.

**Latent layouts (MLA).** With `KVLayout.latent`, a token stores one vector per layer -- DeepSeek's
compressed KV (`kv_lora_rank`) followed by its decoupled RoPE key (`qk_rope_head_dim`), as one
"KV head" of `head_dim = kv_lora_rank + qk_rope_head_dim` -- and no separate V: `v_view` is
`k_view`, and the attention output's first `kv_lora_rank` columns are the latent values (the
RoPE columns of the output are dropped by the model). Every format stores the latent the way
it stores K, so the radix cache, copy-on-write, the host tier and every backend work on it
unchanged, at half the bytes of a K+V layout of the same width.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from radixkv.errors import ConfigError
from radixkv.mem import kv_quant
from radixkv.mem.allocator import PADDING_PAGE


@dataclass(frozen=True, slots=True)
class KVLayout:
    """Shape of the KV cache of one model; sizes in tokens, pages and bytes derive from it.

    `dtype` is the model's compute dtype (what attention reads); `kv_cache_dtype` is how the
    pool stores it (one of `kv_quant.KV_CACHE_DTYPES`; `auto` = `dtype`)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype = torch.float32
    kv_cache_dtype: str = "auto"
    latent: bool = False  # MLA: one latent per token and layer, read as both K and V
    latent_rope_dim: int = 0  # MLA: the latent's trailing RoPE-key columns (not values)

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "page_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"KVLayout.{name} must be >= 1, got {getattr(self, name)}")
        kv_quant.check_kv_cache_dtype(self.kv_cache_dtype)
        if self.kv_cache_dtype == "int4":
            kv_quant.int4_group(self.head_dim)  # raises on an odd head_dim
        if self.latent and self.num_kv_heads != 1:
            raise ConfigError(f"a latent (MLA) KV layout has one KV head, got num_kv_heads={self.num_kv_heads}")
        if not 0 <= self.latent_rope_dim < (self.head_dim if self.latent else 1):
            raise ConfigError(f"KVLayout.latent_rope_dim={self.latent_rope_dim} must be in [0, head_dim) "
                              f"for a latent layout and 0 otherwise")

    @property
    def latent_values(self) -> int:
        """Columns of a latent that are values (MLA's kv_lora_rank)."""
        return self.head_dim - self.latent_rope_dim

    @property
    def tensors_per_token(self) -> int:
        """2 (K and V) for attention heads, 1 for a latent layout."""
        return 1 if self.latent else 2

    @property
    def bytes_per_token(self) -> int:
        """K and V (or the latent) of every layer for one token, scales included (`2 * layers *
        kv_heads * head_dim * bytes` for a plain format; `layers * latent_dim * bytes` for MLA)."""
        per_head = kv_quant.bytes_per_head_token(self.kv_cache_dtype, self.head_dim, self.dtype)
        return self.tensors_per_token * self.num_layers * self.num_kv_heads * per_head

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


@dataclass(frozen=True)
class KernelKV:
    """One layer's raw storage for the Triton kernels (flat slot views)."""

    k: torch.Tensor  # (S, H_kv, D) float / fp8, (S, H_kv, D) int8, or (S, H_kv, D/2) uint8
    v: torch.Tensor
    k_scale: torch.Tensor | None  # int8: (S, H_kv) fp32; int4: (S, H_kv, D/group, 2) fp16 (scale, min); else None
    v_scale: torch.Tensor | None
    kv_format: str  # "dense", "int8" or "int4"
    group: int = 0  # int4 values per scale


class KVPool(ABC):
    """K and V page storage for every layer, allocated once; see the module docstring."""

    def __init__(self, layout: KVLayout, num_pages: int, device: torch.device | str = "cpu"):
        if num_pages < 1:
            raise ConfigError(f"num_pages must be >= 1, got {num_pages}")
        self.layout = layout
        self.num_pages = num_pages
        self.page_size = layout.page_size
        self.device = torch.device(device)
        # Uninitialised: a slot is always written before it is read, except the padding page,
        # which padded positions read and must hold finite values (zeros). Memory is touched
        # only as pages are used, so a large pool costs nothing at start-up.
        self.storage: list[tuple[torch.Tensor, ...]] = [self._allocate() for _ in range(layout.num_layers)]
        for tensors in self.storage:
            for t in tensors:
                t[PADDING_PAGE].zero_()

    def _allocate(self) -> tuple[torch.Tensor, ...]:
        """One layer's storage tensors: K's, then V's (none for a latent layout)."""
        return self._allocate_side() + (() if self.layout.latent else self._allocate_side())

    @abstractmethod
    def _allocate_side(self) -> tuple[torch.Tensor, ...]:
        """The storage of K (or of V) of one layer, each with leading dims (num_pages + 1, page_size)."""

    def _sides(self, layer: int) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """Flat slot views of (K's tensors, V's tensors) of `layer`; the same for a latent layout."""
        flat = tuple(self._flat(t) for t in self.storage[layer])
        n = len(flat) // self.layout.tensors_per_token
        return flat[:n], flat[-n:]

    def store(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None) -> None:
        """Write new tokens' K/V (the one store path): slots (T,) int64, k and v (T, H_kv, D).

        A latent layout stores `k` (the latent) alone; `v` is ignored and may be None."""
        k_side, v_side = self._sides(layer)
        self._store_side(k_side, slots, k)
        if not self.layout.latent:
            self._store_side(v_side, slots, v)

    @abstractmethod
    def _store_side(self, side: tuple[torch.Tensor, ...], slots: torch.Tensor, x: torch.Tensor) -> None:
        """Encode x (T, H_kv, D) into one side's flat tensors at `slots`."""

    @abstractmethod
    def _side_view(self, side: tuple[torch.Tensor, ...]):
        """One side's (S, H_kv, D) read view in `layout.dtype`."""

    def k_view(self, layer: int):
        """(S, H_kv, D) readable with `index_select(0, slots)` / `narrow(0, first, n)`, in `layout.dtype`."""
        return self._side_view(self._sides(layer)[0])

    def v_view(self, layer: int):
        """Like `k_view`, for V (the same latent for a latent layout)."""
        return self._side_view(self._sides(layer)[1])

    @abstractmethod
    def kernel_buffers(self, layer: int) -> KernelKV: ...

    # -- shared by every format ----------------------------------------------------------------
    @property
    def num_slots(self) -> int:
        return (self.num_pages + 1) * self.page_size

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for tensors in self.storage for t in tensors)

    def _flat(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(self.num_slots, *t.shape[2:])  # (S, ...)

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of `slots` (N,) in the model dtype: (N, H_kv, D) each."""
        return self.k_view(layer).index_select(0, slots), self.v_view(layer).index_select(0, slots)

    def copy_page(self, src: int, dst: int) -> None:
        """Copy one page's K/V in every layer (copy-on-write of a shared partial page)."""
        for tensors in self.storage:
            for t in tensors:
                t[dst].copy_(t[src])

    def read_pages(self, pages: torch.Tensor) -> list[torch.Tensor]:
        """Every storage tensor's rows for `pages` (n,) int64: the bytes a host tier keeps."""
        return [t.index_select(0, pages) for tensors in self.storage for t in tensors]

    def write_pages(self, pages: torch.Tensor, data: list[torch.Tensor]) -> None:
        """Inverse of `read_pages`: put saved page contents back at `pages` (n,) int64."""
        flat = [t for tensors in self.storage for t in tensors]
        if len(data) != len(flat):
            raise ValueError(f"{len(data)} tensors given for a pool of {len(flat)} storage tensors")
        for t, d in zip(flat, data):
            t.index_copy_(0, pages, d.to(t.device, non_blocking=True))

    def page_shapes(self) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """Shape (per page) and dtype of every storage tensor, in `read_pages` order."""
        return [(tuple(t.shape[1:]), t.dtype) for tensors in self.storage for t in tensors]


class DenseKVPool(KVPool):
    """K and V in a float format (the model's dtype, fp16, bf16, or fp8 kept as bytes)."""

    def __init__(self, layout: KVLayout, num_pages: int, device: torch.device | str = "cpu"):
        name = layout.kv_cache_dtype
        self.fp8 = kv_quant.FP8_FORMATS.get(name)
        self.storage_dtype = (torch.uint8 if self.fp8 is not None
                              else kv_quant.FLOAT_FORMATS.get(name, layout.dtype))
        super().__init__(layout, num_pages, device)

    def _allocate_side(self):
        L = self.layout
        shape = (self.num_pages + 1, L.page_size, L.num_kv_heads, L.head_dim)
        return (torch.empty(shape, dtype=self.storage_dtype, device=self.device),)

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        return kv_quant.quantize_fp8(x, self.fp8) if self.fp8 is not None else x.to(self.storage_dtype)

    def store(self, layer, slots, k, v):
        if self.device.type == "cuda" and self.fp8 is None and not self.layout.latent:
            from radixkv.kernels import store_kv

            (kb,), (vb,) = self._sides(layer)
            store_kv(kb, vb, slots, k, v)
            return
        super().store(layer, slots, k, v)

    def _store_side(self, side, slots, x):
        side[0].index_copy_(0, slots, self._encode(x))  # (T, H_kv, D) into slots

    def _side_view(self, side):
        flat = side[0]  # (S, H_kv, D)
        if self.fp8 is None and self.storage_dtype == self.layout.dtype:
            return flat  # read in place
        return _CastView(flat, self.fp8, self.layout.dtype)

    def kernel_buffers(self, layer):
        (k,), (v,) = self._sides(layer)
        if self.fp8 is not None:
            k, v = k.view(self.fp8), v.view(self.fp8)
        return KernelKV(k, v, None, None, "dense")


class Int8KVPool(KVPool):
    """Symmetric int8 codes with one float32 scale per token and KV head."""

    def _allocate_side(self):
        L = self.layout
        shape = (self.num_pages + 1, L.page_size, L.num_kv_heads, L.head_dim)
        return (torch.empty(shape, dtype=torch.int8, device=self.device),
                torch.empty(shape[:3], dtype=kv_quant.SCALE_DTYPE, device=self.device))

    def _store_side(self, side, slots, x):
        codes, scale = kv_quant.quantize_int8(x)  # (T, H, D), (T, H)
        side[0].index_copy_(0, slots, codes)
        side[1].index_copy_(0, slots, scale)

    def _side_view(self, side):
        return _Int8View(side[0], side[1], self.layout.dtype)

    def kernel_buffers(self, layer):
        (kc, ks), (vc, vs) = self._sides(layer)
        return KernelKV(kc, vc, ks, vs, "int8")


class Int4KVPool(KVPool):
    """Group-wise asymmetric int4, two values per byte, a float16 (scale, minimum) per group."""

    def __init__(self, layout: KVLayout, num_pages: int, device: torch.device | str = "cpu"):
        self.group = kv_quant.int4_group(layout.head_dim)
        super().__init__(layout, num_pages, device)

    def _allocate_side(self):
        L = self.layout
        lead = (self.num_pages + 1, L.page_size, L.num_kv_heads)
        packed, scales = (*lead, L.head_dim // 2), (*lead, L.head_dim // self.group, 2)
        return (torch.empty(packed, dtype=torch.uint8, device=self.device),
                torch.empty(scales, dtype=kv_quant.INT4_SCALE_DTYPE, device=self.device))

    def _store_side(self, side, slots, x):
        packed, scale = kv_quant.quantize_int4(x, self.group)  # (T, H, D/2), (T, H, D/g, 2)
        side[0].index_copy_(0, slots, packed)
        side[1].index_copy_(0, slots, scale)

    def _side_view(self, side):
        return _Int4View(side[0], side[1], self.group, self.layout.dtype)

    def kernel_buffers(self, layer):
        (kp, ks), (vp, vs) = self._sides(layer)
        return KernelKV(kp, vp, ks, vs, "int4", self.group)


def make_kv_pool(layout: KVLayout, num_pages: int, device: torch.device | str = "cpu") -> KVPool:
    """The pool implementation for `layout.kv_cache_dtype`."""
    if layout.kv_cache_dtype == "int8":
        return Int8KVPool(layout, num_pages, device)
    if layout.kv_cache_dtype == "int4":
        return Int4KVPool(layout, num_pages, device)
    return DenseKVPool(layout, num_pages, device)


# -- dequantising read views (duck-typed as a read-only (S, H_kv, D) tensor) ----------------------
class _SlotView:
    dtype: torch.dtype
    shape: torch.Size

    def _decode(self, idx: torch.Tensor | slice) -> torch.Tensor:
        raise NotImplementedError

    def index_select(self, dim: int, index: torch.Tensor) -> torch.Tensor:
        assert dim == 0, "KV views gather slots (dim 0) only"
        return self._decode(index)

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        assert dim == 0, "KV views narrow slots (dim 0) only"
        return self._decode(slice(start, start + length))

    @property
    def device(self) -> torch.device:
        return self._codes.device


def _take(t: torch.Tensor, idx: torch.Tensor | slice) -> torch.Tensor:
    return t[idx] if isinstance(idx, slice) else t.index_select(0, idx)


class _CastView(_SlotView):
    def __init__(self, codes: torch.Tensor, fp8: torch.dtype | None, dtype: torch.dtype):
        self._codes, self._fp8, self.dtype = codes, fp8, dtype
        self.shape = codes.shape

    def _decode(self, idx):
        x = _take(self._codes, idx)
        return kv_quant.dequantize_fp8(x, self._fp8, self.dtype) if self._fp8 is not None else x.to(self.dtype)


class _Int8View(_SlotView):
    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype):
        self._codes, self._scale, self.dtype = codes, scale, dtype
        self.shape = codes.shape

    def _decode(self, idx):
        return kv_quant.dequantize_int8(_take(self._codes, idx), _take(self._scale, idx), self.dtype)


class _Int4View(_SlotView):
    def __init__(self, packed: torch.Tensor, scale: torch.Tensor, group: int, dtype: torch.dtype):
        self._codes, self._scale, self._group, self.dtype = packed, scale, group, dtype
        self.shape = torch.Size((packed.shape[0], packed.shape[1], packed.shape[2] * 2))

    def _decode(self, idx):
        return kv_quant.dequantize_int4(_take(self._codes, idx), _take(self._scale, idx), self._group, self.dtype)
