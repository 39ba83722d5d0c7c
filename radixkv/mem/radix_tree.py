"""RadixTree: the shape of the radix tree of token prefixes, and the walks along it.

Each node (`radixkv.mem.tree_node.TreeNode`) owns an edge: `key` (a tuple of token ids) and the
pages that store those tokens' KV, on the device (`pages`) or a lower tier (`host_pages`). With
`page_size > 1` every edge, match and split is page-aligned, so a page is never shared between
two edges. Children are indexed by their edge's first page of tokens; at the root the index also
carries the request's namespace, so equal tokens under different namespaces never share.

This module knows only the shape: how a key walks the tree, how an edge splits. Which pages a
node holds, locks, eviction and the tiers are the cache manager's (`radixkv.mem.radix_cache`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from radixkv.mem.tree_node import TreeNode

Namespace = Any


class RadixTree:
    """The tree's nodes under `root`, for pages of `page_size` tokens."""

    def __init__(self, page_size: int):
        self.page_size = page_size
        self.root = TreeNode((), [], None, 0)
        self.root.lock_ref = 1  # the root is never evicted

    # -- keys ----------------------------------------------------------------------------------
    def child_key(self, node: TreeNode, key: tuple, start: int, namespace: Namespace) -> Any:
        """The index in `node.children` of the child `key[start:]` would go through."""
        size = self.page_size
        first = key[start] if size == 1 else key[start : start + size]
        return (namespace, first) if node is self.root else first

    def match_len(self, edge: tuple, key: tuple, start: int) -> int:
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

    def as_key(self, key: Sequence[int]) -> tuple:
        """`key` as a tuple of whole pages (a partial last page dropped)."""
        key = key if isinstance(key, tuple) else tuple(key)
        extra = len(key) % self.page_size
        return key[: len(key) - extra] if extra else key

    # -- walks ---------------------------------------------------------------------------------
    def walk(self, key: tuple, namespace: Namespace) -> Iterator[tuple[TreeNode, int]]:
        """(node, tokens of its edge matched) along `key`'s path; the last may match partly."""
        node, pos = self.root, 0
        while pos < len(key):
            child = node.children.get(self.child_key(node, key, pos, namespace))
            if child is None:
                return
            n = self.match_len(child.key, key, pos)
            yield child, n
            if n < len(child.key):
                return
            pos += n
            node = child

    def match(self, key: tuple, namespace: Namespace) -> tuple[TreeNode, int, list[int], int]:
        """(last node, tokens, device pages) of `key`'s longest device-resident prefix, and how
        many more tokens of it host-only nodes hold (the match going on one tier down)."""
        node, pos, pages, host = self.root, 0, [], 0
        for child, n in self.walk(key, namespace):
            if host or not child.on_device:
                host += n
                continue
            pages.extend(child.pages if n == len(child.key) else child.pages[: n // self.page_size])
            node, pos = child, pos + n
        return node, pos, pages, host

    def host_path(self, match: Any, split: Callable[[TreeNode, int], TreeNode] | None = None) -> list[TreeNode]:
        """The host-only nodes continuing `match` (a `MatchResult`) along its key, as far as they
        still are in the tree; with `split`, the last is split at the match's end by it."""
        path, node = [], match.last_node
        pos, end = match.num_tokens, match.num_tokens + match.host_tokens
        while pos < end:
            node = node.children.get(self.child_key(node, match.key, pos, match.namespace))
            if node is None:  # the host tier let it go since (its LRU made room)
                break
            if split is not None and pos + len(node.key) > end:
                node = split(node, end - pos)
            path.append(node)
            pos += len(node.key)
        return path

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
            return node.children.get(self.child_key(node, key, pos, namespace))
        rest = key[pos:]  # less than a page left: any child starting with it
        fits = [c for ck, c in node.children.items()
                if c.key[: len(rest)] == rest and (node is not self.root or ck[0] == namespace)]
        return max(fits, key=lambda c: c.last_access, default=None)

    def nodes(self) -> Iterator[TreeNode]:
        """Every node but the root, parents before their children (for inspection and checks)."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def retained_tokens(self, now: float) -> int:
        """Device tokens whose retention deadline is ahead of `now` (walks only the retained
        part of the tree: below a node whose deadline has passed, every one has)."""
        total, stack = 0, [c for c in self.root.children.values() if c.retain_until > now]
        while stack:
            node = stack.pop()
            if node.on_device:
                total += len(node.key)
            stack.extend(c for c in node.children.values() if c.retain_until > now)
        return total

    # -- shape changes -------------------------------------------------------------------------
    def split(self, child: TreeNode, n: int) -> TreeNode:
        """Split `child`'s edge after `n` tokens; returns the new upper node (`child` keeps the
        lower part, so whoever holds it still holds the same tokens). Every per-page field
        (device and host pages, page hashes, storage keys) is split with the edge."""
        size = self.page_size
        k = n // size
        parent = child.parent
        upper = TreeNode(child.key[:n], child.pages[:k], parent, child.last_access)
        upper.lock_ref = child.lock_ref
        upper.hit_count = child.hit_count
        upper.created = child.created
        upper.retain_until = child.retain_until
        upper.child_key = child.child_key
        upper.from_storage = child.from_storage
        if child.block_hashes is not None:
            upper.block_hashes, child.block_hashes = child.block_hashes[:k], child.block_hashes[k:]
        if child.host_pages is not None:
            upper.host_pages, child.host_pages = child.host_pages[:k], child.host_pages[k:]
        parent.children[upper.child_key] = upper
        child.key = child.key[n:]
        child.pages = child.pages[k:]
        child.parent = upper
        child.depth = upper.depth + n
        child.child_key = child.key[0] if size == 1 else child.key[:size]
        upper.children[child.child_key] = child
        return upper

    def pretty(self, describe: Callable[[TreeNode], str]) -> str:
        """The tree as indented text (for debugging); `describe` adds what a tier knows of a node."""
        lines: list[str] = []

        def walk(node: TreeNode, indent: int) -> None:
            for child in node.children.values():
                lines.append(f"{' ' * indent}{len(child.key)} tok lock={child.lock_ref} "
                             f"pages={child.pages[:4]}{'...' if len(child.pages) > 4 else ''}{describe(child)}")
                walk(child, indent + 2)

        walk(self.root, 0)
        return "\n".join(lines)
