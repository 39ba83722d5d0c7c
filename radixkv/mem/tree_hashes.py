"""The block hash (`radixkv.mem.block_hash`) of each page of the radix tree.

A node's page hashes are computed once, down from the nearest ancestor that has them, and kept
on the node (`block_hashes`; a split slices them). The storage tier keys pages by them, the KV
events announce their ids, and the miss causes' ghost index remembers them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from radixkv.mem import block_hash
from radixkv.mem.radix_tree import RadixTree
from radixkv.mem.tree_node import TreeNode

Namespace = Any


def node_hashes(node: TreeNode, page_size: int) -> list[bytes]:
    """The block hashes of `node`'s pages (`node` is not the root)."""
    path = []  # from `node` up to the first ancestor whose hashes are known, below the root
    while node.block_hashes is None and node.parent is not None:
        path.append(node)
        node = node.parent
    for child in reversed(path):
        parent = child.parent
        prev = parent.block_hashes[-1] if parent.parent is not None else block_hash.root(child.child_key[0])
        child.block_hashes = list(block_hash.chain(prev, child.key, page_size))
    return (path[0] if path else node).block_hashes


def parent_hash(node: TreeNode, page_size: int) -> bytes | None:
    """The hash of the page before `node`'s first page (None under the root)."""
    parent = node.parent
    return None if parent.parent is None else node_hashes(parent, page_size)[-1]


def hash_before(tree: RadixTree, key: tuple, end: int, namespace: Namespace, page_size: int) -> bytes | None:
    """The hash of the page that ends `end` tokens into `key` (the namespace's root at 0), from
    the tree's path; None if the tree does not hold that far."""
    if end == 0:
        return block_hash.root(namespace)
    for child, n in tree.walk(key[:end], namespace):
        if child.depth < end <= child.depth + n:
            return node_hashes(child, page_size)[(end - child.depth) // page_size - 1]
    return None


class TreeHashes:
    """The block hashes of a tree's pages and of a key's pages along it."""

    def __init__(self, page_size: int):
        self.page_size = page_size

    def of(self, node: TreeNode) -> list[bytes]:
        return node_hashes(node, self.page_size)

    def before(self, tree: RadixTree, key: tuple, end: int, namespace: Namespace) -> bytes | None:
        return hash_before(tree, key, end, namespace, self.page_size)

    def chain(self, tree: RadixTree, key: Sequence[int], start: int, namespace: Namespace = None) -> Iterator[bytes]:
        """The hashes of `key`'s whole pages from token `start` on (a page boundary the tree
        holds), computed lazily; empty if the tree does not hold `key` that far."""
        prev = self.before(tree, tuple(key), start, namespace)
        if prev is None:
            return iter(())
        return block_hash.chain(prev, key[start:len(key) // self.page_size * self.page_size], self.page_size)

    def after(self, prev: bytes, tokens: Sequence[int]) -> Iterator[bytes]:
        """Hashes of the whole pages of `tokens`, continuing after the page hashed `prev`."""
        return block_hash.chain(prev, tokens, self.page_size)
