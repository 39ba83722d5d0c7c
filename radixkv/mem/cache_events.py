"""KV cache events: what the prefix cache reports about the pages it holds, per tier.

KV-aware routers (NVIDIA Dynamo, llm-d, SGLang's gateway) follow each worker's cache through a
stream of three events, in the shape SGLang and vLLM publish (`radixkv.sched.kv_events` puts
them on the wire):

    PagesStored(hashes, parent, token_ids, medium, namespace)   pages now held on `medium`
    PagesRemoved(hashes, medium)                     pages no longer held there
    AllPagesCleared()                                nothing is held anywhere

Pages are named by the **block hash** (`radixkv.mem.block_hash`) as its 63-bit `block_id`: the
hash chains a page's token ids onto its parent page's hash, from a root derived from the
namespace (LoRA id, cache salt, tenant), so equal prefixes get equal ids on every worker and
every start, an id names its whole prefix, and equal tokens under different namespaces never
share one. The storage tier keys the same page by the full hash, and a recorded trace lists the
same ids. 63 bits, so the same number reads as a signed (SGLang) or unsigned (vLLM) 64-bit integer.
A store also carries its pages' namespace as a digest (`namespace_digest`: None for the shared
namespace), so a subscriber can tell tenants apart without learning their keys or salts.

Mediums: `GPU` for the device KV pool (the name both references use, whatever the device),
`CPU` for the host tier. A page may be held on both at once (a write-through copy, or a host
copy loaded back); each medium is stored and removed on its own.

The cache calls a `CacheEventLog` (its `events` attribute; None costs one check per change)
and the scheduler takes the step's events once per step. `PageLedger` is the subscriber's
side: it applies events and says which pages are held, and how to announce them all again.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from radixkv.mem import block_hash
from radixkv.mem.block_hash import block_id
from radixkv.mem.tree_hashes import node_hashes, parent_hash

if TYPE_CHECKING:
    from radixkv.mem.tree_node import TreeNode

GPU = "GPU"
"""The device KV pool's medium."""
CPU = "CPU"
"""The host tier's medium."""


@dataclass(slots=True)
class PagesStored:
    """`hashes[i]` names the page of `token_ids[i * page_size:(i + 1) * page_size]`; each page's
    parent is the page before it, and the first one's is `parent` (None: a namespace's root)."""

    hashes: list[int]
    parent: int | None
    token_ids: list[int]
    medium: str
    namespace: str | None = None  # `namespace_digest` of the pages' namespace (None: the shared one)


@dataclass(slots=True)
class PagesRemoved:
    hashes: list[int]
    medium: str


@dataclass(slots=True)
class AllPagesCleared:
    pass


CacheEvent = PagesStored | PagesRemoved | AllPagesCleared


# -- the hash chain -------------------------------------------------------------------------------
def page_ids(node: TreeNode, page_size: int) -> list[int]:
    """The ids of `node`'s pages: each page's block hash, as `block_id`."""
    return [block_id(h) for h in node_hashes(node, page_size)]


def parent_id(node: TreeNode, page_size: int) -> int | None:
    """The id of the page before `node`'s first page (None under the root)."""
    h = parent_hash(node, page_size)
    return None if h is None else block_id(h)


def namespace_digest(namespace: Any) -> str | None:
    """A namespace as the events name it: 16 hex digits of its chain's root (None stays None)."""
    return None if namespace is None else block_hash.root(namespace).hex()[:16]


def node_namespace(node: TreeNode) -> Any:
    """The namespace `node` is cached under (the root's children are keyed by it)."""
    while node.parent is not None and node.parent.parent is not None:
        node = node.parent
    return node.child_key[0] if isinstance(node.child_key, tuple) and node.parent is not None else None


# -- recording ------------------------------------------------------------------------------------
@dataclass
class CacheEventLog:
    """The events a cache recorded since the last `take`, merged where the wire allows: stores
    that continue the previous store's chain on the same medium, and removals on one medium."""

    page_size: int
    _events: list[CacheEvent] = field(default_factory=list, init=False, repr=False)

    def stored(self, node: TreeNode, medium: str) -> None:
        """`node`'s pages are now held on `medium`."""
        hashes = page_ids(node, self.page_size)
        parent = parent_id(node, self.page_size)
        tail = self._events[-1] if self._events else None
        if isinstance(tail, PagesStored) and tail.medium == medium and tail.hashes[-1] == parent:
            tail.hashes.extend(hashes)  # a chain goes on in one namespace
            tail.token_ids.extend(node.key)
        else:
            space = namespace_digest(node_namespace(node))
            self._events.append(PagesStored(list(hashes), parent, list(node.key), medium, space))

    def removed(self, node: TreeNode, medium: str, first_page: int = 0) -> None:
        """`node`'s pages from `first_page` on are no longer held on `medium`."""
        hashes = page_ids(node, self.page_size)[first_page:]
        tail = self._events[-1] if self._events else None
        if isinstance(tail, PagesRemoved) and tail.medium == medium:
            tail.hashes.extend(hashes)
        elif hashes:
            self._events.append(PagesRemoved(list(hashes), medium))

    def cleared(self) -> None:
        self._events = [AllPagesCleared()]  # what came before it no longer matters

    def take(self) -> list[CacheEvent]:
        """The events since the last call, oldest first."""
        events, self._events = self._events, []
        return events


def tree_events(cache: Any) -> list[CacheEvent]:
    """What `cache` (a `RadixCache`, with or without a host tier) holds now, as events from an empty
    start: a clear, then every device page, then every host page, parents before children."""
    log = CacheEventLog(cache.page_size)
    log.cleared()
    for node in cache.nodes():
        if node.on_device:
            log.stored(node, GPU)
    for node in cache.nodes():
        if node.host_pages is not None:
            log.stored(node, CPU)
    return log.take()


# -- the subscriber's side ------------------------------------------------------------------------
@dataclass(slots=True)
class LedgerPage:
    parent: int | None
    token_ids: tuple[int, ...]
    mediums: set[str]
    namespace: str | None = None


class PageLedger:
    """The pages a stream of events says are held: `apply` each event in order.

    The publisher keeps one to answer a late subscriber with the whole tree (`events`); tests
    rebuild a cache's tree with one and compare."""

    def __init__(self, page_size: int):
        self.page_size = page_size
        self.pages: dict[int, LedgerPage] = {}  # by hash; a page before its children (see `events`)

    def apply(self, event: CacheEvent) -> None:
        if isinstance(event, PagesStored):
            parent, size = event.parent, self.page_size
            for i, h in enumerate(event.hashes):
                page = self.pages.get(h)
                if page is None:
                    tokens = tuple(event.token_ids[i * size:(i + 1) * size])
                    page = self.pages[h] = LedgerPage(parent, tokens, set(), event.namespace)
                page.mediums.add(event.medium)
                parent = h
        elif isinstance(event, PagesRemoved):
            for h in event.hashes:
                page = self.pages.get(h)
                if page is not None:
                    page.mediums.discard(event.medium)
                    if not page.mediums:
                        del self.pages[h]
        else:
            self.pages.clear()

    def apply_all(self, events: Iterable[CacheEvent]) -> PageLedger:
        for event in events:
            self.apply(event)
        return self

    def held(self) -> dict[int, tuple[int | None, tuple[int, ...], frozenset[str]]]:
        """hash -> (parent hash, token ids, mediums): the tree as a subscriber sees it."""
        return {h: (p.parent, p.token_ids, frozenset(p.mediums)) for h, p in self.pages.items()}

    def events(self) -> list[CacheEvent]:
        """Every held page as events from an empty start (a clear first), device pages before
        host pages and each page after its parent, so a subscriber can rebuild the tree.

        A page is present only while its parent is (a child leaves the tree first, and a page
        that comes back has no child yet), so insertion order puts parents first."""
        out: list[CacheEvent] = [AllPagesCleared()]
        for medium in (GPU, CPU):
            for h, page in self._held_on(medium):
                tail = out[-1]
                if isinstance(tail, PagesStored) and tail.medium == medium and tail.hashes[-1] == page.parent:
                    tail.hashes.append(h)
                    tail.token_ids.extend(page.token_ids)
                else:
                    out.append(PagesStored([h], page.parent, list(page.token_ids), medium, page.namespace))
        return out

    def _held_on(self, medium: str) -> Iterator[tuple[int, LedgerPage]]:
        return ((h, p) for h, p in self.pages.items() if medium in p.mediums)
