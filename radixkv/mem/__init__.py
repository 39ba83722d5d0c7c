"""KV memory: the page allocator, KV pool, request table and prefix caches."""

from radixkv.mem.allocator import PADDING_PAGE, PageAllocator, pages_for_tokens, pages_to_slots
from radixkv.mem.base import MatchResult, PrefixCache
from radixkv.mem.eviction import (
    POLICIES,
    BeladyPolicy,
    EvictionPolicy,
    FIFOPolicy,
    LFUPolicy,
    LRUPolicy,
    make_policy,
)
from radixkv.mem.kv_memory import KVMemory
from radixkv.mem.kv_pool import DenseKVPool, Int4KVPool, Int8KVPool, KVLayout, KVPool, make_kv_pool
from radixkv.mem.no_cache import NoCache
from radixkv.mem.radix_cache import RadixCache, TreeNode
from radixkv.mem.req_table import ReqToTokenTable
from radixkv.mem.seq_pages import SeqPages

__all__ = [
    "PADDING_PAGE", "POLICIES", "BeladyPolicy", "EvictionPolicy", "FIFOPolicy", "KVLayout", "KVMemory",
    "KVPool", "LFUPolicy", "LRUPolicy", "MatchResult", "NoCache", "PageAllocator", "PrefixCache",
    "RadixCache", "ReqToTokenTable", "SeqPages", "TreeNode", "make_policy", "pages_for_tokens",
    "pages_to_slots",
]
