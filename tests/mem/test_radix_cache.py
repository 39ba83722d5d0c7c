import pytest

from radixkv.errors import CacheInvariantError
from radixkv.mem import NoCache, PageAllocator, SeqPages
from tests.mem.conftest import cache_tokens


def test_empty_cache_matches_nothing(make_cache):
    cache = make_cache()
    m = cache.match_prefix([1, 2, 3])
    assert (m.num_tokens, m.pages, m.last_node) == (0, [], cache.root)


def test_exact_and_partial_matches_return_the_cached_pages(make_cache):
    cache = make_cache()
    cache_tokens(cache, [1, 2, 3, 4])
    full = cache.match_prefix([1, 2, 3, 4, 5])
    assert full.num_tokens == 4 and len(full.pages) == 4
    part = cache.match_prefix([1, 2, 9])
    assert part.num_tokens == 2 and part.pages == full.pages[:2]
    assert cache.match_prefix([7]).num_tokens == 0
    cache.check_invariants(inflight_pages=0)


def test_match_ending_inside_an_edge_splits_it_and_keeps_sizes(make_cache):
    cache = make_cache()
    cache_tokens(cache, [1, 2, 3, 4, 5])
    (edge,) = cache.root.children.values()
    m = cache.match_prefix([1, 2, 3, 9])
    assert m.num_tokens == 3
    assert len(m.last_node.key) == 3 and m.last_node.parent is cache.root
    (tail,) = m.last_node.children.values()
    assert tail.key == (4, 5) and tail.depth == 3
    assert cache.total_tokens == 5 and cache.evictable_tokens == 5
    assert edge is tail  # the old node keeps the tail (and its identity)
    cache.check_invariants(inflight_pages=0)


def test_insert_reports_the_cached_length_and_duplicates_are_freed(make_cache):
    cache = make_cache(num_pages=16)
    cache_tokens(cache, [1, 2, 3])
    seq = SeqPages(cache.allocator)
    seq.extend(5)  # a request that computed [1..5] itself, without the cache
    assert cache.insert([1, 2, 3, 4, 5], seq.pages) == 3
    seq.release()  # its copies of [1, 2, 3] are freed, [4, 5] now belong to the tree
    assert cache.total_tokens == 5
    assert cache.allocator.free_pages == 16 - 5
    cache.check_invariants(inflight_pages=0)


def test_insert_needs_enough_pages(make_cache):
    cache = make_cache()
    with pytest.raises(ValueError, match="cannot hold"):
        cache.insert([1, 2, 3], [1, 2])


def test_lock_moves_tokens_from_evictable_to_protected_up_to_the_root(make_cache):
    cache = make_cache()
    cache_tokens(cache, [1, 2, 3, 4])
    cache_tokens(cache, [1, 2, 7, 8])
    m = cache.match_prefix([1, 2, 3, 4])
    cache.lock(m.last_node)
    assert (cache.evictable_tokens, cache.protected_tokens) == (2, 4)
    cache.lock(m.last_node)
    cache.unlock(m.last_node)
    assert (cache.evictable_tokens, cache.protected_tokens) == (2, 4)
    cache.check_invariants(inflight_pages=0)
    cache.unlock(m.last_node)
    assert (cache.evictable_tokens, cache.protected_tokens) == (6, 0)
    with pytest.raises(CacheInvariantError, match="not locked"):
        cache.unlock(m.last_node)


def test_locked_paths_are_never_evicted(make_cache):
    cache = make_cache()
    cache_tokens(cache, [1, 2, 3])
    cache_tokens(cache, [5, 6])
    m = cache.match_prefix([1, 2, 3])
    cache.lock(m.last_node)
    assert cache.evict(100) == 2
    assert cache.match_prefix([1, 2, 3]).num_tokens == 3
    assert cache.match_prefix([5, 6]).num_tokens == 0
    cache.unlock(m.last_node)
    assert cache.evict(100) == 3
    assert cache.allocator.free_pages == cache.allocator.num_pages
    cache.check_invariants(inflight_pages=0)


def test_evicting_a_leaf_makes_its_parent_a_candidate(make_cache):
    cache = make_cache()
    cache_tokens(cache, [1, 2, 3, 4])
    cache_tokens(cache, [1, 2, 5])
    assert cache.num_candidates == 2
    assert cache.evict(3) == 3  # both leaves ([3, 4] then [5]) go first
    assert cache.num_candidates == 1 and cache.total_tokens == 2
    assert cache.evict(1) == 1  # then the trunk's tail
    assert cache.total_tokens == 1
    assert cache.evict(5) == 1
    assert cache.total_tokens == 0
    cache.check_invariants(inflight_pages=0)


@pytest.mark.parametrize("page_size", [1, 2, 4, 16])
def test_matches_and_edges_are_page_aligned(make_cache, page_size):
    cache = make_cache(num_pages=64, page_size=page_size)
    p = page_size
    trunk = list(range(100, 100 + 2 * p))
    a = trunk + list(range(200, 200 + p + 1))  # one token past a page boundary
    b = trunk + list(range(300, 300 + 3 * p))
    cache_tokens(cache, a)
    assert cache.total_tokens == len(a) - len(a) % p  # a partial last page is not cached
    cache_tokens(cache, b)
    m = cache.match_prefix(trunk + [200] + [0] * (2 * p))
    assert m.num_tokens == (3 * p if p == 1 else 2 * p)
    assert len(m.pages) == m.num_tokens // p
    for node in cache.nodes():
        assert len(node.key) % p == 0
    assert cache.match_prefix(b[: 3 * p - 1]).num_tokens == 2 * p
    assert cache.match_prefix(b + [1]).num_tokens == 5 * p
    cache.check_invariants(inflight_pages=0)


def test_namespaces_never_share(make_cache):
    cache = make_cache()
    cache_tokens(cache, [1, 2, 3], namespace="lora-a")
    assert cache.match_prefix([1, 2, 3]).num_tokens == 0
    assert cache.match_prefix([1, 2, 3], namespace="lora-b").num_tokens == 0
    assert cache.match_prefix([1, 2, 3], namespace="lora-a").num_tokens == 3
    cache_tokens(cache, [1, 2, 3], namespace="lora-b")
    assert cache.total_tokens == 6
    a = cache.match_prefix([1, 2], namespace="lora-a")
    b = cache.match_prefix([1, 2], namespace="lora-b")
    assert not set(a.pages) & set(b.pages)
    cache.check_invariants(inflight_pages=0)


def test_reset_frees_everything_but_refuses_while_locked(make_cache):
    cache = make_cache()
    cache_tokens(cache, [1, 2, 3])
    m = cache.match_prefix([1, 2])
    cache.lock(m.last_node)
    with pytest.raises(CacheInvariantError, match="locked"):
        cache.reset()
    cache.unlock(m.last_node)
    cache.reset()
    assert cache.total_tokens == 0
    assert cache.allocator.free_pages == cache.allocator.num_pages
    assert cache.match_prefix([1, 2, 3]).num_tokens == 0
    cache.check_invariants(inflight_pages=0)


def test_cache_unfinished_moves_the_lock_and_adopts_cached_pages(make_cache):
    cache = make_cache(num_pages=32)
    cache_tokens(cache, [1, 2, 3, 4])
    # a chunked request that did not see the cache computed [1..6] itself
    seq = SeqPages(cache.allocator)
    seq.extend(6)
    key = [1, 2, 3, 4, 5, 6, 7, 8]
    m = cache.cache_unfinished(key, seq, cache.root)
    assert m.num_tokens == 6
    assert seq.pages == m.pages  # reads the tree's pages now
    assert cache.protected_tokens == 6 and cache.evictable_tokens == 0
    cache.check_invariants(inflight_pages=0)
    seq.extend(2)
    cache.cache_finished(key, seq, m.last_node)
    assert cache.total_tokens == 8 and cache.protected_tokens == 0
    cache.check_invariants(inflight_pages=0)


def test_invariant_check_catches_a_leaked_page(make_cache):
    cache = make_cache(num_pages=8)
    cache_tokens(cache, [1, 2])
    cache.allocator.alloc(1)  # held by nobody the check is told about
    with pytest.raises(CacheInvariantError, match="pool has 8"):
        cache.check_invariants(inflight_pages=0)
    cache.check_invariants(inflight_pages=1)


def test_no_cache_shares_nothing_and_frees_on_finish():
    alloc = PageAllocator(8, 2)
    cache = NoCache(alloc)
    cache_tokens(cache, [1, 2, 3, 4])
    assert cache.match_prefix([1, 2, 3, 4]).num_tokens == 0
    assert cache.total_tokens == 0 and cache.evict(10) == 0
    assert alloc.free_pages == 8
    cache.check_invariants(inflight_pages=0)


def test_loading_a_prefix_back_never_drops_it_from_the_host_to_make_room():
    """Regression: making device room for a load demotes other pages to the host; the host LRU
    must not pick the very prefix being loaded (it did, and the load read freed host pages)."""
    from radixkv.mem import RadixCache
    from radixkv.mem.host_tier import HostTier, HostTierConfig

    host = HostTier(HostTierConfig(num_pages=2, page_size=1))
    cache = RadixCache(PageAllocator(4, 1), "lru", host_tier=host)
    a, b = [1, 2], [3, 4, 5, 6]
    for key in (a, b):
        seq = SeqPages(cache.allocator)
        seq.extend(len(key))
        cache.insert(key, seq.pages)
        seq.release()
        if key is a:
            cache.evict(2)  # a goes to the host, which is now full
    match = cache.match_prefix(a)
    assert (match.num_tokens, match.host_tokens) == (0, 2)
    loaded = cache.load_back(match, a)  # room on the device means demoting b, with the host full of a
    assert loaded.num_tokens == 2 and cache.match_prefix(a).num_tokens == 2
    cache.check_invariants(inflight_pages=0)
    assert cache.stats_host_loaded_tokens == 2
