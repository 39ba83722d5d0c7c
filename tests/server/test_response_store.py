"""The Responses API's store: scoped to the API key, bounded in count and age."""

import pytest

from radixkv.errors import ConfigError
from radixkv.server.api.response_store import ResponseStore, StoredResponse


def stored(n: int) -> StoredResponse:
    return StoredResponse({"id": f"resp_{n}"}, None, None, [{"role": "user", "content": "x"}],
                          {"role": "assistant", "content": "y"}, [1, 2], [3])


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_another_api_key_cannot_see_or_delete_a_response():
    store = ResponseStore()
    store.put("key0", "resp_1", stored(1))
    assert store.get("key0", "resp_1").body == {"id": "resp_1"}
    assert store.get("key1", "resp_1") is None
    assert not store.delete("key1", "resp_1") and store.get("key0", "resp_1") is not None
    assert store.delete("key0", "resp_1") and store.get("key0", "resp_1") is None


def test_the_oldest_responses_go_first_past_the_count_bound():
    store = ResponseStore(max_responses=2)
    for n in range(3):
        store.put("", f"resp_{n}", stored(n))
    assert store.get("", "resp_0") is None and len(store) == 2


def test_responses_expire_after_max_age():
    clock = Clock()
    store = ResponseStore(max_age=10, clock=clock)
    store.put("", "resp_old", stored(0))
    clock.now = 6
    store.put("", "resp_new", stored(1))
    clock.now = 11
    assert store.get("", "resp_old") is None and store.get("", "resp_new") is not None
    clock.now = 17
    assert len(store) == 0


def test_a_store_of_size_zero_keeps_nothing_and_bad_bounds_are_refused():
    store = ResponseStore(max_responses=0)
    store.put("", "resp_1", stored(1))
    assert store.get("", "resp_1") is None
    with pytest.raises(ConfigError, match="--responses-store-size"):
        ResponseStore(max_responses=-1)
    with pytest.raises(ConfigError, match="--responses-store-ttl"):
        ResponseStore(max_age=0)


def big(n: int, chars: int) -> StoredResponse:
    return StoredResponse({"id": f"resp_{n}", "metadata": {"k": "v" * chars}}, None, None,
                          [{"role": "user", "content": "x"}], {"role": "assistant", "content": "y"}, [1] * 100, [3])


def test_the_store_is_bounded_by_bytes_oldest_first():
    """Found from outside: 250 responses carrying 1.9 MB each grew the HTTP process by 380 MB (the
    store was bounded by count only: ~8 GB at the defaults)."""
    one = big(0, 100_000).nbytes
    assert one >= 300_000  # the JSON text, and Python's overhead over it
    store = ResponseStore(max_responses=1000, max_bytes=5 * one + 1000)  # (ids grow a digit)
    for n in range(20):
        assert store.put("k", f"resp_{n}", big(n, 100_000))
        assert store.nbytes <= 5 * one + 1000
    assert len(store) == 5 and store.get("k", "resp_0") is None and store.get("k", "resp_19") is not None
    assert not store.put("k", "huge", big(99, 2_000_000))  # larger than the whole budget: not kept
    assert store.get("k", "huge") is None and len(store) == 5
    store.delete("k", "resp_19")
    assert store.nbytes == sum(s for _, s in store._items.values())
