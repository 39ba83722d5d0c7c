import math

import pytest

from radixkv.errors import ConfigError
from radixkv.mem import BeladyPolicy, make_policy
from tests.mem.conftest import cache_tokens


def evicted_order(cache, n, edge_tokens=2):
    """Evict one whole edge at a time; return the first token of each evicted edge."""
    order = []
    for _ in range(n):
        before = {node.key[0] for node in cache._iter_nodes()}
        cache.evict(edge_tokens)
        after = {node.key[0] for node in cache._iter_nodes()}
        order.extend(sorted(before - after))
    return order


def test_evicts_least_recently_used_leaf_first(make_cache):
    cache = make_cache(policy="lru")
    for first in (10, 20, 30):
        cache_tokens(cache, [first, first + 1])
    cache.match_prefix([10, 11])  # 10 becomes the most recent
    assert evicted_order(cache, 3) == [20, 30, 10]


def test_lfu_evicts_least_hit_leaf_first(make_cache):
    cache = make_cache(policy="lfu")
    for first in (10, 20, 30):
        cache_tokens(cache, [first, first + 1])
    for _ in range(3):
        cache.match_prefix([10, 11])
    cache.match_prefix([30, 31])
    assert evicted_order(cache, 3) == [20, 30, 10]


def test_fifo_evicts_oldest_insertion_whatever_its_use(make_cache):
    cache = make_cache(policy="fifo")
    for first in (10, 20, 30):
        cache_tokens(cache, [first, first + 1])
    for _ in range(5):
        cache.match_prefix([10, 11])
    assert evicted_order(cache, 3) == [10, 20, 30]


def test_belady_evicts_the_leaf_used_farthest_in_the_future(make_cache):
    next_use = {10: 5.0, 20: math.inf, 30: 2.0}
    cache = make_cache(policy=BeladyPolicy(lambda node, end: next_use[node.key[0]]))
    for first in (10, 20, 30):
        cache_tokens(cache, [first])
    assert evicted_order(cache, 3, edge_tokens=1) == [20, 10, 30]


def test_unknown_policy_names_the_choices():
    with pytest.raises(ConfigError, match="unknown eviction policy 'mru'.*lru"):
        make_policy("mru")


def test_eviction_takes_only_the_tail_pages_it_needs(make_cache):
    cache = make_cache(num_pages=32, page_size=2)
    cache_tokens(cache, list(range(10)))
    assert cache.evict(3) == 4  # two pages from the tail
    assert cache.match_prefix(list(range(10))).num_tokens == 6
    cache.check_invariants(inflight_pages=0)


def test_page_granular_policy_re_ranks_the_victim_after_each_page(make_cache):
    # leaf A = [1..4]: its tail pages are never used again, its head page soon;
    # leaf B = [9, 9]: next used at time 5
    uses = {(1, 2): 1.0, (1, 4): math.inf, (9, 2): 5.0}

    def next_use(node, end):
        return uses.get((node.key[0], end), math.inf)

    cache = make_cache(num_pages=32, page_size=1, policy=BeladyPolicy(next_use))
    cache_tokens(cache, [1, 2, 3, 4])
    cache_tokens(cache, [9, 10])
    assert cache.evict(3) == 3  # A's two never-used tail tokens, then B's tail (B(1) ranks as inf)
    assert cache.match_prefix([1, 2, 3, 4]).num_tokens == 2
    assert cache.match_prefix([9, 10]).num_tokens == 1
    cache.check_invariants(inflight_pages=0)
