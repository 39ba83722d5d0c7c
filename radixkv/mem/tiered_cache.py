"""HostTieredCache: the radix tree with a host tier below the device pool.

A node is *device-resident* (`pages` set) or *host-only* (`pages == []`, its KV in `host_pages`
on the host tier); device-resident nodes form a prefix-closed subtree (a host-only node's
children are host-only). Device eviction takes the least valuable unlocked node with no
device-resident child; its dropped tail is copied to host pages (unless a write-through copy
exists) and stays in the tree as a host-only node, instead of disappearing. `peek` reports how
far the key continues on the host (`host_tokens`); `load_back` copies that continuation into
fresh device pages (evicting other device pages if it must). The host tier has its own LRU over
host-only leaves: when it is full, the least recently used ones leave the tree for good.

Retention orders device eviction only (a retained prefix goes to the host once no unretained
device leaf is left, as in `RadixCache`); the host tier's LRU ignores it. A host-only node keeps
its deadline, so if it is loaded back before it passes it ranks as retained again.

The `HostTier` decides *where* bytes go (`radixkv.mem.host_tier`); this class decides *what*
moves. Invariants beyond the tree's: `radixkv.mem.cache_checks.check_host_tier`.

Events (when `events` is set): a host copy is a store on the `CPU` medium, a host page let go a
removal there; a device page copied back is a store on `GPU`. A device eviction records its
host store before its device removal, so a subscriber never sees the page held nowhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from sortedcontainers import SortedList

from radixkv.mem.allocator import PageAllocator
from radixkv.mem.base import MatchResult, Namespace
from radixkv.mem.cache_checks import check_host_tier, check_tree
from radixkv.mem.cache_events import CPU, GPU, node_hashes
from radixkv.mem.eviction import EvictionPolicy
from radixkv.mem.host_tier import HostTier
from radixkv.mem.radix_cache import RadixCache
from radixkv.mem.tree_node import TieredNode


class HostTieredCache(RadixCache):
    """A `RadixCache` whose evicted prefixes drop to `host_tier` (see the module docstring)."""

    node_type = TieredNode

    def __init__(self, allocator: PageAllocator, eviction_policy: str | EvictionPolicy = "lru",
                 attention_scale: float | None = None, host_tier: HostTier | None = None,
                 clock: Callable[[], float] = time.monotonic):
        if host_tier is None:
            raise ValueError("HostTieredCache needs a host tier (use RadixCache without one)")
        if host_tier.page_size != allocator.page_size:
            raise ValueError(f"host tier page_size {host_tier.page_size} != cache page_size {allocator.page_size}")
        self.host = host_tier
        super().__init__(allocator, eviction_policy, attention_scale, clock)

    def _init_tree(self) -> None:
        super()._init_tree()
        self._host_candidates: SortedList = SortedList()  # host-only leaves, least recently used first
        self._pinned: set[int] = set()  # host-only nodes being loaded: never host-eviction candidates

    def reset_stats(self) -> None:
        super().reset_stats()
        self.stats_host_loaded_tokens = 0  # host -> device, for requests
        self.stats_host_evicted_tokens = 0  # dropped from the host tier

    # -- lookup --------------------------------------------------------------------------------
    def peek(self, key: Sequence[int], namespace: Namespace = None) -> MatchResult:
        key = self._as_key(key)
        node, pos, pages, host = self.root, 0, [], 0
        for child, n in self._walk(key, namespace):
            if host or not child.on_device:  # the match goes on one tier down
                host += n
                continue
            pages.extend(child.pages if n == len(child.key) else child.pages[: n // self.page_size])
            node, pos = child, pos + n
        return MatchResult(pages, pos, node, host, key=key, namespace=namespace, epoch=self.epoch)

    def settle(self, match: MatchResult) -> MatchResult:
        """Also ends the host continuation on a node boundary (what `load_back` brings back)."""
        match = super().settle(match)
        self._host_path(match, split_end=True)
        return match

    def _host_path(self, match: MatchResult, split_end: bool = False) -> list[TieredNode]:
        """The host-only nodes continuing `match` along its key, as far as they still are in
        the tree (splitting the last at the match's end, with `split_end`)."""
        path, node = [], match.last_node
        pos, end = match.num_tokens, match.num_tokens + match.host_tokens
        while pos < end:
            node = node.children.get(self._child_key(node, match.key, pos, match.namespace))
            if node is None:  # the host tier let it go since (its LRU made room)
                break
            if split_end and pos + len(node.key) > end:
                node = self._split(node, end - pos)
            path.append(node)
            pos += len(node.key)
        return path

    def record_use(self, match: MatchResult) -> None:
        now = self._tick()
        self._touch_path(match.last_node, now)
        for node in self._host_path(match):
            self._touch(node, now, hit=True)

    def load_back(self, match: MatchResult, key: Sequence[int] | None = None,
                  namespace: Namespace = None) -> MatchResult:
        if not match.host_tokens:
            return match
        match = self.settle(match)
        path = self._host_path(match)
        for node in path:  # making room on either tier must not drop what we are loading
            self._pinned.add(node.id)
            if node.host_candidate is not None:
                self._drop_host_candidate(node)
        self.lock(match.last_node)  # what is already on the device stays there while we load
        locked, pos, pages = match.last_node, match.num_tokens, list(match.pages)
        try:
            for child in path:
                need = len(child.host_pages)
                if self.allocator.free_pages < need:
                    self.evict((need - self.allocator.free_pages) * self.page_size)
                if self.allocator.free_pages < need:
                    break  # the device is full of locked pages: the rest is recomputed
                fresh = self.allocator.alloc(need)
                try:
                    self.host.load(child.host_pages, fresh)
                except BaseException:
                    self.allocator.decref(fresh)  # the copy failed: the pages go back, the node stays on the host
                    raise
                self._to_device(child, fresh)
                self.stats_host_loaded_tokens += len(child.key)
                self.lock(child)
                self.unlock(locked)
                locked, pos = child, pos + len(child.key)
                pages.extend(fresh)
        finally:
            self.unlock(locked)
            for node in path:
                self._pinned.discard(node.id)
                if not node.on_device and not node.children and node.host_candidate is None:
                    self._add_host_candidate(node)
        host_left = match.num_tokens + match.host_tokens - pos
        return replace(match, pages=pages, num_tokens=pos, last_node=locked, host_tokens=host_left, epoch=self.epoch)

    # -- tier hooks ----------------------------------------------------------------------------
    def _on_new_leaf(self, leaf: TieredNode) -> None:
        if self.host.write_through:
            leaf.host_pages = self._host_save(leaf.pages)
            if leaf.host_pages is not None and self.events is not None:
                self.events.stored(leaf, CPU)

    def _adopt(self, node: TieredNode, pages: list[int]) -> None:
        self.allocator.incref(pages)
        self._to_device(node, pages)

    def _is_device_leaf(self, node: TieredNode) -> bool:
        return not any(c.on_device for c in node.children.values())

    def _split(self, child: TieredNode, n: int) -> TieredNode:
        host_pages = child.host_pages
        upper = super()._split(child, n)
        if host_pages is not None:
            k = n // self.page_size
            upper.host_pages, child.host_pages = host_pages[:k], host_pages[k:]
        return upper

    def _touch(self, node: TieredNode, now: int, hit: bool) -> None:
        super()._touch(node, now, hit)
        if node.host_candidate is not None:
            self._drop_host_candidate(node)
            self._add_host_candidate(node)

    def _evict_tail(self, node: TieredNode, keep: int) -> None:
        """Move `node`'s tokens past `keep` to the host tier (or drop them when it is full)."""
        if keep:
            self._split(node, keep)  # `node` is now the tail below a device-resident upper part
        if node.host_pages is None:
            node.host_pages = self._host_save(node.pages)
            if node.host_pages is not None and self.events is not None:
                self.events.stored(node, CPU)
        if node.host_pages is None:  # no room one tier down: forget the tail and what hangs below
            self._drop_host_subtree(node)
            self._delete_leaf(node)
            return
        if self.events is not None:
            self.events.removed(node, GPU)
        self._evictable_tokens -= len(node.key)
        self.allocator.decref(node.pages)
        node.pages = []
        if not node.children:
            self._add_host_candidate(node)
        parent = node.parent
        if parent is not self.root and parent.lock_ref == 0 and self._is_device_leaf(parent):
            self.candidates.add(parent)

    def _release_node(self, node: TieredNode) -> None:
        # (no event: a device leaf is deleted only without a host copy, and a reset clears all)
        if node.host_pages is not None:
            self.host.allocator.decref(node.host_pages)

    def _describe(self, node: TieredNode) -> str:
        return "" if node.host_pages is None else f" host={node.host_pages[:4]}"

    # -- the host tier -------------------------------------------------------------------------
    def _to_device(self, node: TieredNode, pages: list[int]) -> None:
        """A host-only node gets device `pages` (the tree's references already taken)."""
        assert not node.on_device and (node.parent.on_device or node.parent is self.root)
        self.epoch += 1  # what peeks saw on the host is on the device now
        node.pages = pages
        if self.events is not None:
            self.events.stored(node, GPU)
        if node.host_candidate is not None:
            self._drop_host_candidate(node)
        parent = node.parent
        if parent.candidate is not None:  # it now has a device-resident child
            self.candidates.drop(parent)
        if node.lock_ref == 0:
            self._evictable_tokens += len(node.key)
            self.candidates.add(node)
        else:
            self._protected_tokens += len(node.key)

    def _host_save(self, device_pages: list[int]) -> list[int] | None:
        """Host copies of `device_pages`, making room by the host LRU; None if it cannot."""
        need = len(device_pages)
        host = self.host
        if not self._make_host_room(need):
            return None
        host_pages = host.allocator.alloc(need)
        host.save(device_pages, host_pages)
        return host_pages

    def _make_host_room(self, need: int) -> bool:
        """Evict host-only leaves (LRU) until `need` host pages are free; whether they are."""
        if self.host.allocator.free_pages < need:
            self._evict_host(need)  # (the pages to have free, not the shortfall)
        return self.host.allocator.free_pages >= need

    def _evict_host(self, num_pages: int) -> None:
        """Drop host-only leaves, least recently used first, until `num_pages` host pages are free."""
        while self.host.allocator.free_pages < num_pages and self._host_candidates:
            node = self._host_candidates.pop(0)[2]
            node.host_candidate = None
            self._drop_host_only(node)

    def _drop_host_only(self, node: TieredNode) -> None:
        """Remove a host-only leaf from the tree and the host tier."""
        assert not node.on_device and not node.children
        if self.ghosts is not None and not self._kept_below(node):
            self.ghosts.add(node_hashes(node, self.page_size))
        self.epoch += 1
        parent = node.parent
        del parent.children[node.child_key]
        if self.events is not None:
            self.events.removed(node, CPU)
        self.host.allocator.decref(node.host_pages)
        self.stats_host_evicted_tokens += len(node.key)
        if node.host_candidate is not None:
            self._drop_host_candidate(node)
        if not parent.on_device and parent is not self.root and not parent.children:
            self._add_host_candidate(parent)  # (a device parent's candidacy ignores host-only children)

    def _kept_below(self, node: TieredNode) -> bool:
        """Tier hook: whether a tier below the host keeps `node`'s pages as it leaves the tree."""
        return False

    def _drop_host_subtree(self, node: TieredNode) -> None:
        """Remove every (host-only) descendant of `node`."""
        for child in list(node.children.values()):
            self._drop_host_subtree(child)
            self._drop_host_only(child)

    def _add_host_candidate(self, node: TieredNode) -> None:
        if node.id in self._pinned:
            return
        entry = (node.last_access, node.id, node)
        node.host_candidate = entry
        self._host_candidates.add(entry)

    def _drop_host_candidate(self, node: TieredNode) -> None:
        self._host_candidates.remove(node.host_candidate)
        node.host_candidate = None

    def check_invariants(self, inflight_pages: int | None = None) -> None:
        check_tree(self, inflight_pages)
        check_host_tier(self)
