"""RadixCache: a radix tree of token prefixes over reference-counted KV pages.

Structure. Each node (`radixkv.mem.tree_node.TreeNode`) owns an edge: `key` (a tuple of token
ids) and `pages` (the page ids that store those tokens' KV, `len(key) == len(pages) *
page_size`). With `page_size > 1` every edge, match and split is page-aligned, so a page is never
shared between two edges. Children are indexed by their edge's first page of tokens; at the
root the index also carries the request's namespace, so equal tokens under different namespaces
never share.

Ownership. The tree holds one allocator reference on every page of every node. Evicting a node
drops those references; a page is freed once no running request holds it either.

Locks. `lock(node)` adds one to `lock_ref` of the node and every ancestor (below the root), so
`lock_ref(node) >= sum(lock_ref(child))`. A node with `lock_ref > 0` is *protected*: a running
request reads it. A node with `lock_ref == 0` is *evictable*; only evictable *leaves* are
eviction candidates, kept in rank order (`radixkv.mem.candidates`; see Retention).
Evicting a leaf can turn its parent into a candidate.

Retention. `retain` gives the nodes of a just-cached path a deadline (`retain_until`, seconds
on the cache's `clock`; a client's hint, `radixkv.retention`). A candidate's rank is
(retention, policy priority): leaves not retained come first, by the policy; retained leaves
(deadline ahead) after all of them, earliest deadline first. Retained leaves stay evictable, so
`evictable_tokens`, admission and reservation never change: a hint cannot block anything.
Deadlines run out as the clock moves without anything touching the node, so a candidate's
retained flag can be stale; `evict` first re-ranks every flagged candidate whose deadline has
passed (each re-rank clears a flag, so it terminates), and then all flags are true at its clock
reading. A parent's deadline is never earlier than its child's (retaining a node retains its
path; a split copies the deadline), so a retained leaf's eviction never exposes an unretained
parent.

Matching. `peek` walks the tree and changes nothing; it may end inside an edge. `settle` splits
that edge so the match ends on a node (the one a request locks); `record_use` moves the path's
statistics once the request is admitted. A peek records the tree's change count (`epoch`):
changes to what a key matches (eviction, a new leaf, a move between tiers) make `settle` match
again, while splits never invalidate a peek (a split keeps the lower node, and `settle` finds the
upper one by depth). The scheduler peeks and settles within one step, when nothing is inserted,
so it matches once per request per step unless admission had to evict.

Tiers. `radixkv.mem.tiered_cache.HostTieredCache` is this tree with a host tier below it; it
overrides the hooks marked "tier hook" and nothing here knows about it.

Events. With `events` set (a `radixkv.mem.cache_events.CacheEventLog`), every change to which
pages the tree holds is recorded there: a new leaf's pages stored, evicted pages removed, a
reset cleared (`--kv-events-config`). Splits change no page, so they record nothing.

Invariants (`radixkv.mem.cache_checks`, via `check_invariants`):
  free_pages + evictable_pages + protected_pages + inflight_pages == num_pages
where inflight pages are held by running requests and not by the tree; each tree page appears
in exactly one node and has a reference count >= 1; the candidate set is exactly the unlocked
leaves; `evictable_tokens` / `protected_tokens` equal the sums over unlocked / locked nodes; a
node's `retain_until` is at most its parent's (below the root); a candidate flagged retained
carries its node's current deadline, and one not flagged has a deadline no later than the clock
(it was not ahead when ranked, and the clock never goes back).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from radixkv.errors import CacheInvariantError
from radixkv.mem.allocator import PageAllocator
from radixkv.mem.cache_checks import check_tree
from radixkv.mem.candidates import EvictionCandidates
from radixkv.mem.base import InsertResult, MatchResult, Namespace, PrefixCache
from radixkv.mem.cache_events import GPU, CacheEventLog, node_hashes
from radixkv.mem.eviction import EvictionPolicy, make_policy
from radixkv.mem.tree_node import TreeNode

if TYPE_CHECKING:
    from radixkv.mem.miss_causes import GhostIndex
    from radixkv.retention import Retention

class RadixCache(PrefixCache):
    """Prefix cache over a `PageAllocator`; see the module docstring for the invariants."""

    node_type: type[TreeNode] = TreeNode

    def __init__(self, allocator: PageAllocator, eviction_policy: str | EvictionPolicy = "lru",
                 attention_scale: float | None = None, clock: Callable[[], float] = time.monotonic):
        self.allocator = allocator
        self.clock = clock  # seconds >= 0, never going back: what retention deadlines are read against
        self.page_size = allocator.page_size
        self.policy = make_policy(eviction_policy, attention_scale)
        self.events: CacheEventLog | None = None  # records page changes for KV events, when set
        self.ghosts: GhostIndex | None = None  # hashes of pages that left the cache (miss causes), when set
        self.reset_stats()
        self._init_tree()

    def _init_tree(self) -> None:
        self._clock = 0
        # changes to what keys match (never reset): a peek from an earlier epoch is matched again
        self.epoch = getattr(self, "epoch", -1) + 1
        self.root = self.node_type((), [], None, 0)
        self.root.lock_ref = 1  # the root is never evicted
        self.candidates = EvictionCandidates(self.policy, self.clock)
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
        return len(self.candidates)

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

    def _walk(self, key: tuple, namespace: Namespace) -> Iterator[tuple[TreeNode, int]]:
        """(node, tokens of its edge matched) along `key`'s path; the last may match partly."""
        node, pos = self.root, 0
        while pos < len(key):
            child = node.children.get(self._child_key(node, key, pos, namespace))
            if child is None:
                return
            n = self._match_len(child.key, key, pos)
            yield child, n
            if n < len(child.key):
                return
            pos += n
            node = child

    def peek(self, key: Sequence[int], namespace: Namespace = None) -> MatchResult:
        key = self._as_key(key)
        node, pos, pages = self.root, 0, []
        for child, n in self._walk(key, namespace):
            pages.extend(child.pages if n == len(child.key) else child.pages[: n // self.page_size])
            node, pos = child, pos + n
        return MatchResult(pages, pos, node, key=key, namespace=namespace, epoch=self.epoch)

    def continuation(self, key: Sequence[int], namespace: Namespace = None, limit: int = 8) -> list[int]:
        """Up to `limit` tokens the tree holds right after the whole of `key` (token-exact, not
        page-aligned): what followed the same sequence in an earlier request, along the most
        recently used branch. Empty when `key`'s path leaves the tree. Changes nothing."""
        key = key if isinstance(key, tuple) else tuple(key)
        node, pos = self.root, 0
        while pos < len(key):
            child = self._child_at(node, key, pos, namespace)
            if child is None:
                return []
            rest = key[pos: pos + len(child.key)]
            if child.key[: len(rest)] != rest:
                return []  # diverges inside the edge
            if pos + len(child.key) >= len(key):  # key ends inside (or at the end of) this edge
                node, out = child, list(child.key[len(rest): len(rest) + limit])
                break
            pos += len(child.key)
            node = child
        else:
            out = []
        while len(out) < limit and node.children:  # follow the most recent branch
            node = max(node.children.values(), key=lambda c: c.last_access)
            out.extend(node.key[: limit - len(out)])
        return out

    def _child_at(self, node: TreeNode, key: tuple, pos: int, namespace: Namespace) -> TreeNode | None:
        """The child of `node` whose edge starts with key[pos:] (or its first page)."""
        if len(key) - pos >= self.page_size:
            return node.children.get(self._child_key(node, key, pos, namespace))
        rest = key[pos:]  # less than a page left: any child starting with it
        fits = [c for ck, c in node.children.items()
                if c.key[: len(rest)] == rest and (node is not self.root or ck[0] == namespace)]
        return max(fits, key=lambda c: c.last_access, default=None)

    def settle(self, match: MatchResult) -> MatchResult:
        if match.epoch != self.epoch:  # the tree changed under it since: match again
            match = self.peek(match.key, match.namespace)
        node = self._node_ending_at(match.last_node, match.num_tokens)
        return match if node is match.last_node else replace(match, last_node=node)

    def _node_ending_at(self, node: TreeNode, end: int) -> TreeNode:
        """The node whose edge ends `end` tokens from the root, on the path through `node`
        (which contains that point, or sits below it after a split), splitting if needed."""
        while node is not self.root and node.depth >= end:  # split since: the end is above
            node = node.parent
        if node is not self.root and end < node.end:
            node = self._split(node, end - node.depth)
        return node

    def record_use(self, match: MatchResult) -> None:
        self._touch_path(match.last_node, self._tick())

    def _touch_path(self, last: TreeNode, now: int) -> None:
        """Record a hit on every node from the root down to `last`, in that order."""
        path = []
        while last is not self.root:
            path.append(last)
            last = last.parent
        for node in reversed(path):
            self._touch(node, now, hit=True)

    # -- mutation ------------------------------------------------------------------------------
    def insert_path(self, key: Sequence[int], pages: Sequence[int], namespace: Namespace = None) -> InsertResult:
        key = self._as_key(key)
        size = self.page_size
        if len(pages) < len(key) // size:
            raise ValueError(f"{len(pages)} page(s) cannot hold {len(key)} tokens of key")
        now = self._tick()
        node, pos, path_pages = self.root, 0, []
        while pos < len(key):
            ck = self._child_key(node, key, pos, namespace)
            child = node.children.get(ck)
            if child is None:
                new_pages = list(pages[pos // size : len(key) // size])
                self.allocator.incref(new_pages)
                leaf = self.node_type(key[pos:], new_pages, node, now)
                self.epoch += 1  # keys through here now match further
                self.policy.on_access(leaf, now, False)
                self._attach(node, ck, leaf)
                if self.events is not None:
                    self.events.stored(leaf, GPU)
                self._on_new_leaf(leaf)
                path_pages.extend(new_pages)
                return InsertResult(pos, MatchResult(path_pages, len(key), leaf, key=key, namespace=namespace,
                                                     epoch=self.epoch))
            n = self._match_len(child.key, key, pos)
            if n < len(child.key):
                child = self._split(child, n)
            if not child.on_device:  # the caller computed tokens a lower tier holds: adopt its pages
                self._adopt(child, list(pages[pos // size : (pos + n) // size]))
            self._touch(child, now, hit=False)
            path_pages.extend(child.pages)
            pos += n
            node = child
        return InsertResult(pos, MatchResult(path_pages, pos, node, key=key, namespace=namespace, epoch=self.epoch))

    def _on_new_leaf(self, leaf: TreeNode) -> None:
        """Tier hook: a new leaf was inserted."""

    def _adopt(self, node: TreeNode, pages: list[int]) -> None:
        """Tier hook: `node` (not on the device) takes the caller's `pages` for its edge."""
        raise CacheInvariantError(f"{node} has no device pages, and this tree has no lower tier")

    def _attach(self, parent: TreeNode, ck: Any, leaf: TreeNode) -> None:
        if parent.candidate is not None:  # parent stops being a leaf
            self.candidates.drop(parent)
        leaf.child_key = ck
        parent.children[ck] = leaf
        self._evictable_tokens += len(leaf.key)
        self.candidates.add(leaf)

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Split `child`'s edge after `n` tokens; returns the new upper node (`child` keeps the
        lower part, so whoever holds it still holds the same tokens)."""
        size = self.page_size
        parent = child.parent
        upper = self.node_type(child.key[:n], child.pages[: n // size], parent, child.last_access)
        upper.lock_ref = child.lock_ref
        upper.hit_count = child.hit_count
        upper.created = child.created
        upper.retain_until = child.retain_until
        upper.child_key = child.child_key
        if child.page_hashes is not None:
            upper.page_hashes, child.page_hashes = child.page_hashes[: n // size], child.page_hashes[n // size :]
        parent.children[upper.child_key] = upper
        child.key = child.key[n:]
        child.pages = child.pages[n // size :]
        child.parent = upper
        child.depth = upper.depth + n
        child.child_key = child.key[0] if size == 1 else child.key[:size]
        upper.children[child.child_key] = child
        if child.candidate is not None:  # its priority may depend on depth or length
            self.candidates.rerank(child)
        return upper

    def _touch(self, node: TreeNode, now: int, hit: bool) -> None:
        self.policy.on_access(node, now, hit)  # sees the node's statistics before this access
        node.last_access = now
        if hit:
            node.hit_count += 1
        if node.candidate is not None:
            self.candidates.rerank(node)

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
        """Device tokens whose deadline is ahead of the clock (walks only the retained part of
        the tree: below a node whose deadline has passed, every one has)."""
        now = self.clock()
        total, stack = 0, [c for c in self.root.children.values() if c.retain_until > now]
        while stack:
            node = stack.pop()
            if node.on_device:
                total += len(node.key)
            stack.extend(c for c in node.children.values() if c.retain_until > now)
        return total

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
                if self._is_device_leaf(node):
                    self.candidates.add(node)
            node = node.parent

    # -- eviction ------------------------------------------------------------------------------
    def _is_device_leaf(self, node: TreeNode) -> bool:
        """Tier hook: whether no child of `node` holds device pages (so it can be evicted)."""
        return not node.children

    def evict(self, num_tokens: int) -> int:
        """Evict from the lowest-ranked leaves until `num_tokens` are freed or none is left
        (retained leaves last; flags gone stale are re-ranked first, see the module docstring).

        Eviction is page-granular and takes a leaf's tail first (the deepest tokens, the last
        a future match would reach). When the policy ranks a leaf by its tail page
        (`page_granular`), the victim loses pages only while it stays the lowest-ranked
        candidate, then is re-ranked by its new tail; otherwise all its pages rank alike and it
        loses as many as are still needed.
        """
        freed = 0
        size = self.page_size
        granular = self.policy.page_granular
        candidates = self.candidates
        now = candidates.expire() if num_tokens > 0 else None
        while freed < num_tokens and candidates:
            node = candidates.pop_lowest()
            self.policy.on_evict(node, self._clock)
            keep = len(node.key)
            if granular:
                # rank the runner-up afresh: a policy's ranks may drift with its learned state
                nxt = candidates.lowest()
                runner_up = candidates.rank(nxt, len(nxt.key), now) if nxt is not None else None
                while keep and freed < num_tokens:
                    keep -= size
                    freed += size
                    if keep and runner_up is not None and candidates.rank(node, keep, now) > runner_up:
                        break
            else:
                drop = min(keep, -(-(num_tokens - freed) // size) * size)
                keep -= drop
                freed += drop
            self.epoch += 1
            self._evict_tail(node, keep)
        self.stats_evicted_tokens += freed
        return freed

    def _evict_tail(self, node: TreeNode, keep: int) -> None:
        """Tier hook: the unlocked leaf `node` gives up its tokens past `keep`."""
        if keep:
            self._trim_leaf(node, keep)
        else:
            self._delete_leaf(node)

    def _trim_leaf(self, node: TreeNode, keep: int) -> None:
        if self.ghosts is not None:
            self.ghosts.add(node_hashes(node, self.page_size)[keep // self.page_size:])
        if self.events is not None:
            self.events.removed(node, GPU, keep // self.page_size)
        if node.page_hashes is not None:
            node.page_hashes = node.page_hashes[: keep // self.page_size]
        dropped = node.pages[keep // self.page_size :]
        node.key = node.key[:keep]
        node.pages = node.pages[: keep // self.page_size]
        self._evictable_tokens -= len(dropped) * self.page_size
        self.allocator.decref(dropped)
        self.candidates.add(node)

    def _delete_leaf(self, node: TreeNode) -> None:
        if self.ghosts is not None:
            self.ghosts.add(node_hashes(node, self.page_size))
        if self.events is not None:
            self.events.removed(node, GPU)
        parent = node.parent
        del parent.children[node.child_key]
        self._evictable_tokens -= len(node.key)
        self.allocator.decref(node.pages)
        self._release_node(node)
        if parent is not self.root and parent.lock_ref == 0 and parent.candidate is None \
                and self._is_device_leaf(parent):
            self.candidates.add(parent)

    def _release_node(self, node: TreeNode) -> None:
        """Tier hook: `node` leaves the tree for good (what it holds below the device goes too)."""

    def reset(self) -> None:
        if self._protected_tokens:
            raise CacheInvariantError(
                f"reset with {self._protected_tokens} token(s) still locked by running requests"
            )
        for node in self.nodes():
            self.allocator.decref(node.pages)
            self._release_node(node)
        self._init_tree()
        if self.events is not None:
            self.events.cleared()

    # -- inspection ----------------------------------------------------------------------------
    def nodes(self) -> Iterator[TreeNode]:
        """Every node but the root, parents before their children (for inspection and checks)."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def cached_pages(self) -> set[int]:
        pages: set[int] = set()
        for node in self.nodes():
            pages.update(node.pages)
        return pages

    def pretty(self) -> str:
        """The tree as indented text (for debugging)."""
        lines: list[str] = []

        def walk(node: TreeNode, indent: int) -> None:
            for child in node.children.values():
                lines.append(f"{' ' * indent}{len(child.key)} tok lock={child.lock_ref} "
                             f"pages={child.pages[:4]}{'...' if len(child.pages) > 4 else ''}{self._describe(child)}")
                walk(child, indent + 2)

        walk(self.root, 0)
        return "\n".join(lines)

    def _describe(self, node: TreeNode) -> str:
        """Tier hook: what `pretty` adds about `node`."""
        return ""

    def check_invariants(self, inflight_pages: int | None = None) -> None:
        check_tree(self, inflight_pages)
