"""KV memory: the page allocator, KV pool, request table, and the cache manager over its tiers."""

from radixkv.mem.allocator import PADDING_PAGE, PageAllocator, pages_for_tokens, pages_to_slots
from radixkv.mem.base import InsertResult, MatchResult, PrefixCache
from radixkv.mem.cache_factory import make_cache_manager, make_prefix_cache
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
from radixkv.mem.storage_tier import Prefetch, StorageTier
from radixkv.mem.tier_controller import TierController
from radixkv.mem.tree_node import TreeNode


__all__ = [
    "PADDING_PAGE", "POLICIES", "BeladyPolicy", "DenseKVPool", "EvictionPolicy", "FIFOPolicy", "HostTier",
    "InsertResult", "Int4KVPool", "Int8KVPool",
    "KVLayout", "KVMemory", "KVPool", "LFUPolicy", "LRUPolicy", "MatchResult", "NoCache", "PageAllocator",
    "PrefixCache", "RadixCache", "ReqToTokenTable", "SeqPages", "Prefetch", "StorageTier", "TierController", "TreeNode", "make_policy",
    "make_cache_manager", "make_kv_pool", "make_prefix_cache", "pages_for_tokens", "pages_to_slots",
]
