"""The pages one sequence reads, with copy-on-write for partly filled shared pages.

A running request's KV is assembled from a cached prefix (pages shared with the radix tree and
with other requests) plus pages it allocates as it grows. `SeqPages` holds one allocator
reference on each page it lists. Shared pages are never written: before appending into a partly
filled last page that someone else also holds (e.g. after `fork`), that page is copied to a
private one (copy-on-write). Full pages are immutable and are shared freely.
"""

from __future__ import annotations

from collections.abc import Callable

from radixkv.mem.allocator import PageAllocator, pages_for_tokens, pages_to_slots

CopyPage = Callable[[int, int], None]
"""copy_page(src_page, dst_page): copies the KV data of one page in every layer."""


class SeqPages:
    """Ordered page ids covering `num_tokens` tokens of one sequence, one reference each."""

    __slots__ = ("allocator", "page_size", "pages", "num_tokens", "_copy_page")

    def __init__(self, allocator: PageAllocator, copy_page: CopyPage | None = None):
        self.allocator = allocator
        self.page_size = allocator.page_size
        self.pages: list[int] = []
        self.num_tokens = 0
        self._copy_page = copy_page

    @classmethod
    def from_prefix(
        cls,
        allocator: PageAllocator,
        pages: list[int],
        num_tokens: int,
        copy_page: CopyPage | None = None,
    ) -> SeqPages:
        """A sequence starting from an existing prefix; takes a reference on each of its pages."""
        if pages_for_tokens(num_tokens, allocator.page_size) != len(pages):
            raise ValueError(f"{len(pages)} page(s) cannot hold exactly {num_tokens} token(s)")
        seq = cls(allocator, copy_page)
        allocator.incref(pages)
        seq.pages = list(pages)
        seq.num_tokens = num_tokens
        return seq

    # -- growth --------------------------------------------------------------------------------
    def _last_page_is_shared_partial(self) -> bool:
        return self.num_tokens % self.page_size != 0 and self.allocator.refcount(self.pages[-1]) > 1

    def pages_needed(self, num_new_tokens: int) -> int:
        """Pages `extend(num_new_tokens)` would allocate, including a copy-on-write copy."""
        room = (-self.num_tokens) % self.page_size
        fresh = pages_for_tokens(max(0, num_new_tokens - room), self.page_size)
        return fresh + (1 if num_new_tokens > 0 and self._last_page_is_shared_partial() else 0)

    def extend(self, num_new_tokens: int) -> list[int]:
        """Make room for `num_new_tokens` more tokens; returns their KV slot ids.

        All or nothing: raises `OutOfPagesError` before changing anything if the pool is short.
        """
        if num_new_tokens < 0:
            raise ValueError(f"cannot extend by {num_new_tokens} tokens")
        if num_new_tokens == 0:
            return []
        cow = self._last_page_is_shared_partial()
        if cow and self._copy_page is None:
            raise RuntimeError("copy-on-write needed but this sequence has no copy_page callback")
        fresh = self.allocator.alloc(self.pages_needed(num_new_tokens))
        if cow:
            private = fresh.pop(0)
            self._copy_page(self.pages[-1], private)
            self.allocator.decref([self.pages[-1]])
            self.pages[-1] = private
        self.pages.extend(fresh)
        start = self.num_tokens
        self.num_tokens += num_new_tokens
        return self.slots(start, self.num_tokens)

    # -- sharing -------------------------------------------------------------------------------
    def fork(self) -> SeqPages:
        """A second sequence reading the same pages (one more reference on each)."""
        return SeqPages.from_prefix(self.allocator, self.pages, self.num_tokens, self._copy_page)

    def replace_prefix(self, pages: list[int]) -> None:
        """Read the leading `len(pages)` pages from `pages` instead (the tree's copies).

        Used after inserting into the radix tree found some pages already cached: the sequence
        switches to the cached copies and drops its duplicates.
        """
        if len(pages) > len(self.pages):
            raise ValueError("replacement prefix is longer than the sequence")
        old = self.pages[: len(pages)]
        if old == pages:
            return
        self.allocator.incref(pages)
        self.pages[: len(pages)] = pages
        self.allocator.decref(old)

    def truncate(self, num_tokens: int) -> None:
        """Keep only the first `num_tokens` tokens, releasing the pages past them."""
        if not 0 <= num_tokens <= self.num_tokens:
            raise ValueError(f"cannot truncate {self.num_tokens} tokens to {num_tokens}")
        keep = pages_for_tokens(num_tokens, self.page_size)
        dropped = self.pages[keep:]
        del self.pages[keep:]
        self.num_tokens = num_tokens
        self.allocator.decref(dropped)

    def release(self) -> None:
        """Drop every reference; the sequence is empty afterwards."""
        self.truncate(0)

    # -- addressing ----------------------------------------------------------------------------
    def slots(self, start: int = 0, end: int | None = None) -> list[int]:
        """KV slot ids of token positions `[start, end)`."""
        end = self.num_tokens if end is None else end
        if not 0 <= start <= end <= self.num_tokens:
            raise ValueError(f"positions [{start}, {end}) outside 0..{self.num_tokens}")
        return pages_to_slots(self.pages, self.page_size, end, start)
