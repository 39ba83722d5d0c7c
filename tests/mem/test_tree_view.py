"""`tree_nodes`: the tree as records, ranked by tokens x (hits + 1), with parents, tiers and namespaces."""

from radixkv.mem import NoCache, PageAllocator, RadixCache
from radixkv.mem.host_tier import HostTier, HostTierConfig
from radixkv.mem.tree_view import tree_nodes
from tests.mem.conftest import cache_tokens


def test_nodes_rank_by_tokens_times_hits_and_name_their_parents_and_namespaces():
    cache = RadixCache(PageAllocator(64, 1), "lru")
    system = list(range(100, 120))
    cache_tokens(cache, system + [1, 2])
    cache_tokens(cache, system + [3, 4, 5])
    cache_tokens(cache, [7, 8], namespace="tenant-b")
    for _ in range(3):
        cache.match_prefix(system + [9])  # the shared system prompt is hit (and once by the second request)
    view = tree_nodes(cache, limit=10)
    assert view["total_nodes"] == 4 and view["total_tokens"] == 20 + 2 + 3 + 2
    top = view["nodes"][0]
    assert top["tokens"] == 20 and top["hits"] == 4 and top["parent"] is None and top["tier"] == "device"
    assert top["preview_ids"] == system[:20]
    children = [n for n in view["nodes"] if n["parent"] == top["id"]]
    assert sorted(n["tokens"] for n in children) == [2, 3] and all(n["depth"] == 20 for n in children)
    assert {n["namespace"] for n in view["nodes"]} == {None, "tenant-b"}
    assert len(tree_nodes(cache, limit=2)["nodes"]) == 2  # the top two, by rank
    assert tree_nodes(cache, limit=2)["nodes"][0]["id"] == top["id"]


def test_host_only_nodes_say_so_and_the_no_op_cache_has_none():
    host = HostTier(HostTierConfig(16, 1))
    cache = RadixCache(PageAllocator(8, 1), "lru", host_tier=host)
    cache_tokens(cache, [1, 2, 3, 4])
    cache.evict(4)
    assert [n["tier"] for n in tree_nodes(cache)["nodes"]] == ["host"]
    assert tree_nodes(NoCache(PageAllocator(8, 1))) == {"nodes": [], "total_nodes": 0, "total_tokens": 0}
