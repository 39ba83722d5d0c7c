"""Regression (found in review): RadixCache.load_back allocates device pages, then copies host -> device. If the copy raises
(e.g. CUDA OOM allocating the staging tensors in HostKVTier.load / KVPool.write_pages), the
freshly allocated pages are never given to a node nor freed: they leak from the KV pool forever
(the page balance `free + tree + in-flight == total` breaks)."""

import pytest

from radixkv.mem import PageAllocator, RadixCache
from radixkv.mem.host_tier import HostTier, HostTierConfig


class FlakyTier(HostTier):
    fail = False

    def load(self, host_pages, device_pages):
        if self.fail:
            raise RuntimeError("CUDA out of memory (simulated)")
        super().load(host_pages, device_pages)


def test_failed_load_back_returns_its_device_pages():
    host = FlakyTier(HostTierConfig(num_pages=8, page_size=1))
    cache = RadixCache(PageAllocator(8, 1), "lru", host_tier=host)
    key = [1, 2, 3, 4]
    pages = cache.allocator.alloc(4)
    cache.insert(key, pages)
    cache.allocator.decref(pages)  # the request that computed them is gone
    cache.evict(4)  # the whole prefix moves to the host tier
    match = cache.match_prefix(key)
    assert (match.num_tokens, match.host_tokens) == (0, 4)
    host.fail = True
    with pytest.raises(RuntimeError):
        cache.load_back(match, key)
    cache.check_invariants(inflight_pages=0)  # failed before the fix: 4 pages allocated, owned by nobody
    assert cache.allocator.free_pages == 8


def test_host_eviction_frees_what_a_save_needs_not_just_the_shortfall():
    """Regression (found building the storage tier): `_evict_host` takes the number of host pages
    to have free, and its callers passed the shortfall. With 1 page free and 4 needed it freed
    up to 3 and gave up, so the evicted prefix was dropped instead of moved to the host tier."""
    host = HostTier(HostTierConfig(num_pages=5, page_size=1))
    cache = RadixCache(PageAllocator(4, 1), "lru", host_tier=host)
    for token in (1, 2, 3, 4):  # four one-page prefixes, moved to the host: 1 host page stays free
        pages = cache.allocator.alloc(1)
        cache.insert([token], pages)
        cache.allocator.decref(pages)
        cache.evict(1)
    assert host.allocator.free_pages == 1
    pages = cache.allocator.alloc(4)
    cache.insert([5, 6, 7, 8], pages)
    cache.allocator.decref(pages)
    cache.evict(4)  # needs 4 host pages: three old prefixes must go
    assert cache.peek([5, 6, 7, 8]).host_tokens == 4  # failed before the fix: 0 (dropped)
    cache.check_invariants(inflight_pages=0)
