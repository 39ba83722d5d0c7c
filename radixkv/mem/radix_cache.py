"""RadixCache: a radix tree of token prefixes over reference-counted KV pages.

Structure. Each node owns an edge: `key` (a tuple of token ids) and `pages` (the page ids that
store those tokens' KV, `len(key) == len(pages) * page_size`). With `page_size > 1` every edge,
match and split is page-aligned, so a page is never shared between two edges. Children are
indexed by their edge's first page of tokens; at the root the index also carries the request's
namespace, so equal tokens under different namespaces never share.

Ownership. The tree holds one allocator reference on every page of every node. Evicting a node
drops those references; a page is freed once no running request holds it either.

Locks. `lock(node)` adds one to `lock_ref` of the node and every ancestor (below the root), so
`lock_ref(node) >= sum(lock_ref(child))`. A node with `lock_ref > 0` is *protected*: a running
request reads it. A node with `lock_ref == 0` is *evictable*; only evictable *leaves* are
eviction candidates, kept in a sorted container ordered by the eviction policy's priority.
Evicting a leaf can turn its parent into a candidate.

Host tier (optional, `host_tier=`). A node is *device-resident* (`pages` set) or *host-only*
(`pages == []`, its KV in `host_pages` on the host tier); device-resident nodes form a
prefix-closed subtree (a host-only node's children are host-only). Device eviction takes the
least valuable unlocked node with no device-resident child; with a host tier its dropped tail
is copied to host pages (unless a write-through copy exists) and stays in the tree as a
host-only node, instead of disappearing. `match_prefix` reports how far the key continues on
the host (`host_tokens`); `load_back` copies that continuation into fresh device pages (evicting
other device pages if it must). The host tier has its own LRU over host-only leaves: when it
is full, the least recently used ones leave the tree for good.

Invariants (`check_invariants`):
  free_pages + evictable_pages + protected_pages + inflight_pages == num_pages
where inflight pages are held by running requests and not by the tree; each tree page appears
in exactly one node and has a reference count >= 1; the candidate set is exactly the unlocked
leaves; `evictable_tokens` / `protected_tokens` equal the sums over unlocked / locked nodes.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from sortedcontainers import SortedList

from radixkv.errors import CacheInvariantError
from radixkv.mem.allocator import PageAllocator
from radixkv.mem.base import MatchResult, Namespace, PrefixCache
from radixkv.mem.eviction import EvictionPolicy, make_policy
from radixkv.mem.host_tier import HostTier

_node_ids = itertools.count()


class TreeNode:
    """One edge of the radix tree and the statistics eviction policies read."""

    __slots__ = (
        "id", "key", "pages", "parent", "children", "child_key", "lock_ref",
        "last_access", "hit_count", "created", "depth", "candidate", "meta", "host_pages", "host_candidate",
    )

    def __init__(self, key: tuple, pages: list[int], parent: TreeNode | None, now: int):
        self.id = next(_node_ids)
        self.key = key  # tokens of this edge
        self.pages = pages  # page ids storing `key`
        self.parent = parent
        self.children: dict[Any, TreeNode] = {}
        self.child_key: Any = None  # this node's index in parent.children
        self.lock_ref = 0
        self.last_access = now
        self.hit_count = 0
        self.created = now
        self.depth = 0 if parent is None else parent.depth + len(parent.key)
        self.candidate: tuple | None = None  # entry in the eviction candidate set, if any
        self.meta: Any = None  # free for an eviction policy's own per-node state
        self.host_pages: list[int] | None = None  # host-tier copy of `key`, if any
        self.host_candidate: tuple | None = None  # entry in the host tier's LRU, if any

    @property
    def on_device(self) -> bool:
        return bool(self.pages)

    @property
    def num_tokens(self) -> int:
        return len(self.key)

    def is_leaf(self) -> bool:
        return not self.children

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, tokens={len(self.key)}, lock_ref={self.lock_ref})"


class RadixCache(PrefixCache):
    """Prefix cache over a `PageAllocator`; see the module docstring for the invariants."""

    def __init__(
        self,
        allocator: PageAllocator,
        eviction_policy: str | EvictionPolicy = "lru",
        attention_scale: float | None = None,
        host_tier: HostTier | None = None,
    ):
        self.allocator = allocator
        self.page_size = allocator.page_size
        if host_tier is not None and host_tier.page_size != self.page_size:
            raise ValueError(f"host tier page_size {host_tier.page_size} != cache page_size {self.page_size}")
        self.host = host_tier
        self.policy = make_policy(eviction_policy, attention_scale)
        self.reset_stats()
        self._init_tree()

    def _init_tree(self) -> None:
        self._clock = 0
        self.root = TreeNode((), [], None, 0)
        self.root.lock_ref = 1  # the root is never evicted
        self._candidates: SortedList = SortedList()
        self._host_candidates: SortedList = SortedList()  # host-only leaves, least recently used first
        self._pinned: set[int] = set()  # host-only nodes being loaded: never host-eviction candidates
        self._evictable_tokens = 0
        self._protected_tokens = 0

    def reset_stats(self) -> None:
        self.stats_evicted_tokens = 0
        self.stats_host_loaded_tokens = 0  # host -> device, for requests
        self.stats_host_evicted_tokens = 0  # dropped from the host tier

    # -- sizes ---------------------------------------------------------------------------------
    @property
    def evictable_tokens(self) -> int:
        return self._evictable_tokens

    @property
    def protected_tokens(self) -> int:
        return self._protected_tokens

    @property
    def num_candidates(self) -> int:
        return len(self._candidates)

    # -- lookup --------------------------------------------------------------------------------
    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _child_key(self, node: TreeNode, key: tuple, start: int, namespace: Namespace) -> Any:
        size = self.page_size
        first = key[start] if size == 1 else key[start : start + size]
        return (namespace, first) if node is self.root else first

    def _match_len(self, edge: tuple, key: tuple, start: int) -> int:
        """Length of the common page-aligned prefix of `edge` and `key[start:]`."""
        n = min(len(edge), len(key) - start)
        if edge[:n] == key[start : start + n]:
            return n
        size = self.page_size
        lo, hi = 1, n // size  # the first page is known to match (it indexed the child)
        while lo < hi:  # largest number of matching pages, by bisection
            mid = (lo + hi + 1) // 2
            if edge[: mid * size] == key[start : start + mid * size]:
                lo = mid
            else:
                hi = mid - 1
        return lo * size

    def _as_key(self, key: Sequence[int]) -> tuple:
        key = key if isinstance(key, tuple) else tuple(key)
        extra = len(key) % self.page_size
        return key[: len(key) - extra] if extra else key

    def match_prefix(
        self, key: Sequence[int], namespace: Namespace = None, *, record_hit: bool = True
    ) -> MatchResult:
        key = self._as_key(key)
        now = self._tick() if record_hit else self._clock
        node, pos, pages = self.root, 0, []
        last, host = None, 0
        while pos < len(key):
            child = node.children.get(self._child_key(node, key, pos, namespace))
            if child is None:
                break
            n = self._match_len(child.key, key, pos)
            if n < len(child.key):
                child = self._split(child, n)
            if record_hit:
                self._touch(child, now, hit=True)
            if child.on_device:
                pages.extend(child.pages)
            else:  # the match continues one tier down
                last = last or node
                host += n
            pos += n
            node = child
        if last is None:
            return MatchResult(pages, pos, node)
        return MatchResult(pages, pos - host, last, host)

    # -- mutation ------------------------------------------------------------------------------
    def insert(self, key: Sequence[int], pages: Sequence[int], namespace: Namespace = None) -> int:
        key = self._as_key(key)
        size = self.page_size
        if len(pages) < len(key) // size:
            raise ValueError(f"{len(pages)} page(s) cannot hold {len(key)} tokens of key")
        now = self._tick()
        node, pos = self.root, 0
        while pos < len(key):
            ck = self._child_key(node, key, pos, namespace)
            child = node.children.get(ck)
            if child is None:
                new_pages = list(pages[pos // size : len(key) // size])
                self.allocator.incref(new_pages)
                leaf = TreeNode(key[pos:], new_pages, node, now)
                self.policy.on_access(leaf, now, False)
                self._attach(node, ck, leaf)
                if self.host is not None and self.host.write_through:
                    leaf.host_pages = self._host_save(leaf.pages)
                return pos
            n = self._match_len(child.key, key, pos)
            if n < len(child.key):
                child = self._split(child, n)
            if not child.on_device:  # the caller computed tokens the host tier holds: adopt its pages
                revived = list(pages[pos // size : (pos + n) // size])
                self.allocator.incref(revived)
                self._to_device(child, revived)
            self._touch(child, now, hit=False)
            pos += n
            node = child
        return pos

    # -- host tier -----------------------------------------------------------------------------
    def _to_device(self, node: TreeNode, pages: list[int]) -> None:
        """A host-only node gets device `pages` (the tree's references already taken)."""
        assert not node.on_device and (node.parent.on_device or node.parent is self.root)
        node.pages = pages
        if node.host_candidate is not None:
            self._drop_host_candidate(node)
        parent = node.parent
        if parent.candidate is not None:  # it now has a device-resident child
            self._drop_candidate(parent)
        if node.lock_ref == 0:
            self._evictable_tokens += len(node.key)
            self._add_candidate(node)
        else:
            self._protected_tokens += len(node.key)

    def _host_save(self, device_pages: list[int]) -> list[int] | None:
        """Host copies of `device_pages`, making room by the host LRU; None if it cannot."""
        need = len(device_pages)
        host = self.host
        if host.allocator.free_pages < need:
            self._evict_host(need - host.allocator.free_pages)
        if host.allocator.free_pages < need:
            return None
        host_pages = host.allocator.alloc(need)
        host.save(device_pages, host_pages)
        return host_pages

    def _evict_host(self, num_pages: int) -> None:
        """Drop host-only leaves, least recently used first, until `num_pages` host pages are free."""
        while self.host.allocator.free_pages < num_pages and self._host_candidates:
            node = self._host_candidates.pop(0)[2]
            node.host_candidate = None
            self._drop_host_only(node)

    def _drop_host_only(self, node: TreeNode) -> None:
        """Remove a host-only leaf from the tree and the host tier."""
        assert not node.on_device and not node.children
        parent = node.parent
        del parent.children[node.child_key]
        self.host.allocator.decref(node.host_pages)
        self.stats_host_evicted_tokens += len(node.key)
        if node.host_candidate is not None:
            self._drop_host_candidate(node)
        if not parent.on_device and parent is not self.root and not parent.children:
            self._add_host_candidate(parent)  # (a device parent's candidacy ignores host-only children)

    def _drop_host_subtree(self, node: TreeNode) -> None:
        """Remove every (host-only) descendant of `node`."""
        for child in list(node.children.values()):
            self._drop_host_subtree(child)
            self._drop_host_only(child)

    def _add_host_candidate(self, node: TreeNode) -> None:
        if node.id in self._pinned:
            return
        entry = (node.last_access, node.id, node)
        node.host_candidate = entry
        self._host_candidates.add(entry)

    def _drop_host_candidate(self, node: TreeNode) -> None:
        self._host_candidates.remove(node.host_candidate)
        node.host_candidate = None

    @staticmethod
    def _has_device_child(node: TreeNode) -> bool:
        return any(c.on_device for c in node.children.values())

    def load_back(self, match: MatchResult, key: Sequence[int], namespace: Namespace = None) -> MatchResult:
        if self.host is None or not match.host_tokens:
            return match
        key = self._as_key(key)
        path, node, pos = [], match.last_node, match.num_tokens
        while pos < match.num_tokens + match.host_tokens:  # the host-only nodes to bring back
            node = node.children[self._child_key(node, key, pos, namespace)]
            assert not node.on_device and len(node.key) <= match.num_tokens + match.host_tokens - pos
            path.append(node)
            pos += len(node.key)
        for node in path:  # making room on either tier must not drop what we are loading
            self._pinned.add(node.id)
            if node.host_candidate is not None:
                self._drop_host_candidate(node)
        self.lock(match.last_node)  # what is already on the device stays there while we load
        locked, pos = match.last_node, match.num_tokens
        try:
            for child in path:
                need = len(child.host_pages)
                if self.allocator.free_pages < need:
                    self.evict((need - self.allocator.free_pages) * self.page_size)
                if self.allocator.free_pages < need:
                    break  # the device is full of locked pages: the rest is recomputed
                pages = self.allocator.alloc(need)
                try:
                    self.host.load(child.host_pages, pages)
                except BaseException:
                    self.allocator.decref(pages)  # the copy failed: the pages go back, the node stays on the host
                    raise
                self._to_device(child, pages)
                self.stats_host_loaded_tokens += len(child.key)
                self.lock(child)
                self.unlock(locked)
                locked, pos = child, pos + len(child.key)
        finally:
            self.unlock(locked)
            for node in path:
                self._pinned.discard(node.id)
                if not node.on_device and not node.children and node.host_candidate is None:
                    self._add_host_candidate(node)
        return self.match_prefix(key[:pos], namespace, record_hit=False)

    def _attach(self, parent: TreeNode, ck: Any, leaf: TreeNode) -> None:
        if parent.candidate is not None:  # parent stops being a leaf
            self._drop_candidate(parent)
        leaf.child_key = ck
        parent.children[ck] = leaf
        self._evictable_tokens += len(leaf.key)
        self._add_candidate(leaf)

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Split `child`'s edge after `n` tokens; returns the new upper node."""
        size = self.page_size
        parent = child.parent
        upper = TreeNode(child.key[:n], child.pages[: n // size], parent, child.last_access)
        upper.lock_ref = child.lock_ref
        upper.hit_count = child.hit_count
        upper.created = child.created
        upper.child_key = child.child_key
        parent.children[upper.child_key] = upper
        if child.host_pages is not None:
            upper.host_pages = child.host_pages[: n // size]
            child.host_pages = child.host_pages[n // size :]
        child.key = child.key[n:]
        child.pages = child.pages[n // size :]
        child.parent = upper
        child.depth = upper.depth + n
        child.child_key = child.key[0] if size == 1 else child.key[:size]
        upper.children[child.child_key] = child
        if child.candidate is not None:  # its priority may depend on depth or length
            self._drop_candidate(child)
            self._add_candidate(child)
        return upper

    def _touch(self, node: TreeNode, now: int, hit: bool) -> None:
        self.policy.on_access(node, now, hit)  # sees the node's statistics before this access
        node.last_access = now
        if hit:
            node.hit_count += 1
        if node.candidate is not None:
            self._drop_candidate(node)
            self._add_candidate(node)
        if node.host_candidate is not None:
            self._drop_host_candidate(node)
            self._add_host_candidate(node)

    # -- locks ---------------------------------------------------------------------------------
    def lock(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable_tokens -= len(node.key)
                self._protected_tokens += len(node.key)
                if node.candidate is not None:
                    self._drop_candidate(node)
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
                if not self._has_device_child(node):
                    self._add_candidate(node)
            node = node.parent

    # -- eviction ------------------------------------------------------------------------------
    def _add_candidate(self, node: TreeNode) -> None:
        entry = (self.policy.priority(node, len(node.key)), node.id, node)
        node.candidate = entry
        self._candidates.add(entry)

    def _drop_candidate(self, node: TreeNode) -> None:
        self._candidates.remove(node.candidate)
        node.candidate = None

    def evict(self, num_tokens: int) -> int:
        """Evict from the least valuable leaves until `num_tokens` are freed or none is left.

        Eviction is page-granular and takes a leaf's tail first (the deepest tokens, the last
        a future match would reach). When the policy ranks a leaf by its tail page
        (`page_granular`), the victim loses pages only while it stays the lowest-ranked
        candidate, then is re-ranked by its new tail; otherwise all its pages rank alike and it
        loses as many as are still needed.
        """
        freed = 0
        size = self.page_size
        granular = self.policy.page_granular
        while freed < num_tokens and self._candidates:
            node = self._candidates.pop(0)[2]
            node.candidate = None
            self.policy.on_evict(node, self._clock)
            keep = len(node.key)
            if granular:
                # rank the runner-up afresh: a policy's ranks may drift with its learned state
                nxt = self._candidates[0][2] if self._candidates else None
                runner_up = self.policy.priority(nxt, len(nxt.key)) if nxt is not None else None
                while keep and freed < num_tokens:
                    keep -= size
                    freed += size
                    if keep and runner_up is not None and self.policy.priority(node, keep) > runner_up:
                        break
            else:
                drop = min(keep, -(-(num_tokens - freed) // size) * size)
                keep -= drop
                freed += drop
            if self.host is not None:
                self._demote(node, keep)
            elif keep:
                self._trim_leaf(node, keep)
            else:
                self._delete_leaf(node)
        self.stats_evicted_tokens += freed
        return freed

    def _demote(self, node: TreeNode, keep: int) -> None:
        """Move `node`'s tokens past `keep` to the host tier (or drop them when it is full)."""
        if keep:
            self._split(node, keep)  # `node` is now the tail below a device-resident upper part
        if node.host_pages is None:
            node.host_pages = self._host_save(node.pages)
        if node.host_pages is None:  # no room one tier down: forget the tail and what hangs below
            self._drop_host_subtree(node)
            self._delete_leaf(node)
            return
        self._evictable_tokens -= len(node.key)
        self.allocator.decref(node.pages)
        node.pages = []
        if not node.children:
            self._add_host_candidate(node)
        parent = node.parent
        if parent is not self.root and parent.lock_ref == 0 and not self._has_device_child(parent):
            self._add_candidate(parent)

    def _trim_leaf(self, node: TreeNode, keep: int) -> None:
        dropped = node.pages[keep // self.page_size :]
        node.key = node.key[:keep]
        node.pages = node.pages[: keep // self.page_size]
        self._evictable_tokens -= len(dropped) * self.page_size
        self.allocator.decref(dropped)
        self._add_candidate(node)

    def _delete_leaf(self, node: TreeNode) -> None:
        parent = node.parent
        del parent.children[node.child_key]
        self._evictable_tokens -= len(node.key)
        self.allocator.decref(node.pages)
        if node.host_pages is not None:
            self.host.allocator.decref(node.host_pages)
        if parent is not self.root and parent.lock_ref == 0 and parent.candidate is None \
                and not self._has_device_child(parent):
            self._add_candidate(parent)

    def reset(self) -> None:
        if self._protected_tokens:
            raise CacheInvariantError(
                f"reset with {self._protected_tokens} token(s) still locked by running requests"
            )
        for node in self._iter_nodes():
            self.allocator.decref(node.pages)
            if node.host_pages is not None:
                self.host.allocator.decref(node.host_pages)
        self._init_tree()

    # -- inspection ----------------------------------------------------------------------------
    def _iter_nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def cached_pages(self) -> set[int]:
        pages: set[int] = set()
        for node in self._iter_nodes():
            pages.update(node.pages)
        return pages

    def pretty(self) -> str:
        """The tree as indented text (for debugging)."""
        lines: list[str] = []

        def walk(node: TreeNode, indent: int) -> None:
            for child in node.children.values():
                where = "" if child.host_pages is None else f" host={child.host_pages[:4]}"
                lines.append(f"{' ' * indent}{len(child.key)} tok lock={child.lock_ref} "
                             f"pages={child.pages[:4]}{'...' if len(child.pages) > 4 else ''}{where}")
                walk(child, indent + 2)

        walk(self.root, 0)
        return "\n".join(lines)

    def check_invariants(self, inflight_pages: int | None = None) -> None:
        size = self.page_size
        seen: set[int] = set()
        evictable = protected = 0
        leaves: set[int] = set()
        host_seen: set[int] = set()
        host_leaves: set[int] = set()
        for node in self._iter_nodes():
            stored = node.pages if node.on_device else (node.host_pages or [])
            if not node.key or len(node.key) != len(stored) * size:
                raise CacheInvariantError(f"{node}: {len(node.key)} tokens on {len(stored)} pages")
            if node.host_pages is not None:
                if self.host is None or len(node.host_pages) * size != len(node.key):
                    raise CacheInvariantError(f"{node}: host pages without a host tier, or the wrong number")
                for p in node.host_pages:
                    if p in host_seen or self.host.allocator.refcount(p) < 1:
                        raise CacheInvariantError(f"host page {p} is owned twice or not allocated")
                    host_seen.add(p)
            if not node.on_device:
                if node.lock_ref:
                    raise CacheInvariantError(f"{node}: a host-only node is locked")
                if any(c.on_device for c in node.children.values()):
                    raise CacheInvariantError(f"{node}: host-only node with a device-resident child")
                if not node.children:
                    host_leaves.add(node.id)
                continue
            if node.parent.children.get(node.child_key) is not node:
                raise CacheInvariantError(f"{node} is not indexed under its child key")
            first = node.key[0] if size == 1 else node.key[:size]
            ck = node.child_key[1] if node.parent is self.root else node.child_key
            if ck != first:
                raise CacheInvariantError(f"{node}: child key does not match its first page")
            if node.lock_ref < sum(c.lock_ref for c in node.children.values()):
                raise CacheInvariantError(f"{node}: lock_ref below its children's")
            expect_depth = node.parent.depth + len(node.parent.key)
            if node.depth != expect_depth:
                raise CacheInvariantError(f"{node}: depth {node.depth} != {expect_depth}")
            for p in node.pages:
                if p in seen:
                    raise CacheInvariantError(f"page {p} is owned by two tree nodes")
                seen.add(p)
                if self.allocator.refcount(p) < 1:
                    raise CacheInvariantError(f"tree page {p} has no allocator reference")
            if node.lock_ref > 0:
                protected += len(node.key)
            else:
                evictable += len(node.key)
                if not self._has_device_child(node):
                    leaves.add(node.id)
        if (evictable, protected) != (self._evictable_tokens, self._protected_tokens):
            raise CacheInvariantError(
                f"counters say evictable={self._evictable_tokens} protected="
                f"{self._protected_tokens}, tree holds {evictable} and {protected}"
            )
        if {e[1] for e in self._candidates} != leaves or len(self._candidates) != len(leaves):
            raise CacheInvariantError("eviction candidates are not exactly the unlocked leaves")
        if {e[1] for e in self._host_candidates} != host_leaves or len(self._host_candidates) != len(host_leaves):
            raise CacheInvariantError("host eviction candidates are not exactly the host-only leaves")
        if self.host is not None:
            self.host.allocator.check_invariants()
            if self.host.allocator.free_pages + len(host_seen) != self.host.allocator.num_pages:
                raise CacheInvariantError(f"host tier: {self.host.allocator.free_pages} free + {len(host_seen)} "
                                          f"in the tree != {self.host.allocator.num_pages} pages")
        self.allocator.check_invariants()
        tree_pages = len(seen)
        if inflight_pages is not None:
            total = self.allocator.free_pages + tree_pages + inflight_pages
            if total != self.allocator.num_pages:
                raise CacheInvariantError(
                    f"free {self.allocator.free_pages} + cached {tree_pages} + in-flight "
                    f"{inflight_pages} = {total} pages, pool has {self.allocator.num_pages}"
                )
        elif tree_pages > self.allocator.used_pages:
            raise CacheInvariantError("the tree holds more pages than are allocated")
