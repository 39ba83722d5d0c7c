import pytest
import torch

from radixkv.errors import OutOfPagesError
from radixkv.mem import KVLayout, PageAllocator, SeqPages, make_kv_pool


def make(page_size=4, num_pages=8):
    alloc = PageAllocator(num_pages, page_size)
    pool = make_kv_pool(KVLayout(2, 1, 2, page_size), num_pages)
    return alloc, pool


def test_extend_fills_the_last_page_before_allocating():
    alloc, pool = make()
    seq = SeqPages(alloc, pool.copy_page)
    assert seq.extend(3) == [4, 5, 6]  # page 1
    assert seq.extend(3) == [7, 8, 9]  # rest of page 1, start of page 2
    assert seq.pages == [1, 2]
    assert alloc.free_pages == 6


def test_extend_is_all_or_nothing():
    alloc, pool = make(num_pages=2)
    seq = SeqPages(alloc, pool.copy_page)
    seq.extend(5)
    with pytest.raises(OutOfPagesError):
        seq.extend(8)
    assert seq.num_tokens == 5 and seq.pages == [1, 2]


def test_fork_shares_full_pages_and_copies_a_partial_page_before_writing():
    alloc, pool = make()
    parent = SeqPages(alloc, pool.copy_page)
    slots = parent.extend(6)  # page 1 full, page 2 half full
    for layer in range(2):
        pool.store(layer, torch.tensor(slots), torch.arange(6.0)[:, None, None].expand(6, 1, 2), torch.zeros(6, 1, 2))
    child = parent.fork()
    assert alloc.refcount(parent.pages[1]) == 2
    new_slots = child.extend(1)
    assert child.pages[0] == parent.pages[0]  # the full page stays shared
    assert child.pages[1] != parent.pages[1]  # the partial page was copied
    assert alloc.refcount(parent.pages[1]) == 1
    for layer in range(2):
        pool.store(layer, torch.tensor(new_slots), torch.full((1, 1, 2), 99.0), torch.zeros(1, 1, 2))
        child_keys = pool.k_view(layer).index_select(0, torch.tensor(child.slots()))[:, 0, 0]
        parent_keys = pool.k_view(layer).index_select(0, torch.tensor(parent.slots()))[:, 0, 0]
        assert child_keys.tolist() == [0, 1, 2, 3, 4, 5, 99]
        assert parent_keys.tolist() == [0, 1, 2, 3, 4, 5]  # the shared page was not overwritten
    parent.release()
    child.release()
    assert alloc.free_pages == 8
    alloc.check_invariants()


def test_pages_needed_counts_the_copy_on_write_page():
    alloc, pool = make()
    seq = SeqPages(alloc, pool.copy_page)
    seq.extend(2)
    fork = seq.fork()
    assert fork.pages_needed(1) == 1
    assert fork.pages_needed(3) == 2  # copy of the shared page + one fresh page
    assert fork.pages_needed(0) == 0


def test_replace_prefix_swaps_duplicates_for_cached_pages():
    alloc, _ = make(page_size=1)
    cached = alloc.alloc(2)
    seq = SeqPages(alloc)
    seq.extend(3)
    own = list(seq.pages)
    seq.replace_prefix(cached)
    assert seq.pages == cached + own[2:]
    assert all(alloc.refcount(p) == 2 for p in cached)
    assert alloc.refcount(own[2]) == 1
    assert alloc.free_pages == 8 - 3  # the two duplicates went back
    seq.release()
    alloc.decref(cached)
    assert alloc.free_pages == 8


def test_truncate_releases_tail_pages():
    alloc, _ = make()
    seq = SeqPages(alloc)
    seq.extend(10)
    seq.truncate(5)
    assert seq.num_tokens == 5 and len(seq.pages) == 2
    assert alloc.free_pages == 6
    with pytest.raises(ValueError):
        seq.truncate(6)
