"""Retention hints in the radix cache: retained prefixes are evicted only when nothing unretained
is left, earliest deadline first; deadlines run out with the cache's clock; a span keeps only its
page-aligned part; nothing blocks admission."""

import math

import pytest

from radixkv.mem import POLICIES, BeladyPolicy, NoCache, PageAllocator, RadixCache, SeqPages
from radixkv.mem.host_tier import HostTier, HostTierConfig
from radixkv.retention import WHOLE, Retention
from tests.mem.conftest import FakeClock, cache_tokens

A, B, C, D = [10, 11, 12], [20, 21, 22], [30, 31, 32], [40, 41, 42]


def serve(cache, key, retention=None):
    """A request for `key` through the cache, evicting for its pages (what the replay does)."""
    return cache.serve_and_cache(key, cache.match_prefix(key), retention)


def cached(cache, key):
    return cache.peek(key).num_tokens


def test_a_retained_prefix_outlives_an_unretained_one_under_memory_pressure():
    clock = FakeClock()
    cache = RadixCache(PageAllocator(6, 1), "lru", clock=clock)
    cache_tokens(cache, A, retention=Retention.whole(60))
    cache_tokens(cache, B)  # more recent: LRU alone would evict A first
    assert serve(cache, C)
    assert (cached(cache, A), cached(cache, B), cached(cache, C)) == (3, 0, 3)
    assert cache.retained_tokens == 3
    cache.check_invariants(inflight_pages=0)


def test_an_expired_retention_ranks_like_any_other_leaf():
    clock = FakeClock()
    cache = RadixCache(PageAllocator(9, 1), "lru", clock=clock)
    cache_tokens(cache, A, retention=Retention.whole(60))
    cache_tokens(cache, B)
    cache_tokens(cache, C)
    clock.advance(61)  # nothing touched A since: its candidate is still flagged retained
    assert cache.retained_tokens == 0
    assert serve(cache, D)
    # A, the least recently used, goes first, ahead of the unretained B and C
    assert (cached(cache, A), cached(cache, B), cached(cache, C)) == (0, 3, 3)
    cache.check_invariants(inflight_pages=0)


def test_retained_leaves_are_still_evicted_when_nothing_else_is_left():
    clock = FakeClock()
    cache = RadixCache(PageAllocator(6, 1), "lru", clock=clock)
    cache_tokens(cache, A, retention=Retention.whole(600))
    cache_tokens(cache, B, retention=Retention.whole(60))  # more recent, but its deadline comes first
    assert cache.evictable_tokens == 6  # retention never protects: admission sees it all as evictable
    assert serve(cache, C)
    assert (cached(cache, A), cached(cache, B), cached(cache, C)) == (3, 0, 3)
    assert cache.evict(100) == 6  # and everything can still go
    cache.check_invariants(inflight_pages=0)


def test_a_span_ending_mid_edge_retains_only_its_page_aligned_part():
    clock = FakeClock()
    cache = RadixCache(PageAllocator(16, 2), "lru", clock=clock)
    key = list(range(1, 9))  # 4 pages of 2 tokens, one edge
    cache_tokens(cache, key, retention=Retention(((5, 60.0),)))
    nodes = sorted(cache.nodes(), key=lambda n: n.depth)
    # split at 4, the page-aligned floor of the span's end: token 5 is not retained
    assert [(n.depth, len(n.key), n.retain_until) for n in nodes] == [(0, 4, clock.now + 60), (4, 4, 0.0)]
    assert cache.retained_tokens == 4
    cache.evict(6)  # the unretained tail first, then what is still needed of the retained part
    assert cached(cache, key) == 2
    cache.check_invariants(inflight_pages=0)


def test_a_span_shorter_than_a_page_retains_nothing():
    cache = RadixCache(PageAllocator(16, 2), "lru", clock=FakeClock())
    cache_tokens(cache, list(range(1, 9)), retention=Retention(((1, 60.0),)))
    assert [n.retain_until for n in cache.nodes()] == [0.0]


def test_each_part_is_kept_as_long_as_its_longest_span_and_hints_only_extend():
    clock = FakeClock()
    cache = RadixCache(PageAllocator(16, 2), "lru", clock=clock)
    key = list(range(1, 9))
    cache_tokens(cache, key, retention=Retention(((4, 600.0), (WHOLE, 60.0))))
    start = clock.now
    clock.advance(10)
    cache_tokens(cache, key, retention=Retention.whole(30))  # a later, shorter hint
    nodes = sorted(cache.nodes(), key=lambda n: n.depth)
    assert [n.retain_until for n in nodes] == [start + 600, start + 60]
    clock.advance(60)  # past the tail's deadline, not the head's
    assert cache.retained_tokens == 4
    cache.check_invariants(inflight_pages=0)


def _policy(name):
    if name == "belady":  # the retained prefix is never used again: Belady alone would drop it first
        return BeladyPolicy(lambda node, end: math.inf if node.key[0] == A[0] else 1.0)
    return name


@pytest.mark.parametrize("policy", [*sorted(POLICIES), "belady"])
def test_every_policy_evicts_unretained_pages_before_retained_ones(policy):
    cache = RadixCache(PageAllocator(8, 1), _policy(policy), clock=FakeClock())
    cache_tokens(cache, A + [13], retention=Retention.whole(60))  # oldest, least used
    cache_tokens(cache, B + [23])
    for _ in range(3):
        cache.match_prefix(B + [23])  # popular, recent
    cache.evict(4)
    assert (cached(cache, A + [13]), cached(cache, B + [23])) == (4, 0)
    cache.check_invariants(inflight_pages=0)


def test_the_host_tier_takes_unretained_prefixes_first_and_a_loaded_back_one_is_retained_again():
    clock = FakeClock()
    cache = RadixCache(PageAllocator(6, 1), "lru", host_tier=HostTier(HostTierConfig(8, 1)), clock=clock)
    cache_tokens(cache, A, retention=Retention.whole(60))
    cache_tokens(cache, B)
    cache.evict(3)
    assert (cache.peek(A).num_tokens, cache.peek(B).host_tokens) == (3, 3)
    cache.evict(3)  # nothing unretained on the device: A goes down too
    assert cache.peek(A).host_tokens == 3 and cache.retained_tokens == 0  # host tokens are not counted
    cache.load_back(cache.peek(A))
    assert cache.peek(A).num_tokens == 3 and cache.retained_tokens == 3
    cache.check_invariants(inflight_pages=0)


def test_the_no_op_cache_ignores_retention():
    cache = NoCache(PageAllocator(4, 1))
    cache_tokens(cache, [1, 2], retention=Retention.whole(60))
    assert cache.retained_tokens == 0 and cache.allocator.free_pages == 4


def test_a_prefix_cached_mid_prefill_is_retained_at_once():
    cache = RadixCache(PageAllocator(8, 1), "lru", clock=FakeClock())
    match = cache.match_prefix(A + B)
    cache.lock(match.last_node)
    seq = SeqPages.from_prefix(cache.allocator, match.pages, match.num_tokens)
    seq.extend(3)  # the first chunk
    match = cache.cache_unfinished(A + B, seq, match.last_node, None, Retention.whole(60))
    assert cache.retained_tokens == 3 and cache.protected_tokens == 3
    cache.unlock(match.last_node)
    seq.release()
    cache.check_invariants(inflight_pages=0)
