"""Eviction policies: which unlocked leaf of the radix tree goes first.

A policy maps a leaf to a priority tuple; the cache keeps its evictable leaves in a sorted
container keyed by that tuple and evicts the smallest first, so picking a victim is O(log n).
A node's priority is recomputed whenever the cache touches it (a match or insert passes
through it), trims it, or it becomes an evictable leaf; in between it must not change.

Eviction takes a leaf's pages from the tail, so `priority(node, end)` ranks the leaf as if it
held only its first `end` tokens, i.e. by its tail page ending there. A policy whose priority
depends on `end` sets `page_granular = True`, and the cache then re-ranks a victim after each
page it takes; otherwise all pages of a node rank alike and a victim loses what is needed.

Node statistics a policy may read (kept by the cache for every node):
  last_access   logical clock of the last match/insert through the node
  hit_count     number of matches through the node
  created       logical clock when the node's tokens were first inserted
  depth         tokens between the root and the start of the node's edge
  key, pages    the edge's tokens and page ids
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from radixkv.errors import ConfigError

if TYPE_CHECKING:
    from radixkv.mem.radix_cache import TreeNode

Priority = tuple


class EvictionPolicy:
    """Base class: subclasses define `priority`; the smallest priority is evicted first."""

    name: ClassVar[str] = ""
    page_granular: ClassVar[bool] = False

    def priority(self, node: TreeNode, end: int) -> Priority:
        """Rank of leaf `node` cut to its first `end` tokens; the smallest is evicted first."""
        raise NotImplementedError

    def on_access(self, node: TreeNode, now: int, hit: bool) -> None:
        """Called when a match (`hit=True`) or insert passes through `node`, before re-keying."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class LRUPolicy(EvictionPolicy):
    """Least recently used leaf first."""

    name = "lru"

    def priority(self, node: TreeNode, end: int) -> Priority:
        return (node.last_access,)


class LFUPolicy(EvictionPolicy):
    """Fewest hits first; ties broken by least recent use."""

    name = "lfu"

    def priority(self, node: TreeNode, end: int) -> Priority:
        return (node.hit_count, node.last_access)


class FIFOPolicy(EvictionPolicy):
    """Oldest insertion first, whatever its use since."""

    name = "fifo"

    def priority(self, node: TreeNode, end: int) -> Priority:
        return (node.created,)


class BeladyPolicy(EvictionPolicy):
    """Offline optimum for benchmarks: evict the page whose next use is farthest in the future.

    `next_use(node, end)` is an oracle over the future: when the page of `node` ending at token
    `end` is next needed (e.g. a request index; `math.inf` if never). Only trace replays can
    supply it. Deeper pages are never needed sooner than shallower ones, so ranking leaves by
    their tail page and evicting page by page is Belady's rule at page granularity.
    """

    name = "belady"
    page_granular = True

    def __init__(self, next_use: Callable[[TreeNode, int], float]):
        self.next_use = next_use

    def priority(self, node: TreeNode, end: int) -> Priority:
        return (-self.next_use(node, end), -node.last_access)


POLICIES: dict[str, type[EvictionPolicy]] = {
    cls.name: cls for cls in (LRUPolicy, LFUPolicy, FIFOPolicy)
}
"""Online policies selectable by name (Belady needs an oracle and is built explicitly)."""


def make_policy(policy: str | EvictionPolicy) -> EvictionPolicy:
    """A policy instance from its name (`lru`, `lfu`, `fifo`, ...) or an instance as is."""
    if isinstance(policy, EvictionPolicy):
        return policy
    try:
        return POLICIES[policy]()
    except KeyError:
        raise ConfigError(
            f"unknown eviction policy {policy!r}; choose one of {sorted(POLICIES)}"
        ) from None
