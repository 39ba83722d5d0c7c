from radixkv.mem import PageAllocator, RadixCache, SeqPages
from radixkv.sampling_params import SamplingParams
from radixkv.sched import Req
from radixkv.sched.policy import IN_BATCH_SHARE_TOKENS, InBatchPrefixes, SchedulePolicy, common_prefix_len


def cached(cache, key):
    m = cache.match_prefix(key)
    cache.lock(m.last_node)
    seq = SeqPages.from_prefix(cache.allocator, m.pages, m.num_tokens)
    seq.extend(len(key) - m.num_tokens)
    cache.cache_finished(key, seq, m.last_node)


def req(rid, ids):
    return Req(rid, list(ids), SamplingParams())


def setup():
    cache = RadixCache(PageAllocator(256, 1))
    cached(cache, list(range(1, 21)))  # A: 20 tokens
    cached(cache, list(range(1, 6)) + [90, 91, 92])  # B branches off A after 5 tokens
    return cache


def test_fcfs_keeps_arrival_order():
    cache = setup()
    reqs = [req("x", [7, 7]), req("a", range(1, 30)), req("b", [1, 2, 3, 4, 5, 90, 91, 92, 0])]
    assert [r.rid for r in SchedulePolicy("fcfs", cache).order(reqs)] == ["x", "a", "b"]


def test_lpm_orders_by_cached_prefix_and_honours_the_starvation_bound():
    cache = setup()
    reqs = [req("none", [7, 7]), req("short", [1, 2, 3, 50]), req("long", range(1, 30)),
            req("mid", [1, 2, 3, 4, 5, 90, 91, 92, 0])]
    policy = SchedulePolicy("lpm", cache, starvation_limit=3)
    assert [r.rid for r in policy.order(reqs)] == ["long", "mid", "short", "none"]
    assert [r.match_len for r in reqs] == [0, 3, 20, 8]
    reqs[0].passed_over = 3
    assert [r.rid for r in policy.order(reqs)][0] == "none"


def test_dfs_weight_admits_requests_under_the_busiest_subtree_together():
    cache = setup()
    under_b = [req(f"b{i}", [1, 2, 3, 4, 5, 90, 91, 92, i]) for i in range(3)]
    under_a = [req("a0", list(range(1, 21)) + [0])]
    other = [req("z", [7, 7])]
    order = [r.rid for r in SchedulePolicy("dfs-weight", cache).order(under_a + other + under_b)]
    assert order[:3] == ["b0", "b1", "b2"]
    assert set(order) == {"a0", "z", "b0", "b1", "b2"}


def test_in_batch_prefixes_detect_a_shared_uncached_span():
    tracker = InBatchPrefixes()
    base = list(range(100, 100 + IN_BATCH_SHARE_TOKENS + 5))
    tracker.add(base + [1])
    assert tracker.shares(base + [2], cached=0)
    assert not tracker.shares(base + [2], cached=10)  # only 27 uncached tokens in common
    assert not tracker.shares([5] + base, cached=0)


def test_common_prefix_len():
    assert common_prefix_len([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_len([1, 2], [1, 2, 3]) == 2
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len(list(range(1000)), list(range(999)) + [0]) == 999
