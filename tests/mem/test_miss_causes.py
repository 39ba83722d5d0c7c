"""Miss attribution: workloads built to produce each cause report it exactly, and the parts add
up to the prompt."""

from radixkv.mem import NoCache, PageAllocator, RadixCache
from radixkv.mem.host_tier import HostTier, HostTierConfig
from radixkv.mem.miss_causes import CAUSES, GhostIndex, explain, retokenized
from radixkv.tenancy import namespace, principal_of, salt_namespace


def radix(pages=16, page_size=4):
    cache = RadixCache(PageAllocator(pages, page_size), "lru")
    cache.ghosts = GhostIndex()
    return cache


def put(cache, key, namespace=None):
    assert cache.serve_and_cache(key, cache.match_prefix(key, namespace))
    if namespace is not None:  # serve_and_cache caches in the default namespace: redo it in this one
        cache.reset()
        m = cache.match_prefix(key, namespace)
        pages = cache.allocator.alloc(len(key) // cache.page_size)
        cache.insert(key, pages, namespace)
        cache.allocator.decref(pages)
        assert m.num_tokens == 0


def why(cache, key, namespace=None):
    m = cache.peek(key, namespace)
    out = explain(cache, key, namespace, m.num_tokens, m.host_tokens)
    assert sum(out.values()) == len(key) and set(out) == set(CAUSES)
    return {k: v for k, v in out.items() if v}


A = list(range(100, 108))
B = list(range(300, 308))


def test_a_never_seen_prompt_is_new():
    assert why(radix(), A) == {"new": 8}
    assert explain(NoCache(PageAllocator(4, 4)), A, None, 0) == {**dict.fromkeys(CAUSES, 0), "new": 8}


def test_a_hit_then_an_evicted_prompt():
    cache = radix()
    put(cache, A)
    assert why(cache, A) == {"device": 8}
    cache.evict(8)
    assert why(cache, A) == {"evicted": 8}
    assert why(cache, A[:4] + [1, 2, 3, 4]) == {"evicted": 4, "new": 4}  # only the pages it held


def test_the_part_of_a_page_the_cache_holds_but_cannot_share():
    cache = radix()
    put(cache, A)
    assert why(cache, A[:6] + [7, 7]) == {"device": 4, "page_tail": 2, "new": 2}
    assert why(cache, A[:6]) == {"device": 4, "page_tail": 2}  # a prompt ending inside a page


def test_cached_under_another_namespace():
    cache = radix()
    salted = salt_namespace("a salt")
    put(cache, A, namespace=salted)
    assert why(cache, A) == {"namespace": 8}
    assert why(cache, A, salted) == {"device": 8}


def test_another_tenants_cache_is_never_looked_in():
    """Issue 41: the `namespace` cause told a key that another key had sent the same prompt."""
    cache = radix()
    k1, k2 = principal_of("k1"), principal_of("k2")
    put(cache, A, namespace=namespace(k1, None))
    put(cache, B, namespace=namespace(k1, salt_namespace("s")))
    assert why(cache, A, namespace(k2, None)) == {"new": 8}
    assert why(cache, B, namespace(k2, salt_namespace("s"))) == {"new": 8}
    assert why(cache, B, namespace(k1, None)) == {"namespace": 8}  # its own other namespace still counts


def test_a_host_hit_and_an_eviction_from_the_host_tier():
    host = HostTier(HostTierConfig(2, 4))  # one 8-token prefix fits on the host
    cache = RadixCache(PageAllocator(2, 4), "lru", host_tier=host)
    cache.ghosts = GhostIndex()
    put(cache, A)
    put(cache, list(range(200, 208)))  # A goes to the host
    assert why(cache, A) == {"host": 8}
    put(cache, list(range(300, 308)))  # the host lets A go: gone from every tier
    assert why(cache, A) == {"evicted": 8}


def test_a_storage_hit_and_an_eviction_from_the_storage_tier():
    from radixkv.mem import RadixCache
    from radixkv.mem.storage_tier import StorageTier, StorageTierConfig

    host = HostTier(HostTierConfig(2, 4))
    storage = StorageTier(StorageTierConfig(2, 4))  # one 8-token prefix fits in storage
    cache = RadixCache(PageAllocator(2, 4), "lru", host_tier=host, storage=storage)
    cache.ghosts = GhostIndex()
    for key in (A, list(range(200, 208)), list(range(300, 308))):  # A: device, host, then storage
        put(cache, key)
    m = cache.peek(A)
    assert (m.num_tokens, m.host_tokens, m.storage_tokens) == (0, 0, 8)
    assert explain(cache, A, None, m.num_tokens, m.host_tokens, m.storage_tokens)["storage"] == 8
    assert len(cache.ghosts) == 0  # every page is still in some tier
    put(cache, list(range(400, 408)))  # storage lets A go for the next prefix written
    assert cache.peek(A).storage_tokens == 0 and storage.counters["evicted_pages"] == 2
    assert why(cache, A) == {"evicted": 8}
    assert why(cache, A[:4] + [1, 2, 3, 4]) == {"evicted": 4, "new": 4}


def test_text_that_a_cached_sequence_holds_under_other_token_ids_is_retokenized():
    vocab = {1: "Hello", 2: " world", 3: "Hello ", 4: "world", 5: "!", 9: "Bye"}
    decode = lambda ids: "".join(vocab[i] for i in ids)  # noqa: E731
    cache = radix(page_size=1)
    put(cache, [9, 1, 2, 5])  # "ByeHello world!" as cached
    prompt = [9, 3, 4, 5]  # the same text, other token boundaries
    m = cache.peek(prompt)
    causes = retokenized(cache, prompt, None, explain(cache, prompt, None, m.num_tokens), decode)
    assert {k: v for k, v in causes.items() if v} == {"device": 1, "retokenized": 3}
    other = [9, 5, 5, 5]  # really new text
    m = cache.peek(other)
    causes = retokenized(cache, other, None, explain(cache, other, None, m.num_tokens), decode)
    assert {k: v for k, v in causes.items() if v} == {"device": 1, "new": 3}


def test_the_ghost_index_keeps_the_most_recent_pages():
    ghosts = GhostIndex(capacity=3)
    ghosts.add([1, 2, 3])
    ghosts.add([4, 1])
    assert [h in ghosts for h in (1, 2, 3, 4)] == [True, False, True, True] and len(ghosts) == 3
