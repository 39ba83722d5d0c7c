import pytest

from radixkv.mem import PageAllocator, RadixCache, SeqPages


def cache_tokens(cache, key, namespace=None, retention=None):
    """What a finished request does: compute `key` into fresh pages, cache them (retained as
    `retention` asks), drop its refs."""
    match = cache.match_prefix(key, namespace)
    cache.lock(match.last_node)
    seq = SeqPages.from_prefix(cache.allocator, match.pages, match.num_tokens)
    seq.extend(len(key) - match.num_tokens)
    cache.cache_finished(list(key), seq, match.last_node, namespace, retention)


class FakeClock:
    """A cache clock the test moves by hand (seconds)."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def make_cache():
    def make(num_pages=64, page_size=1, policy="lru"):
        return RadixCache(PageAllocator(num_pages, page_size), policy)

    return make
