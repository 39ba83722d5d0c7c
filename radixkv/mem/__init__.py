"""KV memory: the page allocator, KV pool, request table and prefix caches."""

import time
from collections.abc import Callable

from radixkv.mem.allocator import PADDING_PAGE, PageAllocator, pages_for_tokens, pages_to_slots
from radixkv.mem.base import InsertResult, MatchResult, PrefixCache
from radixkv.mem.eviction import (
    POLICIES,
    BeladyPolicy,
    EvictionPolicy,
    FIFOPolicy,
    LFUPolicy,
    LRUPolicy,
    make_policy,
)
from radixkv.mem.host_tier import HostTier
from radixkv.mem.kv_memory import KVMemory
from radixkv.mem.kv_pool import DenseKVPool, Int4KVPool, Int8KVPool, KVLayout, KVPool, make_kv_pool
from radixkv.mem.no_cache import NoCache
from radixkv.mem.radix_cache import RadixCache
from radixkv.mem.req_table import ReqToTokenTable
from radixkv.mem.seq_pages import SeqPages
from radixkv.mem.storage_cache import StorageTieredCache
from radixkv.mem.storage_tier import StorageTier
from radixkv.mem.tiered_cache import HostTieredCache
from radixkv.mem.tree_node import TieredNode, TreeNode


def make_prefix_cache(allocator: PageAllocator, eviction_policy: str | EvictionPolicy = "lru",
                      attention_scale: float | None = None, host_tier: HostTier | None = None,
                      disabled: bool = False, clock: Callable[[], float] = time.monotonic,
                      storage: StorageTier | None = None, identity: bytes = b"") -> PrefixCache:
    """The prefix cache a configuration asks for: none (`disabled`), the radix tree, the tree
    over a host tier, or over a host tier and `storage` (its keys seeded with `identity`);
    `clock` (seconds) is what retention deadlines are read against (a trace replay passes the
    trace's time)."""
    if disabled:
        return NoCache(allocator)
    if storage is not None:
        if host_tier is None:
            raise ValueError("a storage tier needs a host tier above it")
        return StorageTieredCache(allocator, eviction_policy, attention_scale, host_tier, storage, identity, clock)
    if host_tier is not None:
        return HostTieredCache(allocator, eviction_policy, attention_scale, host_tier, clock)
    return RadixCache(allocator, eviction_policy, attention_scale, clock)


__all__ = [
    "PADDING_PAGE", "POLICIES", "BeladyPolicy", "DenseKVPool", "EvictionPolicy", "FIFOPolicy", "HostTieredCache",
    "InsertResult", "Int4KVPool", "Int8KVPool",
    "KVLayout", "KVMemory", "KVPool", "LFUPolicy", "LRUPolicy", "MatchResult", "NoCache", "PageAllocator",
    "PrefixCache", "RadixCache", "ReqToTokenTable", "SeqPages", "StorageTier", "StorageTieredCache", "TieredNode", "TreeNode", "make_policy",
    "make_kv_pool", "make_prefix_cache", "pages_for_tokens", "pages_to_slots",
]
