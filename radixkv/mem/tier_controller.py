"""TierController: the one object that moves KV pages between the cache's tiers.

Tiers, top down: the device pool, a host tier (`host_tier.HostTier`), optionally a storage tier
(`storage_tier.StorageTier`; on disk, `disk_storage.DiskKVStorage`). The tiers own *where* bytes
go; the tree (`radix_cache.RadixCache`) knows where each node's pages are; this controller
decides *what* moves, and keeps the tree's nodes telling the truth about it.

A node is *device-resident* (`pages` set) or *host-only* (`pages == []`, its KV in `host_pages`);
a host-only node's children are host-only. Stored pages are not in the tree: they are found by
their block hash (`radixkv.mem.tree_hashes`).

What moves:
- *device -> host* (`demote`): an evicted tail is copied to host pages (unless a write-through
  copy exists) and stays in the tree as a host-only node; with no host room it is dropped.
- *host -> device* (`load_back`): a match's host continuation is copied into fresh device pages
  (evicting other device pages if it must).
- *host LRU*: when the host tier is full, the least recently used host-only leaves leave the
  tree for good; with a storage tier they are written there first (*write-back*), or, with
  `write-through-selective`, a node is written once it has been hit `hit_threshold` times.
- *storage -> host* (`prefetch`, then `install`): a read of a match's storage continuation,
  whose arrived pages become a host-only node continuing the request's path; `load_back` then
  reports how many tokens it loaded a prefetch had brought (`MatchResult.from_storage`).
- `persist` (a clean shutdown) writes what the device and host tiers hold to storage, bounded.

Events: a host copy is a store on `CPU`, a host page let go a removal there; a page copied back
a store on `GPU`; a device eviction records its host store before its device removal (a
subscriber never sees the page held nowhere). Invariants: `cache_checks.check_host_tier`.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import replace
from typing import Any

from radixkv.mem.base import MatchResult
from radixkv.mem.cache_events import CPU, GPU
from radixkv.mem.host_lru import HostLRU
from radixkv.mem.host_tier import HostTier
from radixkv.mem.storage_tier import Prefetch, StorageTier
from radixkv.mem.tree_hashes import TreeHashes
from radixkv.mem.tree_node import TreeNode

logger = logging.getLogger(__name__)


class TierController:
    """Moves pages between `cache`'s device pool, `host` and `storage` (the module docstring)."""

    def __init__(self, cache: Any, host: HostTier, storage: StorageTier | None = None):
        page_size = cache.page_size
        if host.page_size != page_size:
            raise ValueError(f"host tier page_size {host.page_size} != cache page_size {page_size}")
        if storage is not None and storage.page_size != page_size:
            raise ValueError(f"storage page_size {storage.page_size} != cache page_size {page_size}")
        self.cache, self.host, self.storage = cache, host, storage
        self.page_size = page_size
        self.keys = TreeHashes(page_size)
        self.lru = HostLRU()
        self.host_loaded_tokens = 0  # host -> device, for requests
        self.host_evicted_tokens = 0  # dropped from the host tier
        self.storage_loaded_tokens = 0  # storage -> host, installed for requests
        self.storage_hit_tokens = 0  # of those, loaded on to the device by a request
        if storage is not None:
            storage.on_evict = self._storage_evicted

    def reset(self) -> None:
        """The tree was emptied: so is the host LRU."""
        self.lru = HostLRU()

    def _storage_evicted(self, keys: list[bytes]) -> None:
        """Pages storage let go left the last tier: the ghost index (miss causes) remembers them
        by their storage keys. (Called on storage's writer thread; the index has its own lock.)"""
        if self.cache.ghosts is not None:
            self.cache.ghosts.add(keys)

    # -- the tree's hooks ------------------------------------------------------------------------
    def cached(self, leaf: TreeNode) -> None:
        """A new leaf was inserted (write-through copies it to the host at once)."""
        if self.host.write_through:
            leaf.host_pages = self._host_save(leaf.pages)
            if leaf.host_pages is not None and self.cache.events is not None:
                self.cache.events.stored(leaf, CPU)

    def adopt(self, node: TreeNode, pages: list[int]) -> None:
        """`node` (not on the device) takes the caller's `pages` for its edge."""
        self.cache.allocator.incref(pages)
        self.to_device(node, pages)

    def touched(self, node: TreeNode, hit: bool) -> None:
        """A match or insert went through `node`."""
        if node.host_candidate is not None:
            self.lru.touch(node)
        storage = self.storage
        if storage is not None and hit and storage.config.write_through \
                and node.hit_count >= storage.config.hit_threshold and storage.enabled:
            keys = self.keys.of(node)
            if storage.needs(keys):
                storage.write(keys, self._rows(node))

    def release(self, node: TreeNode) -> None:
        """`node` leaves the tree for good: its host pages go too. (No event: a device leaf is
        deleted only without a host copy, and a reset clears all.)"""
        if node.host_pages is not None:
            self.host.allocator.decref(node.host_pages)

    def describe(self, node: TreeNode) -> str:
        return ("" if node.host_pages is None else f" host={node.host_pages[:4]}") + \
            (" from-storage" if node.from_storage else "")

    # -- device <-> host -------------------------------------------------------------------------
    def demote(self, node: TreeNode, keep: int) -> None:
        """Move the evicted leaf `node`'s tokens past `keep` to the host tier (or drop them when
        it is full)."""
        cache = self.cache
        if keep:
            cache.split(node, keep)  # `node` is now the tail below a device-resident upper part
        if node.host_pages is None:
            node.host_pages = self._host_save(node.pages)
            if node.host_pages is not None and cache.events is not None:
                cache.events.stored(node, CPU)
        if node.host_pages is None:  # no room one tier down: forget the tail and what hangs below
            self._drop_host_subtree(node)
            cache.delete_leaf(node)
            return
        if cache.events is not None:
            cache.events.removed(node, GPU)
        cache._evictable_tokens -= len(node.key)
        cache.allocator.decref(node.pages)
        node.pages = []
        if not node.children:
            self.lru.add(node)
        parent = node.parent
        if parent is not cache.root and parent.lock_ref == 0 and cache.is_device_leaf(parent):
            cache.candidates.add(parent)

    def load_back(self, match: MatchResult) -> MatchResult:
        """Bring `match`'s host continuation onto the device as far as device pages allow."""
        cache = self.cache
        allocator = cache.allocator
        before = self.storage_hit_tokens
        match = cache.settle(match)
        path = cache.host_path(match)
        for node in path:  # making room on either tier must not drop what we are loading
            self.lru.pin(node)
        cache.lock(match.last_node)  # what is already on the device stays there while we load
        locked, pos, pages = match.last_node, match.num_tokens, list(match.pages)
        try:
            for child in path:
                need = len(child.host_pages)
                if allocator.free_pages < need:
                    cache.evict((need - allocator.free_pages) * self.page_size)
                if allocator.free_pages < need:
                    break  # the device is full of locked pages: the rest is recomputed
                fresh = allocator.alloc(need)
                try:
                    self.host.load(child.host_pages, fresh)
                except BaseException:
                    allocator.decref(fresh)  # the copy failed: the pages go back, the node stays on the host
                    raise
                self.to_device(child, fresh)
                self.host_loaded_tokens += len(child.key)
                cache.lock(child)
                cache.unlock(locked)
                locked, pos = child, pos + len(child.key)
                pages.extend(fresh)
        finally:
            cache.unlock(locked)
            for node in path:
                self.lru.unpin(node)
        host_left = match.num_tokens + match.host_tokens - pos
        return replace(match, pages=pages, num_tokens=pos, last_node=locked, host_tokens=host_left,
                       epoch=cache.epoch, from_storage=self.storage_hit_tokens - before)

    def to_device(self, node: TreeNode, pages: list[int]) -> None:
        """A host-only node gets device `pages` (the tree's references already taken)."""
        cache = self.cache
        assert not node.on_device and (node.parent.on_device or node.parent is cache.root)
        cache.epoch += 1  # what peeks saw on the host is on the device now
        node.pages = pages
        if cache.events is not None:
            cache.events.stored(node, GPU)
        if node.host_candidate is not None:
            self.lru.drop(node)
        parent = node.parent
        if parent.candidate is not None:  # it now has a device-resident child
            cache.candidates.drop(parent)
        if node.lock_ref == 0:
            cache._evictable_tokens += len(node.key)
            cache.candidates.add(node)
        else:
            cache._protected_tokens += len(node.key)
        if node.from_storage:
            self.storage_hit_tokens += len(node.key)
            node.from_storage = False

    # -- the host tier's room ------------------------------------------------------------------
    def _host_save(self, device_pages: list[int]) -> list[int] | None:
        """Host copies of `device_pages`, making room by the host LRU; None if it cannot."""
        need = len(device_pages)
        if not self._make_host_room(need):
            return None
        host_pages = self.host.allocator.alloc(need)
        self.host.save(device_pages, host_pages)
        return host_pages

    def _make_host_room(self, need: int) -> bool:
        """Drop host-only leaves (LRU) until `need` host pages are free; whether they are."""
        while self.host.allocator.free_pages < need and self.lru:
            self._drop_host_only(self.lru.pop())
        return self.host.allocator.free_pages >= need

    def _drop_host_only(self, node: TreeNode) -> None:
        """Remove a host-only leaf from the tree and the host tier (written back to storage first)."""
        assert not node.on_device and not node.children
        cache, storage = self.cache, self.storage
        keys = self.keys.of(node) if storage is not None or cache.ghosts is not None else None  # (hashed once asked)
        if storage is not None and not storage.config.write_through and storage.needs(keys):
            storage.write(keys, self.host.rows(node.host_pages))
        if cache.ghosts is not None and (storage is None or storage.needs(keys)):  # (not kept below either)
            cache.ghosts.add(keys)
        cache.epoch += 1
        parent = node.parent
        del parent.children[node.child_key]
        if cache.events is not None:
            cache.events.removed(node, CPU)
        self.host.allocator.decref(node.host_pages)
        self.host_evicted_tokens += len(node.key)
        if node.host_candidate is not None:
            self.lru.drop(node)
        if not parent.on_device and parent is not cache.root and not parent.children:
            self.lru.add(parent)  # (a device parent's candidacy ignores host-only children)

    def _drop_host_subtree(self, node: TreeNode) -> None:
        """Remove every (host-only) descendant of `node`."""
        for child in list(node.children.values()):
            self._drop_host_subtree(child)
            self._drop_host_only(child)

    def host_stats(self) -> dict[str, Any]:
        a, host = self.host.allocator, self.host
        return {"host_total_tokens": a.total_tokens, "host_used_tokens": a.total_tokens - a.free_tokens,
                "host_saved_tokens": host.saved_tokens, "host_loaded_tokens": host.loaded_tokens,
                "host_evicted_tokens": self.host_evicted_tokens}

    # -- storage -> host -----------------------------------------------------------------------
    def storage_continuation(self, match: MatchResult) -> MatchResult:
        """`match` (a peek) with how far its key goes on in storage after the device and host
        parts (`storage_tokens`), hashing only as far as storage holds the pages."""
        storage, tree = self.storage, self.cache.tree
        end = match.num_tokens + match.host_tokens
        if storage is None or not storage.stored_pages or not storage.enabled or end >= len(match.key):
            return match
        prev = self.keys.before(tree, match.key, end, match.namespace)
        if prev is None or not storage.holds(next(self.keys.after(prev, match.key[end:end + self.page_size]))):
            return match
        held = storage.held_run(self.keys.after(prev, match.key[end:]))
        return replace(match, storage_tokens=held * self.page_size)

    def prefetch(self, match: MatchResult) -> Prefetch | None:
        """Start reading `match`'s storage continuation (a peek's `storage_tokens`); None if it has none."""
        if not match.storage_tokens:
            return None
        start = match.num_tokens + match.host_tokens
        prev = self.keys.before(self.cache.tree, match.key, start, match.namespace)
        if prev is None:
            return None
        pages = match.storage_tokens // self.page_size
        keys = list(itertools.islice(self.keys.after(prev, match.key[start:]), pages))
        return Prefetch(self.storage.fetch(keys), match.key, match.namespace, start)

    def cancel_prefetch(self, prefetch: Prefetch) -> None:
        """A request dropped its read (it left the queue)."""
        prefetch.fetch.cancel()
        self.storage.finished(prefetch.fetch, 0)

    def install(self, prefetch: Prefetch) -> int:
        """Put the pages of `prefetch` that have arrived into the host tier, continuing the
        request's path in the tree; returns the tokens installed. Pages the tree has gained
        since are skipped; a path that lost its prefix since takes none."""
        fetch = prefetch.fetch
        arrived = fetch.arrived  # (the reader may add more meanwhile: these are what we use)
        installed = self._install(prefetch, arrived) if arrived else 0
        self.storage.finished(fetch, installed // self.page_size)
        fetch.cancel()  # whatever is still to come is not used
        return installed

    def _install(self, prefetch: Prefetch, arrived: int) -> int:
        cache, size, key = self.cache, self.page_size, prefetch.key
        match = cache.settle(cache.peek(key, prefetch.namespace))
        end = match.num_tokens + match.host_tokens
        if end < prefetch.start:
            return 0  # the prefix it continues is no longer held
        skip = (end - prefetch.start) // size
        if skip >= arrived:
            return 0
        path = cache.host_path(match)
        parent = path[-1] if path else match.last_node
        assert parent.end == end, (parent.end, end)
        for node in path:  # making host room must not drop the path we attach to
            self.lru.pin(node)
        try:
            host_pages = self._host_alloc(arrived - skip)
        finally:
            for node in path:
                self.lru.unpin(node)
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
        now = cache._tick()
        ck = cache.tree.child_key(parent, key, end, prefetch.namespace)
        assert ck not in parent.children, "a continuation the walk would have matched"
        leaf = TreeNode(key[end:end + n * size], [], parent, now)
        leaf.host_pages, leaf.from_storage = host_pages, True
        leaf.block_hashes = prefetch.fetch.keys[skip:skip + n]
        leaf.child_key = ck
        cache.epoch += 1  # keys through here now match further (on the host)
        if parent.host_candidate is not None:
            self.lru.drop(parent)
        parent.children[ck] = leaf
        cache.policy.on_access(leaf, now, False)
        self.lru.add(leaf)
        if cache.events is not None:
            cache.events.stored(leaf, CPU)
        self.storage_loaded_tokens += n * size
        return n * size

    def _host_alloc(self, need: int) -> list[int]:
        """Up to `need` host pages, making room by the host LRU, then by dropping the host
        copies of device-resident nodes (least recently used first: the device keeps the KV,
        a later eviction copies it again)."""
        cache, host = self.cache, self.host
        if not self._make_host_room(need):
            copies = sorted((n for n in cache.nodes() if n.on_device and n.host_pages is not None),
                            key=lambda n: n.last_access)
            for node in copies:
                if host.allocator.free_pages >= need:
                    break
                if cache.events is not None:
                    cache.events.removed(node, CPU)
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
        return self.cache.peek(match.key, match.namespace)

    # -- host/device -> storage ----------------------------------------------------------------
    def persist(self, timeout: float | None = None) -> tuple[int, int]:
        """Write every cached prefix storage lacks (device or host copy), children first (storage's
        LRU then keeps a prefix longer than what hangs below it), for at most `timeout` seconds
        (default: `persist_timeout`), so a restart finds it. Returns (pages queued, left unwritten)."""
        storage, written, left = self.storage, 0, 0
        if not storage.enabled:
            return written, left
        deadline = time.monotonic() + (storage.config.persist_timeout if timeout is None else timeout)
        for node in reversed(list(self.cache.nodes())):  # children first: parents are then the more recent
            keys = self.keys.of(node)
            if not storage.needs(keys):
                continue
            if time.monotonic() > deadline:
                left += len(keys)
            else:
                written += storage.write(keys, self._rows(node), wait=True)  # (waits for room: the last chance)
        return written, left

    def _rows(self, node: TreeNode):
        """The bytes of `node`'s pages: its host copy if it has one, else the device's."""
        return self.host.rows(node.host_pages) if node.host_pages is not None else self.host.device_rows(node.pages)

    def storage_stats(self) -> dict[str, Any]:
        return self.storage.stats() | {"storage_loaded_tokens": self.storage_loaded_tokens}

    def close(self) -> None:
        """Persist what the device and host tiers hold, then stop the storage tier's threads."""
        start, (pages, left) = time.monotonic(), self.persist()  # what they hold survives a restart (logged)
        self.storage.close()  # the queued writes land (or fail) before it returns
        logger.info("KV storage: %d page(s) (%d tokens) written at shutdown in %.1f s%s; %d page(s) stored in %s",
                    pages, pages * self.page_size, time.monotonic() - start,
                    f", {left} left unwritten (--kv-storage-persist-timeout)" if left else "",
                    self.storage.stored_pages, self.storage.location)
