"""The one place the cache manager and its tiers are assembled.

`make_cache_manager` reads a server's configuration: no cache (`--disable-radix-cache`), the
radix tree, over the KV memory's host tier (`--host-kv-size`), over a storage tier on disk
(`--kv-storage-dir`, its files named by the model's storage identity) or in a Mooncake Store
shared by replicas (`--kv-storage-backend mooncake`). `make_prefix_cache`
composes given tiers (what simulators and tests build by hand).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from radixkv.config.store_backend import parse_mooncake
from radixkv.kv_bytes import host_tier_pages
from radixkv.mem.allocator import PageAllocator
from radixkv.mem.base import PrefixCache
from radixkv.mem.disk_storage import DiskKVStorage
from radixkv.mem.eviction import EvictionPolicy
from radixkv.mem.host_tier import HostTier
from radixkv.mem.kv_memory import KVMemory
from radixkv.mem.kv_pool import KVPool
from radixkv.mem.no_cache import NoCache
from radixkv.mem.storage_identity import model_fingerprint, storage_identity
from radixkv.mem.radix_cache import RadixCache
from radixkv.mem.storage_tier import StorageTier, StorageTierConfig, block_tokens

if TYPE_CHECKING:
    from radixkv.config import EngineConfig


def make_prefix_cache(allocator: PageAllocator, eviction_policy: str | EvictionPolicy = "lru",
                      attention_scale: float | None = None, host_tier: HostTier | None = None,
                      disabled: bool = False, clock: Callable[[], float] = time.monotonic,
                      storage: StorageTier | None = None) -> PrefixCache:
    """The prefix cache a configuration asks for: none (`disabled`), the radix tree, the tree
    over a host tier, or over a host tier and `storage`;
    `clock` (seconds) is what retention deadlines are read against (a trace replay passes the
    trace's time)."""
    if disabled:
        return NoCache(allocator)
    return RadixCache(allocator, eviction_policy, attention_scale, clock, host_tier=host_tier, storage=storage)


def make_cache_manager(config: EngineConfig, memory: KVMemory, attention_scale: float | None,
                       model_dir: Path) -> PrefixCache:
    """The cache `config` asks for over `memory` (its allocator and host tier), for the model
    in `model_dir` (what the storage tier's identity is read from)."""
    storage = None
    if config.storage.enabled and memory.host is not None and not config.cache.disable_radix_cache:
        storage = open_storage(config, model_dir, memory)
    return make_prefix_cache(memory.allocator, config.cache.eviction_policy, attention_scale, host_tier=memory.host,
                             disabled=config.cache.disable_radix_cache, storage=storage)


def block_shapes(pool: KVPool, per_block: int) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """(shape, dtype) of each storage tensor's rows in one stored page: `per_block` device pages."""
    return [((per_block, *shape), dtype) for shape, dtype in pool.page_shapes()]


def open_storage(config: EngineConfig, model_dir: Path, memory: KVMemory) -> StorageTier:
    """The storage tier `--kv-storage-dir` or `--kv-storage-backend` asks for, over `memory`'s pool."""
    pool = memory.pool
    block = block_tokens(config.storage.kv_storage_block_size, config.cache.page_size)
    per_block = block // config.cache.page_size
    shapes = block_shapes(pool, per_block)
    identity = storage_identity(model_fingerprint(model_dir), config.cache.kv_cache_dtype, block, shapes)
    row_bytes = per_block * sum(t.numel() // t.shape[0] * t.element_size() for tensors in pool.storage for t in tensors)
    pages = host_tier_pages(config.storage.kv_storage_size, block, row_bytes, "kv_storage_size")
    tier_config = StorageTierConfig(pages, block, config.storage.write_policy,
                                    config.storage.kv_storage_hit_threshold, config.storage.kv_storage_prefetch_policy,
                                    config.storage.kv_storage_prefetch_timeout,
                                    config.storage.kv_storage_persist_timeout)
    if config.storage.kv_storage_backend == "mooncake":
        from radixkv.mem.mooncake_storage import MooncakeKVStorage  # (imports mooncake: only when asked for)
        return MooncakeKVStorage(tier_config, parse_mooncake(config.storage.kv_storage_config), identity, shapes)
    return DiskKVStorage(tier_config, config.storage.kv_storage_dir, identity, shapes)
