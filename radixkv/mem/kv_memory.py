"""KVMemory: the one owner of a model's KV memory (pool, page allocator, request table).

The model runner reads and writes K/V through it (the pool's pages, addressed through the
request table); the scheduler manages it (allocates pages, assembles sequences, writes request
table rows). Both receive the same `KVMemory`; nobody reaches through one to get at the other.
"""

from __future__ import annotations

import torch

from radixkv.errors import ConfigError
from radixkv.mem.allocator import PageAllocator
from radixkv.mem.host_tier import HostKVTier, HostTierConfig, host_tier_pages
from radixkv.mem.kv_pool import KVLayout, make_kv_pool
from radixkv.mem.req_table import ReqToTokenTable
from radixkv.mem.seq_pages import SeqPages


def available_memory(device: torch.device) -> int:
    """Free bytes on `device` (GPU memory for CUDA, host memory otherwise)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    import psutil

    return int(psutil.virtual_memory().available)


class KVMemory:
    """Per-layer KV pages (`pool`), their reference counts (`allocator`), and the request table
    mapping each running request's positions to KV slots (`req_table`)."""

    def __init__(self, layout: KVLayout, num_pages: int, max_reqs: int, max_context_len: int,
                 device: torch.device | str = "cpu", host_kv_size: str | int | None = None,
                 host_write_policy: str = "write-back"):
        self.layout = layout
        self.device = torch.device(device)
        self.pool = make_kv_pool(layout, num_pages, self.device)
        self.allocator = PageAllocator(num_pages, layout.page_size)
        self.req_table = ReqToTokenTable(max_reqs, max_context_len, self.device)
        self.host: HostKVTier | None = None  # the host tier for evicted prefixes, when configured
        if host_kv_size is not None:
            pages = host_tier_pages(host_kv_size, layout.page_size, layout.bytes_per_page)
            self.host = HostKVTier(HostTierConfig(pages, layout.page_size, host_write_policy), self.pool)
        self.journal = None  # see `attach_journal`

    def attach_journal(self, journal) -> None:
        """Record every change made to this memory outside a forward (request-table writes, page
        copies, host-tier copies) in `journal`, a `radixkv.tp.journal.KVJournal`: the
        other tensor-parallel ranks replay them on their own memory."""
        self.journal = journal
        self.req_table.journal = journal
        if self.host is not None:
            self.host.journal = journal

    def copy_page(self, src: int, dst: int) -> None:
        """Copy page `src`'s KV (every layer) into page `dst`."""
        self.pool.copy_page(src, dst)
        if self.journal is not None:
            self.journal.page_copy(src, dst)

    @classmethod
    def sized(cls, layout: KVLayout, *, max_reqs: int, context_length: int, device: torch.device,
              max_total_tokens: int | None = None, mem_fraction: float = 0.3,
              host_kv_size: str | int | None = None, host_write_policy: str = "write-back",
              shards: int = 1) -> KVMemory:
        """Pages for `max_total_tokens`, or for `mem_fraction` of the device's free memory, but
        never more than every request at full context could use.

        `shards`: tensor-parallel ranks, each holding this `layout` (its share of the KV heads)
        for the same tokens. Byte budgets the ranks share -- host memory for the host tier, and
        the device's memory when the device is the CPU -- are split among them; token counts
        are the same on every rank.
        """
        if max_total_tokens is not None:
            num_pages = layout.num_pages_for(max_tokens=max_total_tokens)
        else:
            shared = shards if device.type == "cpu" else 1
            budget = int(mem_fraction * available_memory(device) / shared)
            num_pages = layout.num_pages_for(max_bytes=budget)
            num_pages = min(num_pages, -(-max_reqs * context_length // layout.page_size))
        if num_pages < 1:
            raise ConfigError(f"the KV pool would hold no page (max_total_tokens={max_total_tokens})")
        if host_kv_size is not None and shards > 1:  # as tokens: the same on every rank
            host_kv_size = layout.page_size * host_tier_pages(host_kv_size, layout.page_size,
                                                              layout.bytes_per_page * shards)
        return cls(layout, num_pages, max_reqs, context_length, device, host_kv_size, host_write_policy)

    @property
    def page_size(self) -> int:
        return self.layout.page_size

    @property
    def total_tokens(self) -> int:
        return self.allocator.total_tokens

    def new_sequence(self) -> SeqPages:
        """An empty sequence that allocates from this memory (copy-on-write through the pool)."""
        return SeqPages(self.allocator, self.copy_page)

    def sequence_from_prefix(self, pages: list[int], num_tokens: int) -> SeqPages:
        """A sequence reading `pages` (a cached prefix of `num_tokens`), one more reference each."""
        return SeqPages.from_prefix(self.allocator, pages, num_tokens, self.copy_page)
