"""HostLRU: the host tier's eviction order, over the tree's host-only leaves.

Entries are `(last_access, node id, node)`, least recently used first; the node keeps its entry
in `host_candidate`. A node being loaded or attached to is *pinned*: never a candidate until
unpinned (making room on either tier must not drop it). Retention is ignored here: it orders
device eviction only.
"""

from __future__ import annotations

from sortedcontainers import SortedList

from radixkv.mem.tree_node import TreeNode


class HostLRU:
    """Host-only leaves, least recently used first (see the module docstring)."""

    def __init__(self) -> None:
        self._entries: SortedList = SortedList()
        self._pinned: set[int] = set()

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self):
        return iter(self._entries)

    def add(self, node: TreeNode) -> None:
        if node.id in self._pinned:
            return
        entry = (node.last_access, node.id, node)
        node.host_candidate = entry
        self._entries.add(entry)

    def drop(self, node: TreeNode) -> None:
        self._entries.remove(node.host_candidate)
        node.host_candidate = None

    def touch(self, node: TreeNode) -> None:
        """`node`'s access time moved: its entry moves with it."""
        self.drop(node)
        self.add(node)

    def pop(self) -> TreeNode:
        """The least recently used candidate, no longer one."""
        node = self._entries.pop(0)[2]
        node.host_candidate = None
        return node

    def pin(self, node: TreeNode) -> None:
        self._pinned.add(node.id)
        if node.host_candidate is not None:
            self.drop(node)

    def unpin(self, node: TreeNode) -> None:
        """`node` may be a candidate again (if it still is a host-only leaf)."""
        self._pinned.discard(node.id)
        if not node.on_device and not node.children and node.host_candidate is None:
            self.add(node)
