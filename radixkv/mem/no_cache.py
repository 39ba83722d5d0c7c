"""The no-op prefix cache behind `--disable-radix-cache`: nothing is ever shared or kept.

Same interface as `RadixCache`, so the scheduler has one code path; every request computes its
whole prompt and its pages are freed as soon as it finishes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from radixkv.errors import CacheInvariantError
from radixkv.mem.allocator import PageAllocator
from radixkv.mem.base import InsertResult, MatchResult, Namespace, PrefixCache


class NoCache(PrefixCache):
    """Caches nothing: every match is empty, every insert is a no-op, nothing is retained."""

    def __init__(self, allocator: PageAllocator, eviction_policy: Any = None, attention_scale: Any = None,
                 clock: Any = None):
        self.allocator = allocator
        self.page_size = allocator.page_size
        self.stats_evicted_tokens = 0

    def peek(self, key: Sequence[int], namespace: Namespace = None) -> MatchResult:
        return MatchResult([], 0, None, namespace=namespace)

    def insert_path(self, key: Sequence[int], pages: Sequence[int], namespace: Namespace = None) -> InsertResult:
        return InsertResult(0, MatchResult([], 0, None, namespace=namespace))

    def lock(self, node: Any) -> None:
        pass

    def unlock(self, node: Any) -> None:
        pass

    def evict(self, num_tokens: int) -> int:
        return 0

    @property
    def evictable_tokens(self) -> int:
        return 0

    @property
    def protected_tokens(self) -> int:
        return 0

    def cached_pages(self) -> set[int]:
        return set()

    def reset(self) -> None:
        pass

    def check_invariants(self, inflight_pages: int | None = None) -> None:
        self.allocator.check_invariants()
        if inflight_pages is not None and (
            self.allocator.free_pages + inflight_pages != self.allocator.num_pages
        ):
            raise CacheInvariantError(
                f"free {self.allocator.free_pages} + in-flight {inflight_pages} pages != "
                f"pool of {self.allocator.num_pages}"
            )
