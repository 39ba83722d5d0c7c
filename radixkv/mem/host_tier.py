"""The host tier: KV pages of evicted prefixes kept one tier down, instead of recomputed.

The radix cache decides *what* moves (see `RadixCache`, "Host tier"); a `HostTier` owns *where*
it goes: a `PageAllocator` of host pages and the copies between the device pool and host
memory. `HostTier` itself moves no bytes (the trace simulator uses it to count them);
`HostKVTier` keeps real copies of every storage tensor of a `KVPool` (codes and scales alike, so
a quantised pool is kept quantised), in pinned memory when the device is CUDA.

The host tier's memory is written once, in a background thread, as soon as it is allocated: a
page's first write otherwise pays the kernel's page fault, which made the first load of a
restart's prefix from storage cost 5x its copy. Copies wait for that thread (it runs while the
model warms up).

A save is synchronous (the device pages it reads may be reused right after); a load is queued
on the device's current stream, so the forward that reads the pages runs after it while the CPU
goes on scheduling (on CPU both are plain memcpys).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radixkv.errors import ConfigError
from radixkv.kv_bytes import host_tier_pages, parse_host_size  # noqa: F401  (the flag's parser)
from radixkv.mem.allocator import PageAllocator
from radixkv.mem.kv_pool import KVPool

WRITE_POLICIES = ("write-back", "write-through")


@dataclass(frozen=True, slots=True)
class HostTierConfig:
    """`num_pages` host pages of `page_size` tokens; `write_policy`: copy to the host when a
    prefix is evicted from the device (`write-back`) or as soon as it is cached (`write-through`)."""

    num_pages: int
    page_size: int
    write_policy: str = "write-back"

    def __post_init__(self) -> None:
        if self.num_pages < 1:
            raise ConfigError(f"host tier: num_pages must be >= 1, got {self.num_pages}")
        if self.write_policy not in WRITE_POLICIES:
            raise ConfigError(f"host_write_policy={self.write_policy!r}: must be one of {list(WRITE_POLICIES)}")

    @property
    def write_through(self) -> bool:
        return self.write_policy == "write-through"


class HostTier:
    """Host pages and their bookkeeping, without data (what the trace simulator needs)."""

    def __init__(self, config: HostTierConfig):
        self.config = config
        self.page_size = config.page_size
        self.allocator = PageAllocator(config.num_pages, config.page_size)
        self.saved_tokens = 0  # device -> host
        self.loaded_tokens = 0  # host -> device

    @property
    def write_through(self) -> bool:
        return self.config.write_through

    def save(self, device_pages: Sequence[int], host_pages: Sequence[int]) -> None:
        """Copy the KV of `device_pages` into `host_pages` (already allocated)."""
        self.saved_tokens += len(device_pages) * self.page_size

    def load(self, host_pages: Sequence[int], device_pages: Sequence[int]) -> None:
        """Copy the KV of `host_pages` into `device_pages` (already allocated)."""
        self.loaded_tokens += len(host_pages) * self.page_size

    def rows(self, host_pages: Sequence[int]) -> list[torch.Tensor] | None:
        """The bytes of `host_pages`: one CPU tensor `[n, *shape]` per storage tensor of the
        pool (copies); None where the tier keeps no bytes."""
        return None

    def device_rows(self, device_pages: Sequence[int]) -> list[torch.Tensor] | None:
        """As `rows`, read from the device pool's `device_pages`."""
        return None

    def join_blocks(self, parts: Sequence[list[torch.Tensor] | None], per_block: int) -> list[torch.Tensor] | None:
        """`parts` (`rows` or `device_rows` of consecutive pages, in order) as stored pages of
        `per_block` device pages each: one tensor `[n, per_block, *shape]` per storage tensor."""
        return None

    def put_blocks(self, host_pages: Sequence[int], blocks: Sequence[list[torch.Tensor]], skip: int) -> None:
        """Put the device pages of `blocks` (stored pages as a storage read returns them: each
        its rows `[per_block, *shape]` of every storage tensor), from the `skip`-th on, into
        `host_pages` (already allocated): one copy per storage tensor."""


class HostKVTier(HostTier):
    """Host copies of a device `KVPool`'s pages: every storage tensor, page for page."""

    def __init__(self, config: HostTierConfig, pool: KVPool):
        if config.page_size != pool.page_size:
            raise ConfigError(f"host tier page_size {config.page_size} != the device pool's {pool.page_size}")
        super().__init__(config)
        self.pool = pool
        self.journal = None  # a KVJournal that records every copy (tensor-parallel rank 0)
        pin = pool.device.type == "cuda"
        # one extra page (index 0) mirrors the allocator's reserved padding page
        self.storage = [torch.empty((config.num_pages + 1, *shape), dtype=dtype, pin_memory=pin)
                        for shape, dtype in pool.page_shapes()]
        self._touched = threading.Event()  # set once every page was written (mapped by the kernel)
        if pin:  # pinned memory is mapped when allocated
            self._touched.set()
        else:
            threading.Thread(target=self._touch, name="host-tier-touch", daemon=True).start()

    def _touch(self) -> None:
        try:
            for t in self.storage:
                t.zero_()
        finally:
            self._touched.set()

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.storage)

    def save(self, device_pages, host_pages) -> None:
        self._touched.wait()
        super().save(device_pages, host_pages)
        src = torch.tensor(list(device_pages), dtype=torch.int64, device=self.pool.device)
        dst = torch.tensor(list(host_pages), dtype=torch.int64)
        for host, data in zip(self.storage, self.pool.read_pages(src)):
            host.index_copy_(0, dst, data.to("cpu"))  # synchronous: the pages may be reused next
        if self.journal is not None:
            self.journal.host_save(device_pages, host_pages)

    def rows(self, host_pages):
        self._touched.wait()
        src = torch.tensor(list(host_pages), dtype=torch.int64)
        return [host.index_select(0, src) for host in self.storage]

    def device_rows(self, device_pages):
        src = torch.tensor(list(device_pages), dtype=torch.int64, device=self.pool.device)
        return [data.to("cpu") for data in self.pool.read_pages(src)]

    def join_blocks(self, parts, per_block):
        joined = [torch.cat(rows) if len(rows) > 1 else rows[0] for rows in zip(*parts)]
        return [t.view(t.shape[0] // per_block, per_block, *t.shape[1:]) for t in joined]

    def put_blocks(self, host_pages, blocks, skip) -> None:
        self._touched.wait()
        dst = torch.tensor(list(host_pages), dtype=torch.int64)
        at = 0  # host pages filled so far
        for block in blocks:  # straight from each block's rows: no gathered copy in between
            rows = block[0].shape[0]
            take = min(rows - skip, len(host_pages) - at)
            part = dst[at:at + take]
            for host, data in zip(self.storage, block):
                host.index_copy_(0, part, data[skip:skip + take].to(host.dtype))
            at, skip = at + take, 0

    def load(self, host_pages, device_pages) -> None:
        self._touched.wait()
        super().load(host_pages, device_pages)
        src = torch.tensor(list(host_pages), dtype=torch.int64)
        dst = torch.tensor(list(device_pages), dtype=torch.int64, device=self.pool.device)
        self.pool.write_pages(dst, [host.index_select(0, src) for host in self.storage])
        if self.journal is not None:
            self.journal.host_load(host_pages, device_pages)
