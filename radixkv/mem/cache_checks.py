"""The radix cache's invariants, checked in full (tests and `--log-level debug` call these).

`check_tree` holds for every device-resident part of a tree; `check_host_tier` adds what a
host tier promises. Both raise `CacheInvariantError` (never a bare assert, which `python -O`
would drop). They read the cache's state and change nothing.
"""

from __future__ import annotations

from typing import Any

from radixkv.errors import CacheInvariantError
from radixkv.mem.tree_node import NOT_RETAINED


def check_tree(cache: Any, inflight_pages: int | None = None) -> None:
    """Every device-resident node of `cache` (a `RadixCache`) is well formed, the counters and
    the candidate set agree with the tree, retention deadlines never grow down the tree and
    every candidate's retained flag agrees with the clock, and (given `inflight_pages`, pages
    held by running requests only) free + cached + in-flight pages == the pool."""
    size = cache.page_size
    seen: set[int] = set()
    evictable = protected = 0
    leaves: set[int] = set()
    for node in cache.nodes():
        if node.block_hashes is not None and len(node.block_hashes) * size != len(node.key):
            raise CacheInvariantError(f"{node}: {len(node.block_hashes)} block hashes for {len(node.key)} tokens")
        if not node.on_device:
            continue  # a lower tier's node: its tier checks it
        if not node.key or len(node.key) != len(node.pages) * size:
            raise CacheInvariantError(f"{node}: {len(node.key)} tokens on {len(node.pages)} pages")
        if node.parent.children.get(node.child_key) is not node:
            raise CacheInvariantError(f"{node} is not indexed under its child key")
        first = node.key[0] if size == 1 else node.key[:size]
        ck = node.child_key[1] if node.parent is cache.root else node.child_key
        if ck != first:
            raise CacheInvariantError(f"{node}: child key does not match its first page")
        if node.lock_ref < sum(c.lock_ref for c in node.children.values()):
            raise CacheInvariantError(f"{node}: lock_ref below its children's")
        if node.depth != node.parent.end:
            raise CacheInvariantError(f"{node}: depth {node.depth} != {node.parent.end}")
        if node.parent is not cache.root and node.retain_until > node.parent.retain_until:
            raise CacheInvariantError(f"{node}: retained until {node.retain_until}, past its parent's "
                                      f"{node.parent.retain_until}")
        for p in node.pages:
            if p in seen:
                raise CacheInvariantError(f"page {p} is owned by two tree nodes")
            seen.add(p)
            if cache.allocator.refcount(p) < 1:
                raise CacheInvariantError(f"tree page {p} has no allocator reference")
        if node.lock_ref > 0:
            protected += len(node.key)
        else:
            evictable += len(node.key)
            if cache.is_device_leaf(node):
                leaves.add(node.id)
    if (evictable, protected) != (cache.evictable_tokens, cache.protected_tokens):
        raise CacheInvariantError(
            f"counters say evictable={cache.evictable_tokens} protected={cache.protected_tokens}, "
            f"tree holds {evictable} and {protected}")
    candidates = [entry[1] for entry in cache.candidates]
    if set(candidates) != leaves or len(candidates) != len(leaves):
        raise CacheInvariantError("eviction candidates are not exactly the unlocked leaves")
    check_retention_flags(cache)
    cache.allocator.check_invariants()
    if inflight_pages is not None:
        total = cache.allocator.free_pages + len(seen) + inflight_pages
        if total != cache.allocator.num_pages:
            raise CacheInvariantError(
                f"free {cache.allocator.free_pages} + cached {len(seen)} + in-flight {inflight_pages} = "
                f"{total} pages, pool has {cache.allocator.num_pages}")
    elif len(seen) > cache.allocator.used_pages:
        raise CacheInvariantError("the tree holds more pages than are allocated")


def check_retention_flags(cache: Any) -> None:
    """A candidate flagged retained carries its node's deadline (a deadline that moves re-ranks
    its candidate); one not flagged has a deadline no later than the clock (it was not ahead
    when ranked, and the clock never goes back)."""
    now = cache.clock()
    for (hold, _), _, node in cache.candidates:
        if hold == NOT_RETAINED:
            if node.retain_until > now:
                raise CacheInvariantError(f"{node}: retained until {node.retain_until} (clock {now}), "
                                          "ranked as not retained")
        elif hold != node.retain_until:
            raise CacheInvariantError(f"{node}: ranked as retained until {hold}, retained until {node.retain_until}")


def check_host_tier(cache: Any) -> None:
    """The host tier of `cache` (a `RadixCache` with a host tier): host-only nodes form the bottom of the
    tree and are never locked, every host page belongs to one node, and the host LRU holds
    exactly the host-only leaves."""
    size, host = cache.page_size, cache.host
    host_seen: set[int] = set()
    host_leaves: set[int] = set()
    for node in cache.nodes():
        if node.host_pages is not None:
            if len(node.host_pages) * size != len(node.key):
                raise CacheInvariantError(f"{node}: {len(node.key)} tokens on {len(node.host_pages)} host pages")
            for p in node.host_pages:
                if p in host_seen or host.allocator.refcount(p) < 1:
                    raise CacheInvariantError(f"host page {p} is owned twice or not allocated")
                host_seen.add(p)
        if node.on_device:
            continue
        if node.host_pages is None or not node.key:
            raise CacheInvariantError(f"{node}: neither device nor host pages")
        if node.lock_ref:
            raise CacheInvariantError(f"{node}: a host-only node is locked")
        if any(c.on_device for c in node.children.values()):
            raise CacheInvariantError(f"{node}: host-only node with a device-resident child")
        if not node.children:
            host_leaves.add(node.id)
    candidates = [entry[1] for entry in cache.tiers.lru]
    if set(candidates) != host_leaves or len(candidates) != len(host_leaves):
        raise CacheInvariantError("host eviction candidates are not exactly the host-only leaves")
    host.allocator.check_invariants()
    if host.allocator.free_pages + len(host_seen) != host.allocator.num_pages:
        raise CacheInvariantError(f"host tier: {host.allocator.free_pages} free + {len(host_seen)} "
                                  f"in the tree != {host.allocator.num_pages} pages")
