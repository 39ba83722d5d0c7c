"""The prefix-cache interface: what the scheduler asks of the cache manager (`RadixCache`, with
whatever tiers it composes) and of the no-op cache (`NoCache`, `--disable-radix-cache`).

The scheduler drives a request's admission through it, walking the tree once per step:

    peek(key)       longest cached prefix; changes nothing (the scheduling policy's look)
    load_back(m)    (tiered) bring the host-resident continuation onto the device
    settle(m)       end the match on a node boundary (splits the edge it ends inside)
    lock(node)      pin the path while the request reads it
    record_use(m)   the request is admitted: the path's access times and hit counts
    [extend; cache_unfinished ...] -> cache_finished

`match_prefix(key)` is peek + settle + record_use in one call, for simulators and tests.

Everything else the scheduler asks is a method here too, answering empty (or None, or 0) where
a tier is absent: storage reads (`reads_storage`, `prefetch`, `install`, `cancel_prefetch`),
statistics (`host_stats`, `storage_stats`), KV events (`record_events`, `take_events`), miss
attribution (`track_evicted`), and `persist` / `close` at shutdown.

Retention. A request may carry a `radixkv.retention.Retention` (a client's hint of how long to
keep its prefixes); `cache_unfinished` / `cache_finished` then `retain` the path they cached, so
eviction takes those nodes only when nothing unretained is left. A request without one pays one
`if`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from radixkv.mem.allocator import PageAllocator
from radixkv.mem.seq_pages import SeqPages

from radixkv.mem.cache_events import CacheEvent, CacheEventLog
from radixkv.mem.miss_causes import GhostIndex
from radixkv.mem.storage_tier import Prefetch

if TYPE_CHECKING:
    from radixkv.retention import Retention

Namespace = Any
"""Isolates prefixes: equal tokens under different namespaces never share (LoRA id, cache salt)."""


@dataclass(frozen=True, slots=True)
class MatchResult:
    """Longest cached prefix of a key: its page ids, its length in tokens, and the node where it
    ends (inside that node's edge, unless `settle`d).

    With a host tier, `host_tokens` more tokens of the key continue the match one tier down
    (`load_back` brings them to the device); with a storage tier, `storage_tokens` more continue
    it in storage (a prefetch brings them to the host). Of a `load_back`'s result, `from_storage`
    is how many of the tokens it loaded a prefetch had brought from storage. `key`, `namespace`
    and `epoch` (the tree's removal count when it was matched) let `settle` notice a match that
    went stale and redo it."""

    pages: list[int]
    num_tokens: int
    last_node: Any
    host_tokens: int = 0
    key: tuple = ()
    namespace: Namespace = None
    epoch: int = 0
    storage_tokens: int = 0
    from_storage: int = 0


@dataclass(frozen=True, slots=True)
class InsertResult:
    """What `insert_path` did: tokens of the key that were already cached, and the key's path,
    now all on the device (its pages, and the node ending exactly at the key's end)."""

    cached_tokens: int
    match: MatchResult


class PrefixCache(ABC):
    """Maps token prefixes to KV pages; owns one allocator reference per cached page."""

    allocator: PageAllocator
    page_size: int

    stats_evicted_tokens: int
    """Tokens evicted since the cache was created."""

    root: Any = None
    """The radix tree's root node; None for a cache without a tree."""
    ghosts: GhostIndex | None = None
    """Names of pages that left the cache's last tier, once `track_evicted` was called."""

    # -- lookup --------------------------------------------------------------------------------
    @abstractmethod
    def peek(self, key: Sequence[int], namespace: Namespace = None) -> MatchResult:
        """Longest cached prefix of `key` (page-aligned). Changes nothing: no edge is split and
        no statistic moves, so a scheduling policy may look as often as it likes."""

    def settle(self, match: MatchResult) -> MatchResult:
        """`match` ending on a node boundary, splitting the edge it ends inside; re-matched
        first if what the key matches changed since it was made. What a request locks."""
        return match

    def record_use(self, match: MatchResult) -> None:
        """A request uses the settled `match`: the path's access times and hit counts move."""

    def continuation(self, key: Sequence[int], namespace: Namespace = None, limit: int = 8) -> list[int]:
        """Tokens cached right after the whole of `key` (see `RadixCache.continuation`); none by default."""
        return []

    def match_prefix(self, key: Sequence[int], namespace: Namespace = None, *,
                     record_hit: bool = True) -> MatchResult:
        """`peek`, then `settle`; with `record_hit` (a request will use the prefix) also
        `record_use`. Without it the call changes no statistic (it may split an edge)."""
        match = self.settle(self.peek(key, namespace))
        if record_hit:
            self.record_use(match)
        return match

    def load_back(self, match: MatchResult, key: Sequence[int] | None = None,
                  namespace: Namespace = None) -> MatchResult:
        """Bring the host-resident continuation of `match` onto the device as far as device pages
        allow; returns the new (device) match. Without a host tier: `match` itself."""
        return match

    # -- mutation ------------------------------------------------------------------------------
    @abstractmethod
    def insert_path(self, key: Sequence[int], pages: Sequence[int], namespace: Namespace = None) -> InsertResult:
        """Cache `key` stored in `pages` (page-aligned prefix of it); see `insert`. Returns what
        was cached already and the key's whole path (so the caller need not match it again)."""

    def insert(self, key: Sequence[int], pages: Sequence[int], namespace: Namespace = None) -> int:
        """Cache `key` stored in `pages` (page-aligned prefix of it); returns tokens already cached.

        The tree takes its own reference on the pages it adopts; the caller keeps (and later
        drops) its own references, so pages duplicating cached ones are freed when it does.
        """
        return self.insert_path(key, pages, namespace).cached_tokens

    def retain(self, match: MatchResult, retention: Retention) -> None:
        """Keep the path of `match` (settled: it ends on a node; what was just cached) as long as
        `retention` asks, from now on the cache's clock: for each span, the nodes of its
        page-aligned part get `retain_until = max(retain_until, now + seconds)` (an edge the
        aligned span end falls inside is split there). Tokens past the last whole page of a span
        are not retained. Without a tree (the no-op cache): nothing."""

    @abstractmethod
    def lock(self, node: Any) -> None:
        """Pin `node` and its ancestors: they are never evicted while locked."""

    @abstractmethod
    def unlock(self, node: Any) -> None:
        """Undo one `lock(node)`."""

    @abstractmethod
    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` tokens of unlocked leaves if possible; returns tokens freed."""

    # -- sizes and checks ----------------------------------------------------------------------
    @property
    @abstractmethod
    def evictable_tokens(self) -> int:
        """Cached tokens in unlocked nodes (freed by enough eviction)."""

    @property
    @abstractmethod
    def protected_tokens(self) -> int:
        """Cached tokens in locked nodes (in use by running requests)."""

    @property
    def retained_tokens(self) -> int:
        """Cached device tokens whose retention deadline is still ahead."""
        return 0

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

    # -- tiers, events and statistics (empty where a tier is absent) --------------------------------
    tiers: Any = None
    """The `radixkv.mem.tier_controller.TierController` moving pages between the tiers below the
    device pool; None without lower tiers. The methods below answer through it."""
    events: CacheEventLog | None = None
    """Records page changes for KV events, once `record_events` was called."""

    @property
    def reads_storage(self) -> bool:
        """Whether a storage tier under the cache can be read ahead of admission (`prefetch`)."""
        return self.tiers is not None and self.tiers.storage is not None

    def prefetch(self, match: MatchResult) -> Prefetch | None:
        """Start reading `match`'s storage continuation (a peek's `storage_tokens`); None if none."""
        return self.tiers.stored.prefetch(match) if self.reads_storage else None

    def install(self, prefetch: Prefetch) -> int:
        """Put what `prefetch` has brought so far into the host tier; tokens installed."""
        return self.tiers.stored.install(prefetch)

    def cancel_prefetch(self, prefetch: Prefetch) -> None:
        """The request `prefetch` read for left the queue: its read is dropped."""
        self.tiers.stored.cancel_prefetch(prefetch)

    def load_from_storage(self, match: MatchResult) -> MatchResult:
        """`prefetch` and `install` at once, waiting for the read (simulators); the new peek."""
        return self.tiers.stored.load_from_storage(match) if self.reads_storage else match

    def record_events(self) -> None:
        """From now on, record every change to which pages the cache holds (KV events)."""
        self.events = CacheEventLog(self.page_size)

    def take_events(self) -> list[CacheEvent]:
        """The events recorded since the last call, oldest first (none when not recording)."""
        return self.events.take() if self.events is not None else []

    def track_evicted(self) -> None:
        """From now on, remember the pages that leave the cache (`ghosts`, for miss causes)."""
        self.ghosts = GhostIndex()

    def host_stats(self) -> dict[str, Any]:
        """The host tier's sizes and counters (tokens); `host_total_tokens: 0` without one."""
        return {"host_total_tokens": 0} if self.tiers is None else self.tiers.host_stats()

    def storage_stats(self) -> dict[str, Any]:
        """The storage tier's sizes and counters; `storage_enabled: False` without one."""
        return self.tiers.stored.stats() if self.reads_storage else {"storage_enabled": False}

    @property
    def stats_host_loaded_tokens(self) -> int:
        """Tokens loaded back from the host tier for requests."""
        return 0 if self.tiers is None else self.tiers.host_loaded_tokens

    @property
    def stats_host_evicted_tokens(self) -> int:
        """Tokens the host tier let go."""
        return 0 if self.tiers is None else self.tiers.host_evicted_tokens

    @property
    def stats_storage_loaded_tokens(self) -> int:
        """Tokens installed from storage into the host tier."""
        return self.tiers.stored.loaded_tokens if self.reads_storage else 0

    @property
    def stats_storage_hit_tokens(self) -> int:
        """Of those, tokens a request loaded on to the device."""
        return 0 if self.tiers is None else self.tiers.storage_hit_tokens

    def persist(self) -> int:
        """Write what the device and host tiers hold to storage; pages queued (0 without one)."""
        return self.tiers.stored.persist()[0] if self.reads_storage else 0

    def close(self) -> None:
        """At shutdown: persist, then stop the storage tier's threads (nothing without one)."""
        if self.reads_storage:
            self.tiers.stored.close()

    # -- a request's life ----------------------------------------------------------------------
    def aligned(self, num_tokens: int) -> int:
        return num_tokens - num_tokens % self.page_size

    def cache_finished(
        self, key: Sequence[int], seq: SeqPages, last_node: Any, namespace: Namespace = None,
        retention: Retention | None = None,
    ) -> MatchResult:
        """A request finished: cache its KV'd tokens `key`, unlock its path, drop its pages;
        returns the cached path (ending on the node its last whole page ends in).

        `key` holds the tokens whose KV is in `seq` (prompt + output, minus the last sampled
        token, which never went through the model). Only whole pages are cached; with a
        `retention`, the cached path is retained as it asks (see `retain`).
        """
        n = self.aligned(min(len(key), seq.num_tokens))
        inserted = self.insert_path(key[:n], seq.pages[: n // self.page_size], namespace)
        if retention is not None:
            self.retain(inserted.match, retention)
        self.unlock(last_node)
        seq.release()
        return inserted.match

    def cache_unfinished(
        self, key: Sequence[int], seq: SeqPages, last_node: Any, namespace: Namespace = None,
        retention: Retention | None = None,
    ) -> MatchResult:
        """A request is mid-flight (a chunk of its prefill is done): cache what it has so far
        (retained as `retention` asks, if given).

        The sequence switches to the tree's copies of any pages that were already cached, and
        its lock moves from `last_node` to the new deepest node. Returns the new match.
        """
        n = self.aligned(min(len(key), seq.num_tokens))
        match = self.insert_path(key[:n], seq.pages[: n // self.page_size], namespace).match
        if retention is not None:
            self.retain(match, retention)
        seq.replace_prefix(match.pages)
        self.lock(match.last_node)
        self.unlock(last_node)
        return match

    def serve_and_cache(self, key: Sequence[int], match: MatchResult, retention: Retention | None = None) -> bool:
        """What a server does with a request whose prefix `match` is cached, for simulators: lock
        it, take pages for the rest (evicting if needed), "compute", and cache the whole prompt
        (retained as `retention` asks). False when the prompt is larger than everything the
        pool can free (served, not cached)."""
        allocator = self.allocator
        self.lock(match.last_node)
        seq = SeqPages.from_prefix(allocator, match.pages, match.num_tokens)
        need = seq.pages_needed(len(key) - match.num_tokens)
        if allocator.free_pages < need:
            self.evict((need - allocator.free_pages) * self.page_size)
        if allocator.free_pages < need:
            self.unlock(match.last_node)
            seq.release()
            return False
        seq.extend(len(key) - match.num_tokens)
        self.cache_finished(key, seq, match.last_node, retention=retention)
        return True
