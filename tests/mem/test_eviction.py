import math

import pytest

from radixkv.errors import ConfigError
from radixkv.mem import BeladyPolicy, make_policy
from tests.mem.conftest import cache_tokens


def evicted_order(cache, n, edge_tokens=2):
    """Evict one whole edge at a time; return the first token of each evicted edge."""
    order = []
    for _ in range(n):
        before = {node.key[0] for node in cache.nodes()}
        cache.evict(edge_tokens)
        after = {node.key[0] for node in cache.nodes()}
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


# -- the reuse-aware policy -------------------------------------------------------------------
from radixkv.mem import PageAllocator, RadixCache  # noqa: E402
from radixkv.mem.eviction import ReusePolicy  # noqa: E402

TRUNK = [1, 2, 3, 4]  # a shared "system prompt" every conversation starts with


def conversation(cache, body, turns):
    """Cache a conversation that ran `turns` requests: each turn extends the previous prompt."""
    prompt = TRUNK + body
    for t in range(turns):
        cache_tokens(cache, prompt)
        prompt = prompt + [1000 * (t + 1) + body[0]]
    return prompt


def test_reuse_policy_counts_the_turns_of_a_conversation_below_a_shared_trunk():
    cache = RadixCache(PageAllocator(256, 1), ReusePolicy(attention_scale=None))
    conversation(cache, [10, 11], turns=1)
    conversation(cache, [20, 21], turns=3)
    leaves = {node.key[0] if node.parent is not cache.root else None: node
              for node in cache.nodes() if not node.children}
    by_first_token = {}
    for leaf in leaves.values():
        top = leaf
        while top.parent.parent is not None and len(top.parent.children) == 1:
            top = top.parent
        by_first_token[top.key[0]] = ReusePolicy.turns(leaf)
    assert by_first_token == {10: 1, 20: 3}


def test_reuse_policy_is_lru_among_prefixes_with_equal_odds():
    cache = make_cache_with(ReusePolicy(attention_scale=None))
    assert cache.policy.tau == 0  # nothing observed yet: plain LRU
    for first in (10, 20, 30):
        cache_tokens(cache, [first, first + 1])
    cache.match_prefix([10, 11])  # a hit: tau > 0 now, but 10 is still the most recent
    assert cache.policy.tau > 0
    assert evicted_order(cache, 3) == [20, 30, 10]


def make_cache_with(policy):
    return RadixCache(PageAllocator(256, 1), policy)


def test_a_conversation_that_continued_outlives_a_fresher_one_time_prompt():
    policy = ReusePolicy(attention_scale=None)
    cache = make_cache_with(policy)
    conversation(cache, [20, 21], turns=3)  # continued twice
    conversation(cache, [10, 11], turns=1)  # newer, never continued
    policy.hit_gap = 100.0  # idle gaps before reuse are long compared with these ticks
    for node in list(cache.nodes()):
        if node.candidate is not None:  # re-rank with the learned time scale
            cache.candidates.rerank(node)
    cache.evict(1)
    assert cache.match_prefix(TRUNK + [10, 11]).num_tokens < 6  # the one-time prompt lost its tail
    assert cache.match_prefix(TRUNK + [20, 21, 1020, 2020]).num_tokens == 8


def test_reuse_policy_learns_its_time_scale_from_hits_and_evictions():
    policy = ReusePolicy(attention_scale=None, window=1)
    cache = make_cache_with(policy)
    cache_tokens(cache, [5, 6, 7])
    for _ in range(9):
        cache.match_prefix([9])  # ticks the clock
    cache.match_prefix([5, 6, 7])
    assert policy.hit_gap >= 9  # the idle gap before this hit
    cache_tokens(cache, [8, 8])
    for _ in range(30):
        cache.match_prefix([9])
    cache.evict(100)
    assert policy.evict_age >= 30 and policy.tau == max(policy.hit_gap, policy.evict_age)


def test_reuse_cost_keeps_deep_tokens_longer_than_shallow_ones():
    policy = ReusePolicy(attention_scale=4.0)
    cache = make_cache_with(policy)
    cache_tokens(cache, [50, 51, 52, 53, 54, 55, 56, 57])  # deep: tail tokens cost up to 3x
    cache_tokens(cache, [60, 61])  # shallow and more recent
    policy.hit_gap = 10.0
    for node in list(cache.nodes()):
        cache.candidates.rerank(node)
    cache.evict(2)
    assert cache.match_prefix([60, 61]).num_tokens == 0  # the cheap tokens went first
    assert cache.match_prefix([50, 51, 52, 53, 54, 55, 56, 57]).num_tokens == 8
    cache.check_invariants(inflight_pages=0)


def test_named_reuse_policies_and_model_derived_cost_scale():
    assert make_policy("reuse").attention_scale is None
    assert make_policy("reuse-cost", attention_scale=3891.2).attention_scale == 3891.2
    assert make_policy("reuse-cost").attention_scale == 8192.0
    with pytest.raises(ConfigError, match="attention_scale"):
        ReusePolicy(attention_scale=-1)
