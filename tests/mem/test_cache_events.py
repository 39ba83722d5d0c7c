"""KV cache events recorded by the radix cache and its host tier (`radixkv.mem.cache_events`):
the hash chain, what each change records, and that replaying the events rebuilds the tree."""

import random

import pytest

from radixkv.mem import PageAllocator, RadixCache, SeqPages
from radixkv.mem.cache_events import (
    CPU,
    GPU,
    AllPagesCleared,
    CacheEventLog,
    PageLedger,
    PagesRemoved,
    PagesStored,
    tree_events,
)
from radixkv.mem import block_hash
from radixkv.mem.block_hash import block_id, block_ids
from radixkv.mem.host_tier import HostTier, HostTierConfig
from tests.mem.conftest import cache_tokens


def recording(cache):
    cache.events = CacheEventLog(cache.page_size)
    return cache


def tiered(device_pages=8, host_pages=8, page_size=2, write_policy="write-back"):
    host = HostTier(HostTierConfig(host_pages, page_size, write_policy))
    return recording(RadixCache(PageAllocator(device_pages, page_size), "lru", host_tier=host))


def serve(cache, key, namespace=None):
    """What the scheduler does with a request: reuse the cached prefix (loading the host part
    back), make room for the rest by evicting, compute it, cache it all."""
    match = cache.match_prefix(key, namespace)
    match = cache.load_back(match) if match.host_tokens else match
    cache.lock(match.last_node)
    seq = SeqPages.from_prefix(cache.allocator, match.pages, match.num_tokens)
    need = seq.pages_needed(len(key) - match.num_tokens) - cache.allocator.free_pages
    if need > 0:
        cache.evict(need * cache.page_size)
    seq.extend(len(key) - match.num_tokens)
    cache.cache_finished(list(key), seq, match.last_node, namespace)


def rebuilt(events, page_size):
    return PageLedger(page_size).apply_all(events).held()


def assert_events_rebuild_the_tree(ledger, cache):
    """What a subscriber rebuilt from every event so far is what the cache holds now."""
    ledger.apply_all(cache.events.take())
    assert ledger.held() == rebuilt(tree_events(cache), cache.page_size)


# -- the hash chain -------------------------------------------------------------------------------
def test_a_page_id_is_its_block_hash_chained_on_its_parent_and_its_own_tokens():
    first, second = block_ids(None, [1, 2, 3, 4], 2)
    assert block_ids(None, [1, 2], 2) == [first]
    (h1,) = block_hash.chain(block_hash.root(None), [1, 2], 2)
    assert block_id(block_hash.block(h1, [3, 4])) == second  # the hash chains on, the id is its head
    assert block_ids(None, [1, 2, 3, 5], 2)[0] == first and block_ids(None, [1, 2, 3, 5], 2)[1] != second
    assert block_ids(None, [9, 2, 3, 4], 2)[1] != second  # a hash names its whole prefix
    assert all(0 <= h < 2**63 for h in (first, second))  # reads the same as int64 and uint64


def test_equal_tokens_in_different_namespaces_never_share_a_hash():
    roots = {block_hash.root(ns) for ns in (None, "lora-a", "lora-b", 7, "7", ("salt", 1))}
    assert len(roots) == 6
    cache = recording(RadixCache(PageAllocator(16, 2)))
    for ns in (None, "tenant-a"):
        cache_tokens(cache, [1, 2, 3, 4], ns)
    plain, salted = cache.events.take()
    assert plain.parent is None and salted.parent is None  # both start a chain at the root
    assert plain.token_ids == salted.token_ids and set(plain.hashes).isdisjoint(salted.hashes)
    assert salted.hashes == block_ids("tenant-a", [1, 2, 3, 4], 2)


def test_hashes_survive_splits_and_are_the_same_on_every_cache():
    one, two = recording(RadixCache(PageAllocator(32, 2))), recording(RadixCache(PageAllocator(32, 2)))
    cache_tokens(one, [1, 2, 3, 4, 5, 6])
    cache_tokens(one, [1, 2, 3, 4, 7, 8])  # splits the first edge after two pages
    cache_tokens(two, [1, 2, 3, 4, 7, 8])
    ledger = PageLedger(2).apply_all(one.events.take())
    assert rebuilt(two.events.take(), 2).items() <= ledger.held().items()
    assert ledger.held() == rebuilt(tree_events(one), 2)


# -- what each change records ---------------------------------------------------------------------
def test_an_insert_stores_only_its_new_pages_chained_to_the_cached_prefix():
    cache = recording(RadixCache(PageAllocator(16, 2)))
    cache_tokens(cache, [1, 2, 3, 4])
    (first,) = cache.events.take()
    assert first == PagesStored(block_ids(None, [1, 2, 3, 4], 2), None, [1, 2, 3, 4], GPU)
    cache_tokens(cache, [1, 2, 3, 4, 5, 6, 7])  # the odd last token is not a whole page: not cached
    (more,) = cache.events.take()
    assert more == PagesStored(block_ids(None, [1, 2, 3, 4, 5, 6], 2)[2:], first.hashes[-1], [5, 6], GPU)
    cache_tokens(cache, [1, 2, 3, 4])
    assert cache.events.take() == []  # nothing new: no event


def test_eviction_removes_the_tail_pages_it_frees():
    cache = recording(RadixCache(PageAllocator(16, 2)))
    cache_tokens(cache, [1, 2, 3, 4, 5, 6])
    (stored,) = cache.events.take()
    cache.evict(2)  # one page, from the tail
    assert cache.events.take() == [PagesRemoved(stored.hashes[2:], GPU)]
    cache.evict(100)
    assert cache.events.take() == [PagesRemoved(stored.hashes[:2], GPU)]


def test_a_reset_is_one_clear_that_supersedes_what_came_before():
    cache = recording(RadixCache(PageAllocator(16, 2)))
    cache_tokens(cache, [1, 2, 3, 4])
    cache.reset()
    assert cache.events.take() == [AllPagesCleared()]
    cache_tokens(cache, [1, 2])
    assert [type(e) for e in cache.events.take()] == [PagesStored]


def test_a_cache_without_a_log_records_nothing_and_keeps_no_hashes():
    cache = RadixCache(PageAllocator(16, 2))
    cache_tokens(cache, [1, 2, 3, 4])
    cache_tokens(cache, [1, 2, 5, 6])
    cache.evict(100)
    assert all(node.block_hashes is None for node in cache.nodes())


def test_device_eviction_moves_pages_to_the_cpu_medium_store_first():
    cache = tiered()
    serve(cache, [1, 2, 3, 4])
    (stored,) = cache.events.take()
    cache.evict(4)
    assert cache.events.take() == [PagesStored(stored.hashes, None, [1, 2, 3, 4], CPU),
                                   PagesRemoved(stored.hashes, GPU)]


def test_a_load_back_stores_on_the_device_and_keeps_the_host_copy():
    cache = tiered()
    serve(cache, [1, 2, 3, 4])
    (stored,) = cache.events.take()
    cache.evict(4)
    cache.events.take()
    match = cache.load_back(cache.match_prefix([1, 2, 3, 4]))
    assert match.num_tokens == 4
    assert cache.events.take() == [PagesStored(stored.hashes, None, [1, 2, 3, 4], GPU)]
    held = rebuilt(tree_events(cache), 2)
    assert {h: held[h][2] for h in stored.hashes} == dict.fromkeys(stored.hashes, frozenset({GPU, CPU}))


def test_a_full_host_tier_drops_its_least_recent_pages():
    cache = tiered(device_pages=2, host_pages=2)
    ledger = PageLedger(2)
    serve(cache, [1, 2, 3, 4])  # two pages: fills the device
    serve(cache, [5, 6, 7, 8])  # moves [1..4] to the host
    old = [h for e in cache.events.take() if isinstance(e, PagesStored) for h in e.hashes][:2]
    serve(cache, [9, 10, 11, 12])  # [5..8] to the host, which lets [1..4] go
    events = cache.events.take()
    assert PagesRemoved(old, CPU) in events
    ledger.apply_all(tree_events(cache))
    assert not set(old) & set(ledger.held())


def test_write_through_stores_on_both_mediums_at_insert():
    cache = tiered(write_policy="write-through")
    serve(cache, [1, 2, 3, 4])
    gpu, cpu = cache.events.take()
    assert (gpu.medium, cpu.medium) == (GPU, CPU) and gpu.hashes == cpu.hashes
    cache.evict(4)
    assert cache.events.take() == [PagesRemoved(gpu.hashes, GPU)]  # the host copy was there already


@pytest.mark.parametrize("write_policy", ["write-back", "write-through"])
@pytest.mark.parametrize("page_size", [1, 2])
def test_events_rebuild_the_tree_through_a_random_workload(page_size, write_policy):
    rng = random.Random(page_size)
    cache = tiered(device_pages=12, host_pages=6, page_size=page_size, write_policy=write_policy)
    ledger = PageLedger(page_size)
    for _ in range(150):
        key = [rng.randint(0, 3) for _ in range(rng.randint(1, 6) * page_size)]
        namespace = rng.choice([None, None, "other"])
        serve(cache, key, namespace)
        assert_events_rebuild_the_tree(ledger, cache)
        cache.check_invariants()
    assert {m for _, _, ms in ledger.held().values() for m in ms} == {GPU, CPU}
    cache.reset()
    assert_events_rebuild_the_tree(ledger, cache)
    assert ledger.held() == {}


def test_the_ledger_announces_parents_before_children():
    cache = tiered(device_pages=6, host_pages=6)
    ledger = PageLedger(2)
    for key in ([1, 2, 3, 4], [1, 2, 5, 6, 7, 8], [9, 9], [1, 2, 3, 4, 3, 3]):
        serve(cache, key)
    cache.evict(6)
    ledger.apply_all(cache.events.take())
    events = ledger.events()
    assert isinstance(events[0], AllPagesCleared)
    seen: set[int] = set()
    for event in events[1:]:
        assert event.parent is None or event.parent in seen
        seen.update(event.hashes)
    assert rebuilt(events, 2) == ledger.held() == rebuilt(tree_events(cache), 2)
