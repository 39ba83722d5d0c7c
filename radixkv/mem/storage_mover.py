"""StorageMover: what moves between the storage tier and the tiers above it (the tier
controller's storage half, `TierController.stored`).

- *storage -> host* (`prefetch`, then `install`): a read of a match's storage continuation,
  whose arrived pages become a host-only node continuing the request's path; `load_back` then
  reports how many tokens it loaded a prefetch had brought (`MatchResult.from_storage`).
- *host/device -> storage*: the blocks a node ends (`block_keys`, `block_rows`) when the host
  tier lets it go (write-back) or once it is hot (write-through-selective), and `persist` (a
  clean shutdown) writes what the device and host tiers hold, bounded.

A stored page is a block of `per_block` device pages (`storage_tier.block_tokens`); a block is
written with the node its last token is in (its first tokens may lie in ancestors), and a read
may begin inside what the tree holds (the block the tree's path ends in), the part held being
skipped when it is installed. Stored pages are not in the tree: they are found by their block
hash (`radixkv.mem.block_hash`), chained over blocks.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import replace
from typing import Any

from radixkv.mem import block_hash
from radixkv.mem.base import MatchResult
from radixkv.mem.cache_events import CPU
from radixkv.mem.storage_tier import Prefetch, StorageTier
from radixkv.mem.tree_node import TreeNode

logger = logging.getLogger(__name__)


class StorageMover:
    """Moves pages between `tiers`' host tier and `storage` (see the module docstring)."""

    def __init__(self, tiers: Any, storage: StorageTier):
        self.tiers, self.storage = tiers, storage
        self.cache, self.host, self.keys = tiers.cache, tiers.host, tiers.keys
        self.page_size = tiers.page_size
        if storage.page_size % self.page_size:
            raise ValueError(f"storage page_size {storage.page_size} is not a multiple of the cache's {self.page_size}")
        self.block = storage.page_size  # tokens per stored page
        self.per_block = self.block // self.page_size
        self.loaded_tokens = 0  # storage -> host, installed for requests

    # -- storage -> host -----------------------------------------------------------------------
    def storage_continuation(self, match: MatchResult) -> MatchResult:
        """`match` (a peek) with how far its key goes on in storage after the device and host
        parts (`storage_tokens`), hashing only as far as storage holds the pages."""
        storage = self.storage
        end = match.num_tokens + match.host_tokens
        if storage is None or not storage.may_hold or end >= len(match.key):
            return match
        start = end // self.block * self.block  # the stored page the path ends in
        prev = self._hash_before(match.key, start, match.namespace)
        if prev is None or not storage.holds(next(block_hash.chain(prev, match.key[start:], self.block), b"")):
            return match
        held = storage.held_run(block_hash.chain(prev, match.key[start:], self.block))
        return replace(match, storage_tokens=start + held * self.block - end)

    def prefetch(self, match: MatchResult) -> Prefetch | None:
        """Start reading `match`'s storage continuation (a peek's `storage_tokens`); None if it has none."""
        if not match.storage_tokens:
            return None
        end = match.num_tokens + match.host_tokens
        start = end // self.block * self.block
        prev = self._hash_before(match.key, start, match.namespace)
        if prev is None:
            return None
        blocks = (end - start + match.storage_tokens) // self.block
        keys = list(itertools.islice(block_hash.chain(prev, match.key[start:], self.block), blocks))
        return Prefetch(self.storage.fetch(keys), match.key, match.namespace, start)

    def cancel_prefetch(self, prefetch: Prefetch) -> None:
        """A request dropped its read (it left the queue)."""
        prefetch.fetch.cancel()
        self.storage.finished(prefetch.fetch, 0)

    def install(self, prefetch: Prefetch) -> int:
        """Put the pages of `prefetch` that have arrived into the host tier, continuing the
        request's path in the tree; returns the tokens installed. Pages the tree has gained
        since are skipped; a path that lost its prefix since takes none."""
        fetch = prefetch.fetch
        arrived = fetch.arrived  # (the reader may add more meanwhile: these are what we use)
        installed, through = self._install(prefetch, arrived) if arrived else (0, 0)
        self.storage.finished(fetch, -(-through // self.block) if installed else 0)
        fetch.cancel()  # whatever is still to come is not used
        return installed

    def _install(self, prefetch: Prefetch, arrived: int) -> tuple[int, int]:
        """(tokens installed, tokens of the read the path now holds from its start)."""
        cache, size, key = self.cache, self.page_size, prefetch.key
        match = cache.settle(cache.peek(key, prefetch.namespace))
        end = match.num_tokens + match.host_tokens
        if end < prefetch.start:
            return 0, 0  # the prefix it continues is no longer held
        skip = (end - prefetch.start) // size  # device pages of the read the tree holds already
        if skip >= arrived * self.per_block:
            return 0, 0
        path = cache.host_path(match)
        parent = path[-1] if path else match.last_node
        assert parent.end == end, (parent.end, end)
        for node in path:  # making host room must not drop the path we attach to
            self.tiers.lru.pin(node)
        try:
            host_pages = self.tiers.host_alloc(arrived * self.per_block - skip)
        finally:
            for node in path:
                self.tiers.lru.unpin(node)
        if not host_pages:
            return 0, 0
        n = len(host_pages)
        first, last = skip // self.per_block, -(-(skip + n) // self.per_block)
        blocks = prefetch.fetch.pages[first:last]
        if blocks[0] is not None:  # the bytes (a tier that keeps none reads None)
            try:
                self.host.put_blocks(host_pages, blocks, skip - first * self.per_block)
            except BaseException:
                self.host.allocator.decref(host_pages)  # the copy failed: nothing was installed
                raise
        now = cache._tick()
        ck = cache.tree.child_key(parent, key, end, prefetch.namespace)
        assert ck not in parent.children, "a continuation the walk would have matched"
        leaf = TreeNode(key[end:end + n * size], [], parent, now)
        leaf.host_pages, leaf.from_storage = host_pages, True
        if self.per_block == 1:  # a stored page is a device page: its hash is the page's
            leaf.block_hashes = prefetch.fetch.keys[skip:skip + n]
        leaf.child_key = ck
        cache.epoch += 1  # keys through here now match further (on the host)
        if parent.host_candidate is not None:
            self.tiers.lru.drop(parent)
        parent.children[ck] = leaf
        cache.policy.on_access(leaf, now, False)
        self.tiers.lru.add(leaf)
        if cache.events is not None:
            cache.events.stored(leaf, CPU)
        self.loaded_tokens += n * size
        return n * size, (skip + n) * size

    def load_from_storage(self, match: MatchResult) -> MatchResult:
        """Fetch and install `match`'s storage continuation at once (the simulator's prefetch,
        which waits for it); the new peek."""
        prefetch = self.prefetch(match)
        if prefetch is None:
            return match
        while not prefetch.fetch.done:
            time.sleep(0.0005)
        self.install(prefetch)
        return self.cache.peek(match.key, match.namespace)

    # -- host/device -> storage ----------------------------------------------------------------
    def persist(self, timeout: float | None = None) -> tuple[int, int]:
        """Write every cached prefix storage lacks (device or host copy), children first (storage's
        LRU then keeps a prefix longer than what hangs below it), for at most `timeout` seconds
        (default: `persist_timeout`), so a restart finds it. Returns (pages queued, left unwritten)."""
        storage, written, left = self.storage, 0, 0
        if not storage.enabled or storage.shared:
            return written, left
        deadline = time.monotonic() + (storage.config.persist_timeout if timeout is None else timeout)
        for node in reversed(list(self.cache.nodes())):  # children first: parents are then the more recent
            keys, start = self.block_keys(node)
            if not keys or not storage.needs(keys):
                continue
            if time.monotonic() > deadline:
                left += len(keys)
            else:  # (waits for room: the last chance)
                written += storage.write(keys, self.block_rows(node, start, len(keys)), wait=True)
        return written, left

    # -- stored pages: blocks of device pages ----------------------------------------------------
    def block_keys(self, node: TreeNode) -> tuple[list[bytes], int]:
        """The keys of the stored pages (blocks) whose last token is in `node`'s edge, and the
        token the first of them starts at."""
        block = self.block
        start, stop = node.depth // block * block, node.end // block * block
        if stop <= node.depth:
            return [], start
        if self.per_block == 1:
            return self.keys.of(node), node.depth  # (the tree keeps them)
        parts, top = [], node
        while top.parent is not None and top.parent.parent is not None:
            parts.append(top.key)
            top = top.parent
        parts.append(top.key)
        tokens = [t for part in reversed(parts) for t in part]
        prev = block_hash.root(top.child_key[0])
        for prev in block_hash.chain(prev, tokens[:start], block):
            pass
        return list(block_hash.chain(prev, tokens[start:stop], block)), start

    def _hash_before(self, key: tuple, start: int, namespace: Any) -> bytes | None:
        """The block hash of `key[:start]` (`start`: a block boundary the path holds)."""
        if self.per_block == 1:
            return self.keys.before(self.cache.tree, key, start, namespace)  # (kept on the tree's nodes)
        prev = block_hash.root(namespace)
        for prev in block_hash.chain(prev, key[:start], self.block):
            pass
        return prev

    def block_rows(self, node: TreeNode, start: int, blocks: int):
        """The bytes of `blocks` stored pages from token `start` of `node`'s path (each device
        page from a host copy if it has one, else from the device), grouped into blocks."""
        size, stop, parts = self.page_size, start + blocks * self.block, []
        while node.parent is not None and node.end > start:
            a, b = max(start, node.depth) - node.depth, min(stop, node.end) - node.depth
            if a < b:
                if node.host_pages is not None:
                    parts.append(self.host.rows(node.host_pages[a // size:b // size]))
                else:
                    parts.append(self.host.device_rows(node.pages[a // size:b // size]))
            node = node.parent
        return self.host.join_blocks(parts[::-1], self.per_block)

    def stats(self) -> dict[str, Any]:
        return self.storage.stats() | {"storage_loaded_tokens": self.loaded_tokens}

    def close(self) -> None:
        """Persist what the device and host tiers hold, then stop the storage tier's threads."""
        start, (pages, left) = time.monotonic(), self.persist()  # what they hold survives a restart (logged)
        self.storage.close()  # the queued writes land (or fail) before it returns
        logger.info("KV storage: %d page(s) (%d tokens) written at shutdown in %.1f s%s; %d page(s) stored in %s",
                    pages, pages * self.page_size, time.monotonic() - start,
                    f", {left} left unwritten (--kv-storage-persist-timeout)" if left else "",
                    self.storage.stored_pages, self.storage.location)
