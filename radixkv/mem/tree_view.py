"""The radix tree as plain records, for `GET /cache_tree` and the dashboard.

`tree_nodes(cache, limit)` ranks every node by `tokens x (hits + 1)` (what it holds times how
often it served) and returns the top `limit`, each with its parent's id, so a client can draw
the tree those nodes span. Token ids are kept (the first `PREVIEW_TOKENS`); the HTTP process
turns them into a text preview with the tokenizer. With a `viewer` (a principal, `radixkv.tenancy`)
only the namespaces it owns are looked at, and counted in the totals.
"""

from __future__ import annotations

import heapq
from typing import Any

from radixkv.ipc.messages import CACHE_TREE_MAX_NODES as MAX_NODES
from radixkv.tenancy import visible

PREVIEW_TOKENS = 32


def tree_nodes(cache: Any, limit: int = 200, viewer: str | None = None) -> dict[str, Any]:
    """`{"nodes": [...], "total_nodes", "total_tokens"}` of `cache` (see the module docstring).

    A node: `id`, `parent` (None under the root), `depth` (tokens above it), `tokens`,
    `preview_ids`, `hits`, `last_access` (the tree's logical clock), `tier` ("device" or
    "host"), `lock_ref`, `namespace`, `retained_until` (0: no retention hint)."""
    root = cache.root
    if root is None:  # the no-op cache holds nothing
        return {"nodes": [], "total_nodes": 0, "total_tokens": 0}
    rows, total_tokens = [], 0
    stack = [(child, ck[0]) for ck, child in root.children.items() if visible(ck[0], viewer)]
    while stack:
        node, namespace = stack.pop()
        total_tokens += len(node.key)
        rows.append((len(node.key) * (node.hit_count + 1), node, namespace))
        stack.extend((child, namespace) for child in node.children.values())
    top = heapq.nlargest(min(limit, MAX_NODES), rows, key=lambda r: (r[0], -r[1].id))
    nodes = [{"id": node.id, "parent": None if node.parent is root else node.parent.id, "depth": node.depth,
              "tokens": len(node.key), "preview_ids": list(node.key[:PREVIEW_TOKENS]), "hits": node.hit_count,
              "last_access": node.last_access, "tier": "device" if node.on_device else "host",
              "lock_ref": node.lock_ref, "namespace": namespace if namespace is None else str(namespace),
              "retained_until": node.retain_until}
             for _, node, namespace in top]
    return {"nodes": nodes, "total_nodes": len(rows), "total_tokens": total_tokens}
