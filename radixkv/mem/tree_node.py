"""TreeNode: one edge of the radix tree, and the statistics eviction policies read.

A node owns its edge: `key` (a tuple of token ids) and `pages` (the page ids storing those
tokens' KV, `len(key) == len(pages) * page_size`). `children` are indexed by their edge's first
page of tokens (at the root, together with the request's namespace). The tree keeps every other
field up to date; policies may read them (see `radixkv.mem.eviction`) and keep their own state
in `meta`. `retain_until` is a client's retention hint (`radixkv.retention`), which the cache
ranks above any policy's priority.

Where the edge's KV is: `pages` on the device (empty for a node only a lower tier holds),
`host_pages` on the host tier (None without a copy there). `block_hashes` name its pages
(`radixkv.mem.tree_hashes`: the storage tier's keys, the KV events' ids; computed once asked for). The cache manager's tier
controller (`radixkv.mem.tier_controller`) moves the pages and keeps these fields.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

_node_ids = itertools.count()

NOT_RETAINED = -math.inf
"""The retention part of the eviction rank of a candidate not retained: before every deadline."""


class TreeNode:
    """One edge of the radix tree (see the module docstring)."""

    __slots__ = ("id", "key", "pages", "parent", "children", "child_key", "lock_ref", "last_access",
                 "hit_count", "created", "depth", "candidate", "meta", "block_hashes", "retain_until",
                 "host_pages", "host_candidate", "from_storage")

    def __init__(self, key: tuple, pages: list[int], parent: TreeNode | None, now: int):
        self.id = next(_node_ids)
        self.key = key  # tokens of this edge
        self.pages = pages  # page ids storing `key` (empty only for a node of a lower tier)
        self.parent = parent
        self.children: dict[Any, TreeNode] = {}
        self.child_key: Any = None  # this node's index in parent.children
        self.lock_ref = 0  # running requests reading this node (or a node below it)
        self.last_access = now  # the tree's logical clock at the last match or insert through it
        self.hit_count = 0  # matches through this node that a request used
        self.created = now
        self.depth = 0 if parent is None else parent.depth + len(parent.key)  # tokens above the edge
        self.candidate: tuple | None = None  # entry in the eviction candidate set, if any
        self.meta: Any = None  # free for an eviction policy's own per-node state
        self.block_hashes: list[bytes] | None = None  # one block hash per page, once asked for
        # retention deadline, on the cache's clock (seconds; 0.0: never retained): until then the
        # node is evicted only when no unretained leaf is left. Never earlier than a child's.
        self.retain_until = 0.0
        self.host_pages: list[int] | None = None  # host-tier copy of `key`, if any
        self.host_candidate: tuple | None = None  # entry in the host tier's LRU, if any
        self.from_storage = False  # installed from storage and not yet loaded on to the device

    @property
    def on_device(self) -> bool:
        """Whether the edge's KV is in the device pool (a lower tier may hold it instead)."""
        return bool(self.pages)

    @property
    def num_tokens(self) -> int:
        return len(self.key)

    @property
    def end(self) -> int:
        """Tokens from the root to the end of this node's edge."""
        return self.depth + len(self.key)

    def is_leaf(self) -> bool:
        return not self.children

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, tokens={len(self.key)}, lock_ref={self.lock_ref})"

