import pytest

from radixkv.mem import PageAllocator, RadixCache, SeqPages


def cache_tokens(cache, key, namespace=None):
    """What a finished request does: compute `key` into fresh pages, cache them, drop its refs."""
    match = cache.match_prefix(key, namespace)
    cache.lock(match.last_node)
    seq = SeqPages.from_prefix(cache.allocator, match.pages, match.num_tokens)
    seq.extend(len(key) - match.num_tokens)
    cache.cache_finished(list(key), seq, match.last_node, namespace)


@pytest.fixture
def make_cache():
    def make(num_pages=64, page_size=1, policy="lru"):
        return RadixCache(PageAllocator(num_pages, page_size), policy)

    return make
