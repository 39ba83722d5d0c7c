import pytest

from radixkv.errors import ConfigError, InvalidPageError, OutOfPagesError
from radixkv.mem import PageAllocator, pages_for_tokens, pages_to_slots


def test_alloc_hands_out_distinct_pages_and_never_the_padding_page():
    alloc = PageAllocator(num_pages=8, page_size=4)
    pages = alloc.alloc(8)
    assert sorted(pages) == list(range(1, 9))
    assert alloc.free_pages == 0
    assert all(alloc.refcount(p) == 1 for p in pages)


def test_alloc_is_all_or_nothing_when_short():
    alloc = PageAllocator(4, 1)
    alloc.alloc(3)
    with pytest.raises(OutOfPagesError, match="requested 2 page"):
        alloc.alloc(2)
    assert alloc.free_pages == 1


def test_page_returns_to_free_list_only_when_last_reference_dropped():
    alloc = PageAllocator(4, 1)
    (p,) = alloc.alloc(1)
    alloc.incref([p])
    assert alloc.decref([p]) == 0
    assert alloc.free_pages == 3
    assert alloc.decref([p]) == 1
    assert alloc.free_pages == 4
    alloc.check_invariants()


def test_double_free_is_rejected_without_changing_counts():
    alloc = PageAllocator(4, 1)
    a, b = alloc.alloc(2)
    alloc.decref([a])
    with pytest.raises(InvalidPageError, match="double free"):
        alloc.decref([b, a])
    assert alloc.refcount(b) == 1  # b was not released by the failed call
    with pytest.raises(InvalidPageError, match="double free"):
        alloc.decref([b, b])
    assert alloc.refcount(b) == 1
    alloc.check_invariants()


@pytest.mark.parametrize("bad", [0, -1, 5, 99, "3", 2.0])
def test_foreign_ids_are_rejected(bad):
    alloc = PageAllocator(4, 1)
    alloc.alloc(4)
    with pytest.raises(InvalidPageError):
        alloc.decref([bad])
    with pytest.raises(InvalidPageError):
        alloc.incref([bad])


def test_incref_of_free_page_is_rejected():
    alloc = PageAllocator(4, 1)
    with pytest.raises(InvalidPageError, match="free"):
        alloc.incref([1])


def test_bad_sizes_are_config_errors():
    with pytest.raises(ConfigError, match="num_pages"):
        PageAllocator(0, 1)
    with pytest.raises(ConfigError, match="page_size"):
        PageAllocator(4, 0)


def test_reset_frees_everything():
    alloc = PageAllocator(4, 2)
    alloc.alloc(3)
    alloc.reset()
    assert alloc.free_pages == 4
    alloc.check_invariants()


def test_slot_helpers():
    assert pages_to_slots([3, 1], 4, 6) == [12, 13, 14, 15, 4, 5]
    assert pages_to_slots([7, 2, 5], 1, 2) == [7, 2]
    assert pages_for_tokens(0, 4) == 0
    assert pages_for_tokens(5, 4) == 2
    assert pages_for_tokens(8, 4) == 2
