"""The prefix-cache interface shared by the radix cache and the no-op cache.

The scheduler drives a request's life through it:
  match_prefix -> lock(last_node) -> [extend; cache_unfinished ...] -> cache_finished
and the simulator and tests drive the same calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from radixkv.mem.allocator import PageAllocator
from radixkv.mem.seq_pages import SeqPages

Namespace = Any
"""Isolates prefixes: equal tokens under different namespaces never share (LoRA id, cache salt)."""


@dataclass(frozen=True, slots=True)
class MatchResult:
    """Longest cached prefix of a key: its page ids, length in tokens, and the deepest node.

    With a host tier, `host_tokens` more tokens of the key continue the match one tier down
    (`load_back` brings them to the device)."""

    pages: list[int]
    num_tokens: int
    last_node: Any
    host_tokens: int = 0


class PrefixCache(ABC):
    """Maps token prefixes to KV pages; owns one allocator reference per cached page."""

    allocator: PageAllocator
    page_size: int

    stats_evicted_tokens: int
    """Tokens evicted since the cache was created."""

    @abstractmethod
    def match_prefix(
        self, key: Sequence[int], namespace: Namespace = None, *, record_hit: bool = True
    ) -> MatchResult:
        """Longest cached prefix of `key` (page-aligned).

        With `record_hit` (a request will use the prefix) the path's access times and hit counts
        are updated; without it the call is a peek that changes no statistic (it may still split
        an edge where the match ends).
        """

    @abstractmethod
    def insert(self, key: Sequence[int], pages: Sequence[int], namespace: Namespace = None) -> int:
        """Cache `key` stored in `pages` (page-aligned prefix of it); returns tokens already cached.

        The tree takes its own reference on the pages it adopts; the caller keeps (and later
        drops) its own references, so pages duplicating cached ones are freed when it does.
        """

    @abstractmethod
    def lock(self, node: Any) -> None:
        """Pin `node` and its ancestors: they are never evicted while locked."""

    @abstractmethod
    def unlock(self, node: Any) -> None:
        """Undo one `lock(node)`."""

    def load_back(self, match: MatchResult, key: Sequence[int], namespace: Namespace = None) -> MatchResult:
        """Bring the host-resident continuation of `match` onto the device as far as device pages
        allow; returns the new (device) match. Without a host tier: `match` itself."""
        return match

    @abstractmethod
    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` tokens of unlocked leaves if possible; returns tokens freed."""

    @property
    @abstractmethod
    def evictable_tokens(self) -> int:
        """Cached tokens in unlocked nodes (freed by enough eviction)."""

    @property
    @abstractmethod
    def protected_tokens(self) -> int:
        """Cached tokens in locked nodes (in use by running requests)."""

    @property
    def total_tokens(self) -> int:
        """All tokens held by the cache."""
        return self.evictable_tokens + self.protected_tokens

    @abstractmethod
    def cached_pages(self) -> set[int]:
        """Every page the cache holds a reference on."""

    @abstractmethod
    def reset(self) -> None:
        """Drop everything cached (nothing may be locked)."""

    @abstractmethod
    def check_invariants(self, inflight_pages: int | None = None) -> None:
        """Raise `CacheInvariantError` unless the cache and allocator are consistent.

        With `inflight_pages` (pages held by running requests and not by the cache), also checks
        `free + evictable + protected + inflight == total` in pages.
        """

    # -- a request's life ----------------------------------------------------------------------
    def aligned(self, num_tokens: int) -> int:
        return num_tokens - num_tokens % self.page_size

    def cache_finished(
        self, key: Sequence[int], seq: SeqPages, last_node: Any, namespace: Namespace = None
    ) -> None:
        """A request finished: cache its KV'd tokens `key`, unlock its path, drop its pages.

        `key` holds the tokens whose KV is in `seq` (prompt + output, minus the last sampled
        token, which never went through the model). Only whole pages are cached.
        """
        n = self.aligned(min(len(key), seq.num_tokens))
        self.insert(key[:n], seq.pages[: n // self.page_size], namespace)
        self.unlock(last_node)
        seq.release()

    def cache_unfinished(
        self, key: Sequence[int], seq: SeqPages, last_node: Any, namespace: Namespace = None
    ) -> MatchResult:
        """A request is mid-flight (a chunk of its prefill is done): cache what it has so far.

        The sequence switches to the tree's copies of any pages that were already cached, and
        its lock moves from `last_node` to the new deepest node. Returns the new match.
        """
        n = self.aligned(min(len(key), seq.num_tokens))
        self.insert(key[:n], seq.pages[: n // self.page_size], namespace)
        match = self.match_prefix(key[:n], namespace, record_hit=False)  # its own insert, no hit
        seq.replace_prefix(match.pages)
        self.lock(match.last_node)
        self.unlock(last_node)
        return match
