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

_node_ids = itertools.count()


class TreeNode:
    """One edge of the radix tree and the statistics eviction policies read."""

    __slots__ = (
        "id", "key", "pages", "parent", "children", "child_key", "lock_ref",
        "last_access", "hit_count", "created", "depth", "candidate", "meta",
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
    ):
        self.allocator = allocator
        self.page_size = allocator.page_size
        self.policy = make_policy(eviction_policy, attention_scale)
        self.reset_stats()
        self._init_tree()

    def _init_tree(self) -> None:
        self._clock = 0
        self.root = TreeNode((), [], None, 0)
        self.root.lock_ref = 1  # the root is never evicted
        self._candidates: SortedList = SortedList()
        self._evictable_tokens = 0
        self._protected_tokens = 0

    def reset_stats(self) -> None:
        self.stats_evicted_tokens = 0

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
        while pos < len(key):
            child = node.children.get(self._child_key(node, key, pos, namespace))
            if child is None:
                break
            n = self._match_len(child.key, key, pos)
            if n < len(child.key):
                child = self._split(child, n)
            if record_hit:
                self._touch(child, now, hit=True)
            pages.extend(child.pages)
            pos += n
            node = child
        return MatchResult(pages, pos, node)

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
                return pos
            n = self._match_len(child.key, key, pos)
            if n < len(child.key):
                child = self._split(child, n)
            self._touch(child, now, hit=False)
            pos += n
            node = child
        return pos

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
                if not node.children:
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
            if keep:
                self._trim_leaf(node, keep)
            else:
                self._delete_leaf(node)
        self.stats_evicted_tokens += freed
        return freed

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
        if parent is not self.root and not parent.children and parent.lock_ref == 0:
            self._add_candidate(parent)

    def reset(self) -> None:
        if self._protected_tokens:
            raise CacheInvariantError(
                f"reset with {self._protected_tokens} token(s) still locked by running requests"
            )
        for node in self._iter_nodes():
            self.allocator.decref(node.pages)
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
                lines.append(f"{' ' * indent}{len(child.key)} tok lock={child.lock_ref} "
                             f"pages={child.pages[:4]}{'...' if len(child.pages) > 4 else ''}")
                walk(child, indent + 2)

        walk(self.root, 0)
        return "\n".join(lines)

    def check_invariants(self, inflight_pages: int | None = None) -> None:
        size = self.page_size
        seen: set[int] = set()
        evictable = protected = 0
        leaves: set[int] = set()
        for node in self._iter_nodes():
            if not node.key or len(node.key) != len(node.pages) * size:
                raise CacheInvariantError(f"{node}: {len(node.key)} tokens on {len(node.pages)} pages")
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
                if not node.children:
                    leaves.add(node.id)
        if (evictable, protected) != (self._evictable_tokens, self._protected_tokens):
            raise CacheInvariantError(
                f"counters say evictable={self._evictable_tokens} protected="
                f"{self._protected_tokens}, tree holds {evictable} and {protected}"
            )
        if {e[1] for e in self._candidates} != leaves or len(self._candidates) != len(leaves):
            raise CacheInvariantError("eviction candidates are not exactly the unlocked leaves")
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
