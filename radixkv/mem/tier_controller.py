"""TierController: the one object that moves KV pages between the cache's tiers.

Tiers, top down: the device pool, a host tier (`host_tier.HostTier`), optionally a storage tier
(`storage_tier.StorageTier`; on disk, `disk_storage.DiskKVStorage`). The tiers own *where* bytes
go; the tree (`radix_cache.RadixCache`) knows where each node's pages are; this controller
decides *what* moves, and keeps the tree's nodes telling the truth about it.

A node is *device-resident* (`pages` set) or *host-only* (`pages == []`, its KV in `host_pages`);
a host-only node's children are host-only. Stored pages are not in the tree: they are found by
their block hash; what moves to and from storage is the `StorageMover`'s
(`radixkv.mem.storage_mover`, `stored`), which this controller calls when the host tier lets a
node go or a node gets hot.

What moves:
- *device -> host* (`demote`): an evicted tail is copied to host pages (unless a write-through
  copy exists) and stays in the tree as a host-only node; with no host room it is dropped.
- *host -> device* (`load_back`): a match's host continuation is copied into fresh device pages
  (evicting other device pages if it must).
- *host LRU*: when the host tier is full, the least recently used host-only leaves leave the
  tree for good; with a storage tier they are written there first (*write-back*), or, with
  `write-through-selective`, a node is written once it has been hit `hit_threshold` times;
  with `write-through`, a node is written as soon as it is cached (and, if that write was
  skipped, when it leaves the host tier).
- *storage -> host*, and a clean shutdown's `persist`: `StorageMover`; `load_back` reports how
  many tokens it loaded a prefetch had brought (`MatchResult.from_storage`).

Events: a host copy is a store on `CPU`, a host page let go a removal there; a page copied back
a store on `GPU`; a device eviction records its host store before its device removal (a
subscriber never sees the page held nowhere). Invariants: `cache_checks.check_host_tier`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from radixkv.mem.base import MatchResult
from radixkv.mem.cache_events import CPU, GPU
from radixkv.mem.host_lru import HostLRU
from radixkv.mem.host_tier import HostTier
from radixkv.mem.storage_mover import StorageMover
from radixkv.mem.storage_tier import StorageTier
from radixkv.mem.tree_hashes import TreeHashes
from radixkv.mem.tree_node import TreeNode



class TierController:
    """Moves pages between `cache`'s device pool, `host` and `storage` (the module docstring)."""

    def __init__(self, cache: Any, host: HostTier, storage: StorageTier | None = None):
        page_size = cache.page_size
        if host.page_size != page_size:
            raise ValueError(f"host tier page_size {host.page_size} != cache page_size {page_size}")
        self.cache, self.host, self.storage = cache, host, storage
        self.page_size = page_size
        self.keys = TreeHashes(page_size)
        self.lru = HostLRU()
        self.host_loaded_tokens = 0  # host -> device, for requests
        self.host_evicted_tokens = 0  # dropped from the host tier
        self.storage_hit_tokens = 0  # tokens storage brought, loaded on to the device by a request
        self.stored = StorageMover(self, storage) if storage is not None else None
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
        """A new leaf was inserted (write-through copies it to the host, or to storage, at once)."""
        if self.host.write_through:
            leaf.host_pages = self._host_save(leaf.pages)
            if leaf.host_pages is not None and self.cache.events is not None:
                self.cache.events.stored(leaf, CPU)
        storage = self.storage
        if storage is not None and storage.config.on_insert and storage.enabled:
            self._write(leaf)

    def _write(self, node: TreeNode) -> None:
        """Write the stored pages (blocks) `node`'s edge ends, where storage lacks them."""
        keys, start = self.stored.block_keys(node)
        if keys and self.storage.needs(keys):
            self.storage.write(keys, self.stored.block_rows(node, start, len(keys)))

    def adopt(self, node: TreeNode, pages: list[int]) -> None:
        """`node` (not on the device) takes the caller's `pages` for its edge."""
        self.cache.allocator.incref(pages)
        self.to_device(node, pages)

    def touched(self, node: TreeNode, hit: bool) -> None:
        """A match or insert went through `node`."""
        if node.host_candidate is not None:
            self.lru.touch(node)
        storage = self.storage
        if storage is not None and hit and storage.config.selective \
                and node.hit_count >= storage.config.hit_threshold and storage.enabled:
            self._write(node)

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
        stored, start = self.stored.block_keys(node) if storage is not None else ([], 0)
        kept = bool(stored) and not storage.needs(stored)
        if stored and not storage.config.selective and not kept:
            kept = bool(storage.write(stored, self.stored.block_rows(node, start, len(stored))))
        if cache.ghosts is not None and not kept:  # (not kept below either)
            cache.ghosts.add(self.keys.of(node))
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

    def host_alloc(self, need: int) -> list[int]:
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

