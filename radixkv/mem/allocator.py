"""Reference-counted page allocator over one preallocated KV pool.

Units: a *page* holds `page_size` consecutive token slots; page `p` owns the slots
`[p * page_size, (p + 1) * page_size)`. Page 0 is reserved as the padding sink that kernels may
read or write for padded positions, so the allocator hands out ids `1 .. num_pages`.

Ownership: every holder of a page (the radix tree, each running sequence) owns exactly one
reference. `alloc` returns pages with one reference (the caller's); `incref` adds holders;
`decref` drops one, and a page returns to the free list only when its count reaches zero.
"""

from __future__ import annotations

from collections.abc import Iterable

from radixkv.errors import CacheInvariantError, ConfigError, InvalidPageError, OutOfPagesError

PADDING_PAGE = 0


class PageAllocator:
    """Free list plus reference counts for `num_pages` usable pages of `page_size` tokens."""

    __slots__ = ("num_pages", "page_size", "_refcount", "_free")

    def __init__(self, num_pages: int, page_size: int):
        if num_pages < 1:
            raise ConfigError(f"num_pages must be >= 1, got {num_pages}")
        if page_size < 1:
            raise ConfigError(f"page_size must be >= 1, got {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        # index 0 is the reserved padding page and never counted
        self._refcount: list[int] = [0] * (num_pages + 1)
        # a stack popped from the end: low page ids are handed out first
        self._free: list[int] = list(range(num_pages, 0, -1))

    # -- sizes ---------------------------------------------------------------------------------
    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def used_pages(self) -> int:
        return self.num_pages - len(self._free)

    @property
    def free_tokens(self) -> int:
        return len(self._free) * self.page_size

    @property
    def total_tokens(self) -> int:
        return self.num_pages * self.page_size

    def refcount(self, page: int) -> int:
        self._check_id(page)
        return self._refcount[page]

    # -- alloc / ref counting ------------------------------------------------------------------
    def alloc(self, n: int) -> list[int]:
        """Take `n` free pages, each with one reference owned by the caller. All or nothing."""
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of pages ({n})")
        if n > len(self._free):
            raise OutOfPagesError(n, len(self._free), self.page_size)
        if n == 0:
            return []
        pages = self._free[-n:]
        del self._free[-n:]
        pages.reverse()
        refcount = self._refcount
        for p in pages:
            refcount[p] = 1
        return pages

    def incref(self, pages: Iterable[int]) -> None:
        """Add one holder to each page; every page must already be allocated."""
        pages = list(pages)
        refcount = self._refcount
        for p in pages:
            self._check_id(p)
            if refcount[p] == 0:
                raise InvalidPageError(f"incref of page {p}, which is free (not allocated)")
        for p in pages:
            refcount[p] += 1

    def decref(self, pages: Iterable[int]) -> int:
        """Drop one holder from each page; pages reaching zero go back to the free list.

        Validates every id before changing anything (a repeated id counts twice), so a bad call
        raises `InvalidPageError` and leaves all counts as they were. Returns the pages freed.
        """
        pages = list(pages)
        refcount = self._refcount
        need: dict[int, int] = {}
        for p in pages:
            self._check_id(p)
            need[p] = need.get(p, 0) + 1
        for p, k in need.items():
            if refcount[p] < k:
                state = "free" if refcount[p] == 0 else f"held {refcount[p]} time(s)"
                raise InvalidPageError(f"double free: page {p} released {k} time(s) but is {state}")
        freed = 0
        for p in pages:
            refcount[p] -= 1
            if refcount[p] == 0:
                self._free.append(p)
                freed += 1
        return freed

    free = decref

    def _check_id(self, page: int) -> None:
        if not isinstance(page, int) or page < 1 or page > self.num_pages:
            if page == PADDING_PAGE:
                raise InvalidPageError("page 0 is the reserved padding page, never allocated")
            raise InvalidPageError(
                f"page id {page!r} is foreign to this pool (valid ids are 1..{self.num_pages})"
            )

    # -- checks --------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Free list and counts agree: a page is free iff its count is zero, listed once."""
        free = self._free
        if len(set(free)) != len(free):
            raise CacheInvariantError("a page is on the free list twice")
        zero = {p for p in range(1, self.num_pages + 1) if self._refcount[p] == 0}
        if zero != set(free):
            raise CacheInvariantError(
                f"free list and zero counts disagree: {sorted(zero ^ set(free))[:8]}"
            )
        if any(c < 0 for c in self._refcount) or self._refcount[PADDING_PAGE] != 0:
            raise CacheInvariantError("negative reference count or padding page allocated")

    def reset(self) -> None:
        """Return every page to the free list (all holders must have been dropped first)."""
        self._refcount = [0] * (self.num_pages + 1)
        self._free = list(range(self.num_pages, 0, -1))


def pages_to_slots(pages: list[int], page_size: int, end: int, start: int = 0) -> list[int]:
    """KV slot ids of token positions `[start, end)` of a sequence stored in `pages` (in order)."""
    if page_size == 1:
        return pages[start:end]
    return [pages[i // page_size] * page_size + i % page_size for i in range(start, end)]


def pages_for_tokens(num_tokens: int, page_size: int) -> int:
    """Pages needed to hold `num_tokens` tokens."""
    return -(-num_tokens // page_size)
