"""StorageKeys: the storage tier's name for each page of the tree, and of a key's pages.

A page's storage key is its block hash (`radixkv.mem.block_hash`) seeded with the server's
storage `identity`, so it names the same KV bytes on every start. A node's keys are computed
once, down from the nearest ancestor that has them, and kept on the node (`storage_keys`, split
with it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from radixkv.mem.page_keys import chain, root_key
from radixkv.mem.radix_tree import RadixTree
from radixkv.mem.tree_node import TreeNode

Namespace = Any


class StorageKeys:
    """The storage keys of `tree`'s pages under `identity`."""

    def __init__(self, identity: bytes, page_size: int):
        self.identity = identity
        self.page_size = page_size
        self._roots: dict[Any, bytes] = {}

    def root(self, namespace: Namespace) -> bytes:
        """The chain's seed for `namespace`."""
        key = self._roots.get(namespace)
        if key is None:
            key = self._roots[namespace] = root_key(self.identity, namespace)
        return key

    def of(self, tree: RadixTree, node: TreeNode) -> list[bytes]:
        """The storage keys of `node`'s pages (computed down from the nearest node that has them)."""
        path = []
        while node.storage_keys is None:
            path.append(node)
            node = node.parent
            if node is tree.root:
                break
        for child in reversed(path):
            parent = child.parent
            prev = self.root(child.child_key[0]) if parent is tree.root else parent.storage_keys[-1]
            child.storage_keys = list(chain(prev, child.key, self.page_size))
        return (path[0] if path else node).storage_keys

    def before(self, tree: RadixTree, key: tuple, end: int, namespace: Namespace) -> bytes | None:
        """The key of the page that ends `end` tokens into `key` (the root's key at 0), from the
        tree's path; None if the tree does not hold that far."""
        if end == 0:
            return self.root(namespace)
        for child, n in tree.walk(key, namespace):
            if child.depth < end <= child.depth + n:
                return self.of(tree, child)[(end - child.depth) // self.page_size - 1]
        return None

    def chain(self, tree: RadixTree, key: Sequence[int], start: int, namespace: Namespace = None) -> Iterator[bytes]:
        """The storage keys of `key`'s whole pages from token `start` on (a page boundary the
        tree holds), computed lazily; empty if the tree does not hold `key` that far."""
        prev = self.before(tree, tuple(key), start, namespace)
        if prev is None:
            return iter(())
        return chain(prev, key[start:len(key) // self.page_size * self.page_size], self.page_size)

    def after(self, prev: bytes, tokens: Sequence[int]) -> Iterator[bytes]:
        """Keys of the whole pages of `tokens`, continuing after the page keyed `prev`."""
        return chain(prev, tokens, self.page_size)
