"""StorageTieredCache: the host-tiered radix tree with a storage tier below the host tier.

Tiers, top down: device pool, host tier, storage (`radixkv.mem.storage_tier`). The tree holds
device-resident and host-only nodes as in `HostTieredCache`; stored pages are not in the tree.
They are found by key: every page's key is a hash chain over its prefix's tokens
(`radixkv.mem.page_keys`), computed once per node (`storage_keys`, split with the node).

What moves:
- *write-back*: a host-only node the host LRU lets go is written to storage first (its pages,
  one run); `write-through-selective`: a node is written once it has been hit
  `hit_threshold` times, from whichever tier holds it, before any eviction.
- *peek* reports how far the key continues in storage after the device and host parts
  (`storage_tokens`), hashing only as far as storage holds the pages.
- *prefetch* starts reading that continuation (`Prefetch`), and *install* puts the pages that
  have arrived into host pages, as a host-only node continuing the request's path. From there
  `load_back` brings them to the device as it does any host continuation, and reports how many
  of the tokens it loaded came from storage (`MatchResult.from_storage`).

`reset` (flush_cache) empties the device and host tiers, not storage: stored pages are only
ever dropped by storage's own LRU or a failed check. `persist` (a clean shutdown) writes what
the device and host tiers hold, so a restart finds it.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from radixkv.mem.allocator import PageAllocator
from radixkv.mem.base import MatchResult, Namespace
from radixkv.mem.cache_events import CPU
from radixkv.mem.eviction import EvictionPolicy
from radixkv.mem.host_tier import HostTier
from radixkv.mem.page_keys import chain, root_key
from radixkv.mem.storage_tier import Fetch, StorageTier
from radixkv.mem.tiered_cache import HostTieredCache
from radixkv.mem.tree_node import StorageNode


@dataclass(slots=True)
class Prefetch:
    """A read from storage for one request: the pages continuing `key` from token `start`."""

    fetch: Fetch
    key: tuple
    namespace: Namespace
    start: int

    @property
    def tokens(self) -> int:
        return len(self.fetch.keys)


class StorageTieredCache(HostTieredCache):
    """A `HostTieredCache` over a `storage` tier (see the module docstring); `identity` seeds the
    page keys (`radixkv.mem.page_keys.storage_identity`)."""

    node_type = StorageNode

    def __init__(self, allocator: PageAllocator, eviction_policy: str | EvictionPolicy = "lru",
                 attention_scale: float | None = None, host_tier: HostTier | None = None,
                 storage: StorageTier | None = None, identity: bytes = b"",
                 clock: Callable[[], float] = time.monotonic):
        if storage is None:
            raise ValueError("StorageTieredCache needs a storage tier (use HostTieredCache without one)")
        if storage.page_size != allocator.page_size:
            raise ValueError(f"storage page_size {storage.page_size} != cache page_size {allocator.page_size}")
        self.storage = storage
        self.identity = identity
        self._roots: dict[Any, bytes] = {}
        super().__init__(allocator, eviction_policy, attention_scale, host_tier, clock)
        storage.on_evict = self._storage_evicted

    def _storage_evicted(self, keys: list[bytes]) -> None:
        """Pages storage let go left the last tier: the ghost index (miss causes) remembers them
        by their storage keys. (Called on storage's writer thread; the index has its own lock.)"""
        if self.ghosts is not None:
            self.ghosts.add(keys)

    def reset_stats(self) -> None:
        super().reset_stats()
        self.stats_storage_loaded_tokens = 0  # storage -> host, installed for requests
        self.stats_storage_hit_tokens = 0  # of those, loaded on to the device by a request

    # -- keys ----------------------------------------------------------------------------------
    def _root_key(self, namespace: Namespace) -> bytes:
        key = self._roots.get(namespace)
        if key is None:
            key = self._roots[namespace] = root_key(self.identity, namespace)
        return key

    def keys_of(self, node: StorageNode) -> list[bytes]:
        """The storage keys of `node`'s pages (computed down from the nearest node that has them)."""
        path = []
        while node.storage_keys is None:
            path.append(node)
            node = node.parent
            if node is self.root:
                break
        for child in reversed(path):
            parent = child.parent
            prev = self._root_key(child.child_key[0]) if parent is self.root else parent.storage_keys[-1]
            child.storage_keys = list(chain(prev, child.key, self.page_size))
        return (path[0] if path else node).storage_keys

    def _key_before(self, key: tuple, end: int, namespace: Namespace) -> bytes | None:
        """The key of the page that ends `end` tokens into `key` (the root's key at 0), from the
        tree's path; None if the tree does not hold that far."""
        if end == 0:
            return self._root_key(namespace)
        for child, n in self._walk(key, namespace):
            if child.depth < end <= child.depth + n:
                return self.keys_of(child)[(end - child.depth) // self.page_size - 1]
        return None

    def storage_chain(self, key: Sequence[int], start: int, namespace: Namespace = None):
        """The storage keys of `key`'s whole pages from token `start` on (a page boundary the
        tree holds), computed lazily; empty if the tree does not hold `key` that far."""
        prev = self._key_before(tuple(key), start, namespace)
        if prev is None:
            return iter(())
        return chain(prev, key[start:len(key) // self.page_size * self.page_size], self.page_size)

    # -- lookup --------------------------------------------------------------------------------
    def peek(self, key: Sequence[int], namespace: Namespace = None) -> MatchResult:
        match = super().peek(key, namespace)
        storage = self.storage
        end = match.num_tokens + match.host_tokens
        if not storage.stored_pages or not storage.enabled or end >= len(match.key):
            return match
        prev = self._key_before(match.key, end, namespace)
        if prev is None or not storage.holds(next(chain(prev, match.key[end:end + self.page_size],
                                                       self.page_size))):
            return match
        held = storage.held_run(chain(prev, match.key[end:], self.page_size))
        return replace(match, storage_tokens=held * self.page_size)

    def prefetch(self, match: MatchResult) -> Prefetch | None:
        """Start reading `match`'s storage continuation (a peek's `storage_tokens`); None if it has none."""
        if not match.storage_tokens:
            return None
        start = match.num_tokens + match.host_tokens
        prev = self._key_before(match.key, start, match.namespace)
        if prev is None:
            return None
        pages = match.storage_tokens // self.page_size
        keys = list(itertools.islice(chain(prev, match.key[start:], self.page_size), pages))
        return Prefetch(self.storage.fetch(keys), match.key, match.namespace, start)

    def install(self, prefetch: Prefetch) -> int:
        """Put the pages of `prefetch` that have arrived into the host tier, continuing the
        request's path in the tree; returns the tokens installed. Pages the tree has gained
        since are skipped; a path that lost its prefix since takes none."""
        fetch, size = prefetch.fetch, self.page_size
        arrived = fetch.arrived  # (the reader may add more meanwhile: these are what we use)
        installed = 0
        if arrived:
            installed = self._install(prefetch, arrived)
        self.storage.finished(fetch, installed // size)
        fetch.cancel()  # whatever is still to come is not used
        return installed

    def _install(self, prefetch: Prefetch, arrived: int) -> int:
        size, key = self.page_size, prefetch.key
        match = self.settle(self.peek(key, prefetch.namespace))
        end = match.num_tokens + match.host_tokens
        if end < prefetch.start:
            return 0  # the prefix it continues is no longer held
        skip = (end - prefetch.start) // size
        if skip >= arrived:
            return 0
        path = self._host_path(match)
        parent = path[-1] if path else match.last_node
        assert parent.end == end, (parent.end, end)
        for node in path:  # making host room must not drop the path we attach to
            self._pinned.add(node.id)
            if node.host_candidate is not None:
                self._drop_host_candidate(node)
        try:
            host_pages = self._host_alloc(arrived - skip)
        finally:
            for node in path:
                self._pinned.discard(node.id)
                if not node.children and node.host_candidate is None:
                    self._add_host_candidate(node)
        if not host_pages:
            return 0
        n = len(host_pages)
        pages = prefetch.fetch.pages[skip:skip + n]
        if pages[0] is not None:  # the bytes (a tier that keeps none reads None)
            try:
                self.host.put_pages(host_pages, pages)
            except BaseException:
                self.host.allocator.decref(host_pages)  # the copy failed: nothing was installed
                raise
        now = self._tick()
        ck = self._child_key(parent, key, end, prefetch.namespace)
        assert ck not in parent.children, "a continuation the walk would have matched"
        leaf = self.node_type(key[end:end + n * size], [], parent, now)
        leaf.host_pages, leaf.from_storage = host_pages, True
        leaf.storage_keys = prefetch.fetch.keys[skip:skip + n]
        leaf.child_key = ck
        self.epoch += 1  # keys through here now match further (on the host)
        if parent.host_candidate is not None:
            self._drop_host_candidate(parent)
        parent.children[ck] = leaf
        self.policy.on_access(leaf, now, False)
        self._add_host_candidate(leaf)
        if self.events is not None:
            self.events.stored(leaf, CPU)
        self.stats_storage_loaded_tokens += n * size
        return n * size

    def _host_alloc(self, need: int) -> list[int]:
        """Up to `need` host pages, making room by the host LRU, then by dropping the host
        copies of device-resident nodes (least recently used first: the device keeps the KV,
        a later eviction copies it again)."""
        host = self.host
        if not self._make_host_room(need):
            copies = sorted((n for n in self.nodes() if n.on_device and n.host_pages is not None),
                            key=lambda n: n.last_access)
            for node in copies:
                if host.allocator.free_pages >= need:
                    break
                if self.events is not None:
                    self.events.removed(node, CPU)
                host.allocator.decref(node.host_pages)
                node.host_pages = None
        take = min(need, host.allocator.free_pages)
        return host.allocator.alloc(take) if take else []

    def load_from_storage(self, match: MatchResult) -> MatchResult:
        """Fetch and install `match`'s storage continuation at once (the simulator's prefetch,
        which waits for it); the new peek."""
        prefetch = self.prefetch(match)
        if prefetch is None:
            return match
        while not prefetch.fetch.done:
            time.sleep(0.0005)
        self.install(prefetch)
        return self.peek(match.key, match.namespace)

    def load_back(self, match: MatchResult, key: Sequence[int] | None = None,
                  namespace: Namespace = None) -> MatchResult:
        before = self.stats_storage_hit_tokens
        loaded = super().load_back(match, key, namespace)
        return replace(loaded, from_storage=self.stats_storage_hit_tokens - before)

    def persist(self) -> int:
        """Write every cached prefix that storage does not hold yet (device or host copy),
        children first (storage's LRU then keeps a prefix
        longer than what hangs below it), so a restart finds what this process had cached (a clean shutdown calls
        this; a killed process keeps only what was written before). Returns pages queued."""
        storage, written = self.storage, 0
        if not storage.enabled:
            return 0
        for node in reversed(list(self.nodes())):  # children first: parents are then the more recent
            keys = self.keys_of(node)
            if storage.needs(keys):  # (waits for the writer rather than skip: this is the last chance)
                written += storage.write(keys, self._rows(node), wait=True)
        return written

    # -- tier hooks ----------------------------------------------------------------------------
    def _to_device(self, node: StorageNode, pages: list[int]) -> None:
        super()._to_device(node, pages)
        if node.from_storage:
            self.stats_storage_hit_tokens += len(node.key)
            node.from_storage = False

    def _split(self, child: StorageNode, n: int) -> StorageNode:
        keys = child.storage_keys
        upper = super()._split(child, n)
        upper.from_storage = child.from_storage
        if keys is not None:
            k = n // self.page_size
            upper.storage_keys, child.storage_keys = keys[:k], keys[k:]
        return upper

    def _touch(self, node: StorageNode, now: int, hit: bool) -> None:
        super()._touch(node, now, hit)
        storage = self.storage
        if hit and storage.config.write_through and node.hit_count >= storage.config.hit_threshold \
                and storage.enabled:
            keys = self.keys_of(node)
            if storage.needs(keys):
                storage.write(keys, self._rows(node))

    def _drop_host_only(self, node: StorageNode) -> None:
        if not self.storage.config.write_through:
            keys = self.keys_of(node)
            if self.storage.needs(keys):
                self.storage.write(keys, self.host.rows(node.host_pages))
        super()._drop_host_only(node)

    def _kept_below(self, node: StorageNode) -> bool:
        return not self.storage.needs(self.keys_of(node))

    def _rows(self, node: StorageNode):
        """The bytes of `node`'s pages, from the host copy if it has one, else the device."""
        return self.host.rows(node.host_pages) if node.host_pages is not None else self.host.device_rows(node.pages)

    def _describe(self, node: StorageNode) -> str:
        return super()._describe(node) + (" from-storage" if node.from_storage else "")
