"""RadixCache: the cache manager. One radix tree of token prefixes over reference-counted KV
pages, composed with the tiers below the device pool.

Composition. The tree's shape and walks are a `radixkv.mem.radix_tree.RadixTree`; this class
owns what the device pool's part of it means (page references, locks, eviction, retention).
The tiers under the device (a host tier, and under it a storage tier: `HostTier`,
`StorageTier`) are small classes plugged in through one `radixkv.mem.tier_controller.
TierController`, the only object that moves pages between tiers; without a host tier there is
no controller and an evicted page is gone. `radixkv.mem.make_prefix_cache` assembles them.

Ownership. The tree holds one allocator reference on every device page of every node. Evicting
a node drops those references; a page is freed once no running request holds it either.

Locks. `lock(node)` adds one to `lock_ref` of the node and every ancestor (below the root), so
`lock_ref(node) >= sum(lock_ref(child))`. A node with `lock_ref > 0` is *protected*: a running
request reads it. A node with `lock_ref == 0` is *evictable*; only evictable *device leaves*
(no child holds device pages) are eviction candidates, kept in rank order
(`radixkv.mem.candidates`; see Retention). Evicting a leaf can turn its parent into a candidate.

Retention. `retain` gives the nodes of a just-cached path a deadline (`retain_until`, seconds
on the cache's `clock`; a client's hint, `radixkv.retention`): they are evicted after every
unretained leaf (`radixkv.mem.candidates` ranks them, and re-ranks a deadline gone by). Retained
leaves stay evictable, so `evictable_tokens`, admission and reservation never change: a hint
cannot block anything. A parent's deadline is never earlier than its child's (retaining a node
retains its path; a split copies the deadline), so a retained leaf's eviction never exposes an
unretained parent. Retention orders device eviction only; the host tier's LRU ignores it.

Matching. `peek` walks the tree and changes nothing; it may end inside an edge. Past the device
part, the key may go on through host-only nodes (`host_tokens`) and then in storage
(`storage_tokens`). `settle` splits the edge the match ends inside so it ends on a node (the one
a request locks); `record_use` moves the path's statistics once the request is admitted. A peek
records the tree's change count (`epoch`): changes to what a key matches (eviction, a new leaf,
a move between tiers) make `settle` match again, while splits never invalidate a peek (a split
keeps the lower node, and `settle` finds the upper one by depth).

Events. With events recorded (`record_events`; a `radixkv.mem.cache_events.CacheEventLog`),
every change to which pages the cache holds is recorded: a new leaf's pages stored, evicted
pages removed, a reset cleared (`--kv-events-config`); splits record nothing.

Invariants (`radixkv.mem.cache_checks`, via `check_invariants`):
  free_pages + evictable_pages + protected_pages + inflight_pages == num_pages
where inflight pages are held by running requests and not by the tree; each tree page appears
in exactly one node and has a reference count >= 1; the candidate set is exactly the unlocked
device leaves; `evictable_tokens` / `protected_tokens` equal the sums over unlocked / locked
device-resident nodes; a node's `retain_until` is at most its parent's (below the root); a
candidate flagged retained carries its node's current deadline, and one not flagged has a
deadline no later than the clock. With a host tier, `check_host_tier` adds its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from radixkv.errors import CacheInvariantError
from radixkv.mem.allocator import PageAllocator
from radixkv.mem.base import InsertResult, MatchResult, Namespace, PrefixCache
from radixkv.mem.cache_checks import check_host_tier, check_tree
from radixkv.mem.cache_events import GPU, CacheEventLog
from radixkv.mem.candidates import EvictionCandidates
from radixkv.mem.eviction import EvictionPolicy, make_policy
from radixkv.mem.host_tier import HostTier
from radixkv.mem.miss_causes import GhostIndex
from radixkv.mem.radix_tree import RadixTree
from radixkv.mem.storage_tier import StorageTier
from radixkv.mem.tier_controller import TierController
from radixkv.mem.tree_hashes import node_hashes
from radixkv.mem.tree_node import TreeNode

if TYPE_CHECKING:
    from radixkv.retention import Retention


class RadixCache(PrefixCache):
    """The cache manager (see the module docstring): the radix tree over `allocator`'s pages,
    over `host_tier` and `storage` when given."""

    def __init__(self, allocator: PageAllocator, eviction_policy: str | EvictionPolicy = "lru",
                 attention_scale: float | None = None, clock: Callable[[], float] = time.monotonic, *,
                 host_tier: HostTier | None = None, storage: StorageTier | None = None):
        self.allocator = allocator
        self.clock = clock  # seconds >= 0, never going back: what retention deadlines are read against
        self.page_size = allocator.page_size
        self.policy = make_policy(eviction_policy, attention_scale)
        self.events: CacheEventLog | None = None  # records page changes for KV events, when set
        self.ghosts: GhostIndex | None = None  # names of pages that left the cache (miss causes), when set
        if storage is not None and host_tier is None:
            raise ValueError("a storage tier needs a host tier above it")
        self.tiers = TierController(self, host_tier, storage) if host_tier is not None else None
        self.epoch = -1  # changes to what keys match (never reset): a peek from an earlier epoch is matched again
        self.stats_evicted_tokens = 0
        self._init_tree()

    def _init_tree(self) -> None:
        self._clock = 0
        self.epoch += 1
        self.tree = RadixTree(self.page_size)
        self.candidates = EvictionCandidates(self.policy, self.clock)
        self._evictable_tokens = 0
        self._protected_tokens = 0
        if self.tiers is not None:
            self.tiers.reset()

    # -- what the tree and the tiers hold --------------------------------------------------------
    @property
    def root(self) -> TreeNode:
        return self.tree.root

    def nodes(self) -> Iterator[TreeNode]:
        """Every node but the root, parents before their children (for inspection and checks)."""
        return self.tree.nodes()

    @property
    def host(self) -> HostTier | None:
        return None if self.tiers is None else self.tiers.host

    @property
    def storage(self) -> StorageTier | None:
        return None if self.tiers is None else self.tiers.storage

    @property
    def evictable_tokens(self) -> int:
        return self._evictable_tokens

    @property
    def protected_tokens(self) -> int:
        return self._protected_tokens

    @property
    def num_candidates(self) -> int:
        return len(self.candidates)

    def cached_pages(self) -> set[int]:
        pages: set[int] = set()
        for node in self.nodes():
            pages.update(node.pages)
        return pages

    # -- lookup --------------------------------------------------------------------------------
    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def peek(self, key: Sequence[int], namespace: Namespace = None) -> MatchResult:
        key = self.tree.as_key(key)
        node, pos, pages, host = self.tree.match(key, namespace)
        match = MatchResult(pages, pos, node, host, key=key, namespace=namespace, epoch=self.epoch)
        return match if not self.reads_storage else self.tiers.stored.storage_continuation(match)

    def continuation(self, key: Sequence[int], namespace: Namespace = None, limit: int = 8) -> list[int]:
        return self.tree.continuation(key, namespace, limit)

    def settle(self, match: MatchResult) -> MatchResult:
        """Also ends the host continuation on a node boundary (what `load_back` brings back)."""
        if match.epoch != self.epoch:  # the tree changed under it since: match again
            match = self.peek(match.key, match.namespace)
        node = self._node_ending_at(match.last_node, match.num_tokens)
        match = match if node is match.last_node else replace(match, last_node=node)
        self.host_path(match, split_end=True)
        return match

    def _node_ending_at(self, node: TreeNode, end: int) -> TreeNode:
        """The node whose edge ends `end` tokens from the root, on the path through `node`
        (which contains that point, or sits below it after a split), splitting if needed."""
        while node is not self.root and node.depth >= end:  # split since: the end is above
            node = node.parent
        if node is not self.root and end < node.end:
            node = self.split(node, end - node.depth)
        return node

    def host_path(self, match: MatchResult, split_end: bool = False) -> list[TreeNode]:
        """`RadixTree.host_path`, splitting (with `split_end`) as the cache splits."""
        return self.tree.host_path(match, self.split if split_end else None)

    def record_use(self, match: MatchResult) -> None:
        now = self._tick()
        self._touch_path(match.last_node, now)
        for node in self.host_path(match):
            self.touch(node, now, hit=True)

    def _touch_path(self, last: TreeNode, now: int) -> None:
        """Record a hit on every node from the root down to `last`, in that order."""
        path = []
        while last is not self.root:
            path.append(last)
            last = last.parent
        for node in reversed(path):
            self.touch(node, now, hit=True)

    def load_back(self, match: MatchResult, key: Sequence[int] | None = None,
                  namespace: Namespace = None) -> MatchResult:
        if not match.host_tokens:
            return match
        return self.tiers.load_back(match)

    # -- mutation ------------------------------------------------------------------------------
    def insert_path(self, key: Sequence[int], pages: Sequence[int], namespace: Namespace = None) -> InsertResult:
        key = self.tree.as_key(key)
        size = self.page_size
        if len(pages) < len(key) // size:
            raise ValueError(f"{len(pages)} page(s) cannot hold {len(key)} tokens of key")
        now = self._tick()
        node, pos, path_pages = self.root, 0, []
        while pos < len(key):
            ck = self.tree.child_key(node, key, pos, namespace)
            child = node.children.get(ck)
            if child is None:
                new_pages = list(pages[pos // size : len(key) // size])
                self.allocator.incref(new_pages)
                leaf = TreeNode(key[pos:], new_pages, node, now)
                self.epoch += 1  # keys through here now match further
                self.policy.on_access(leaf, now, False)
                self._attach(node, ck, leaf)
                if self.events is not None:
                    self.events.stored(leaf, GPU)
                if self.tiers is not None:
                    self.tiers.cached(leaf)
                path_pages.extend(new_pages)
                return InsertResult(pos, MatchResult(path_pages, len(key), leaf, key=key, namespace=namespace,
                                                     epoch=self.epoch))
            n = self.tree.match_len(child.key, key, pos)
            if n < len(child.key):
                child = self.split(child, n)
            if not child.on_device:  # the caller computed tokens a lower tier holds: adopt its pages
                if self.tiers is None:
                    raise CacheInvariantError(f"{child} has no device pages, and this tree has no lower tier")
                self.tiers.adopt(child, list(pages[pos // size : (pos + n) // size]))
            self.touch(child, now, hit=False)
            path_pages.extend(child.pages)
            pos += n
            node = child
        return InsertResult(pos, MatchResult(path_pages, pos, node, key=key, namespace=namespace, epoch=self.epoch))

    def _attach(self, parent: TreeNode, ck: Any, leaf: TreeNode) -> None:
        if parent.candidate is not None:  # parent stops being a leaf
            self.candidates.drop(parent)
        leaf.child_key = ck
        parent.children[ck] = leaf
        self._evictable_tokens += len(leaf.key)
        self.candidates.add(leaf)

    def split(self, child: TreeNode, n: int) -> TreeNode:
        """Split `child`'s edge after `n` tokens (`RadixTree.split`); returns the upper node."""
        upper = self.tree.split(child, n)
        if child.candidate is not None:  # its priority may depend on depth or length
            self.candidates.rerank(child)
        return upper

    def touch(self, node: TreeNode, now: int, hit: bool) -> None:
        self.policy.on_access(node, now, hit)  # sees the node's statistics before this access
        node.last_access = now
        if hit:
            node.hit_count += 1
        if node.candidate is not None:
            self.candidates.rerank(node)
        if self.tiers is not None:
            self.tiers.touched(node, hit)

    # -- retention -----------------------------------------------------------------------------
    def retain(self, match: MatchResult, retention: Retention) -> None:
        now = self.clock()
        for end, seconds in retention.ends(match.num_tokens):
            end = self.aligned(end)
            if end:
                self._retain_path(self._node_ending_at(match.last_node, end), now + seconds, now)

    def _retain_path(self, node: TreeNode, until: float, now: float) -> None:
        """`node` and its ancestors kept until `until` at least. Deadlines only grow and a
        parent's is never earlier than its child's, so the walk stops at the first node already
        kept as long."""
        while node is not self.root and node.retain_until < until:
            node.retain_until = until
            if node.candidate is not None:
                self.candidates.rerank(node, now)
            node = node.parent

    @property
    def retained_tokens(self) -> int:
        return self.tree.retained_tokens(self.clock())

    # -- locks ---------------------------------------------------------------------------------
    def lock(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable_tokens -= len(node.key)
                self._protected_tokens += len(node.key)
                if node.candidate is not None:
                    self.candidates.drop(node)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref <= 0:
                raise CacheInvariantError(f"unlock of {node}, which is not locked")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable_tokens += len(node.key)
                self._protected_tokens -= len(node.key)
                if self.is_device_leaf(node):
                    self.candidates.add(node)
            node = node.parent

    # -- eviction ------------------------------------------------------------------------------
    def is_device_leaf(self, node: TreeNode) -> bool:
        """Whether no child of `node` holds device pages (so it can be evicted)."""
        if self.tiers is None:
            return not node.children
        return not any(c.on_device for c in node.children.values())

    _is_device_leaf = is_device_leaf  # (the name the invariant checks and tests use)

    def evict(self, num_tokens: int) -> int:
        """Evict the lowest-ranked leaves' tails (`EvictionCandidates.victims`: retained leaves
        last) until `num_tokens` are freed or none is left; with a host tier the tails move there."""
        freed = 0
        for node, keep in self.candidates.victims(num_tokens, self.page_size, self._clock):
            freed += len(node.key) - keep
            self.epoch += 1
            if self.tiers is not None:
                self.tiers.demote(node, keep)
            elif keep:
                self._trim_leaf(node, keep)
            else:
                self.delete_leaf(node)
        self.stats_evicted_tokens += freed
        return freed

    def _trim_leaf(self, node: TreeNode, keep: int) -> None:
        if self.ghosts is not None:
            self.ghosts.add(node_hashes(node, self.page_size)[keep // self.page_size:])
        if self.events is not None:
            self.events.removed(node, GPU, keep // self.page_size)
        if node.block_hashes is not None:
            node.block_hashes = node.block_hashes[: keep // self.page_size]
        dropped = node.pages[keep // self.page_size :]
        node.key = node.key[:keep]
        node.pages = node.pages[: keep // self.page_size]
        self._evictable_tokens -= len(dropped) * self.page_size
        self.allocator.decref(dropped)
        self.candidates.add(node)

    def delete_leaf(self, node: TreeNode) -> None:
        """The unlocked device leaf `node` leaves the tree, with what it holds on every tier."""
        if self.ghosts is not None:
            self.ghosts.add(node_hashes(node, self.page_size))
        if self.events is not None:
            self.events.removed(node, GPU)
        parent = node.parent
        del parent.children[node.child_key]
        self._evictable_tokens -= len(node.key)
        self.allocator.decref(node.pages)
        if self.tiers is not None:
            self.tiers.release(node)
        if parent is not self.root and parent.lock_ref == 0 and parent.candidate is None \
                and self.is_device_leaf(parent):
            self.candidates.add(parent)

    def reset(self) -> None:
        """Empty the device and host tiers (storage keeps what it holds)."""
        if self._protected_tokens:
            raise CacheInvariantError(
                f"reset with {self._protected_tokens} token(s) still locked by running requests"
            )
        for node in self.nodes():
            self.allocator.decref(node.pages)
            if self.tiers is not None:
                self.tiers.release(node)
        self._init_tree()
        if self.events is not None:
            self.events.cleared()

    # -- inspection ----------------------------------------------------------------------------
    def pretty(self) -> str:
        """The tree as indented text (for debugging)."""
        return self.tree.pretty(self.tiers.describe if self.tiers is not None else lambda node: "")

    def check_invariants(self, inflight_pages: int | None = None) -> None:
        check_tree(self, inflight_pages)
        if self.tiers is not None:
            check_host_tier(self)
