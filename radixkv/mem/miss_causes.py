"""Why a prompt missed: its tokens split by where they came from, or why they did not.

    device / host / storage   served from that tier
    page_tail    what page_size > 1 cannot share: the prompt's last, partial page once the
                 rest matched, or the part of a page where the prompt and a cached sequence
                 agree before they part
    evicted      held earlier, evicted since (a bounded *ghost index* of the page hashes that
                 left every tier, as ARC keeps ghost lists)
    namespace    cached, but under another namespace (cache salt, LoRA) of the same tenant
                 (`radixkv.tenancy.owner`: another tenant's cache is never looked in, so
                 the answer says nothing about what other keys sent)
    retokenized  the text matches a cached sequence but the token ids diverge (a client that
                 re-tokenised the conversation): `retokenized`, with the tokenizer's decode
    new          none of the above: never held

The parts add up to the prompt. Pages are named by their block hash (`radixkv.mem.tree_hashes`),
which every node keeps once computed. The ghost index is fed by the tree when pages leave its
last tier (device eviction without a host tier, host eviction without a storage tier, a save
that found no room), and by the storage tier's LRU, which keys pages by the same hash.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

from radixkv.mem import block_hash
from radixkv.mem.tree_hashes import hash_before
from radixkv.tenancy import owner

CAUSES = ("device", "host", "storage", "page_tail", "evicted", "namespace", "retokenized", "new")
MISSES = ("page_tail", "evicted", "namespace", "retokenized", "new")
GHOST_PAGES = 1 << 20  # page hashes the ghost index remembers (about 100 MB at most)
TAIL_SCAN_CHILDREN = 4096  # children looked at for a partial page (a root may have many)
MAX_NAMESPACES = 32  # other namespaces looked in, at most (a server may have thousands of salts)


class GhostIndex:
    """Block hashes of pages that left the cache, the most recent
    `capacity`. `add` may come from storage's writer thread: it takes a lock."""

    def __init__(self, capacity: int = GHOST_PAGES):
        self.capacity = capacity
        self._keys: OrderedDict[Hashable, None] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, names: Iterable[Hashable]) -> None:
        with self._lock:
            keys = self._keys
            for h in names:
                keys[h] = None
                keys.move_to_end(h)
            while len(keys) > self.capacity:
                keys.popitem(last=False)

    def __contains__(self, h: Hashable) -> bool:
        return h in self._keys

    def __len__(self) -> int:
        return len(self._keys)


def explain(cache: Any, prompt: Sequence[int], namespace: Any, device: int, host: int = 0,
            storage: int = 0) -> dict[str, int]:
    """The causes (see the module docstring; `retokenized` is left to `retokenized`) of `prompt`, of which the
    first `device + host + storage` tokens were served (that many, from those tiers)."""
    size = cache.page_size
    served = device + host + storage
    out = dict.fromkeys(CAUSES, 0)
    out.update(device=device, host=host, storage=storage)
    root = cache.root
    rest = len(prompt) - served
    if root is None or rest <= 0:
        out["new"] = max(0, rest)
        return out
    key = tuple(prompt)
    at = served
    ghosts = cache.ghosts
    if ghosts is not None and len(ghosts):
        prev = hash_before(cache.tree, key, at, namespace, size)
        if prev is not None:
            whole = (len(key) - at) // size * size
            for h in block_hash.chain(prev, key[at:at + whole], size):
                if h not in ghosts:
                    break
                at += size
        at = max(at, _evicted_blocks(cache, key, at, namespace))
        out["evicted"] = at - served
    other = _other_namespace(cache, key, namespace)
    if other > at:
        out["namespace"], at = other - at, other
    tail = len(key) % size
    if at and at == len(key) - tail:  # all of it but the last, partial page: never a page to share
        out["page_tail"], at = tail, len(key)
    elif at == served:  # where it parts from a cached sequence inside a page
        out["page_tail"], _ = _continuations(cache, key, at, namespace)
        at += out["page_tail"]
    out["new"] = len(key) - at
    return out


def _evicted_blocks(cache: Any, key: tuple, at: int, namespace: Any) -> int:
    """Where the run of stored pages the storage tier evicted goes on to from token `at`: it
    names a stored page (a block of several device pages) by the block's hash, not the pages'."""
    block = cache.tiers.stored.block if cache.reads_storage else cache.page_size
    if block == cache.page_size:
        return at
    start = at // block * block
    prev = block_hash.root(namespace)
    for prev in block_hash.chain(prev, key[:start], block):
        pass
    end = start
    for h in block_hash.chain(prev, key[start:], block):
        if h not in cache.ghosts:
            break
        end += block
    return end


def retokenized(cache: Any, prompt: Sequence[int], namespace: Any, causes: dict[str, int],
                decode: Callable[[Sequence[int]], str], window: int = 48) -> dict[str, int]:
    """`causes` with the tokens the cache holds *as text* moved from `new` to `retokenized`:
    where the prompt's token ids part from a cached sequence, the cached sequence's text
    (`decode`d, up to `window` tokens) still goes on as the prompt's does; the prompt tokens
    whose text lies within that common text count."""
    if not causes["new"] or cache.root is None:
        return causes
    key = tuple(prompt)
    at = len(key) - causes["new"]
    skip, edges = _continuations(cache, key, at - causes["page_tail"], namespace, limit=64)
    rest = key[at:at + window]
    text = decode(list(rest))
    common = max((_common_prefix(text, decode(list(edge[skip:skip + window]))) for edge in edges), default=0)
    if common < 2:  # (one shared character is chance)
        return causes
    j = 0  # prompt tokens whose text lies within the common text
    while j < len(rest) and len(decode(list(rest[: j + 1]))) <= common:
        j += 1
    if j:
        causes = {**causes, "retokenized": j, "new": causes["new"] - j}
    return causes


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _other_namespace(cache: Any, key: tuple, namespace: Any) -> int:
    """The longest cached prefix of `key` in another namespace of the same tenant (any tier;
    `MAX_NAMESPACES` looked in)."""
    mine = owner(namespace)
    spaces = {ck[0] for ck in cache.root.children if owner(ck[0]) == mine} - {namespace}
    best = 0
    for space in list(spaces)[:MAX_NAMESPACES]:
        m = cache.peek(key, space)
        best = max(best, m.num_tokens + m.host_tokens + m.storage_tokens)
    return best


def _continuations(cache: Any, key: tuple, at: int, namespace: Any,
                   limit: int = TAIL_SCAN_CHILDREN) -> tuple[int, list[tuple]]:
    """(tokens after `at` that a cached sequence holds token for token, short of a whole page;
    the cached sequences going on from `at`: the rest of the edge the match ends inside, or the
    children of the node it ends on, at most `limit`, most recently used first)."""
    node, pos = cache.root, 0
    for child, n in cache.tree.walk(key[:at], namespace):
        node, pos = child, child.depth + n
    if pos != at:
        return 0, []
    if at < node.end:  # the match ends inside an edge: it continues there
        edges = [node.key[at - node.depth:]]
    else:
        kids = [c for ck, c in node.children.items() if node is not cache.root or ck[0] == namespace]
        edges = [c.key for c in sorted(kids, key=lambda c: -c.last_access)[:limit]]
    rest, best = key[at:], 0
    for edge in edges:
        n = 0
        for a, b in zip(edge, rest):
            if a != b:
                break
            n += 1
        best = max(best, n)
    return min(best, len(rest), cache.page_size - 1), edges
