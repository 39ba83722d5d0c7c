"""Eviction policies: which unlocked leaf of the radix tree goes first.

A policy maps a leaf to a priority tuple; the cache keeps its evictable leaves in a sorted
container keyed by that tuple and evicts the smallest first, so picking a victim is O(log n).
A node's priority is recomputed whenever the cache touches it (a match or insert passes
through it), trims it, or it becomes an evictable leaf. Policies whose rank also reads learned,
global state (`reuse`: its time scale `tau`; the hit count of a chain's oldest node) keep the
rank they had when last re-ranked until then: between refreshes the order is approximate, which
keeps victim selection O(log n) instead of re-sorting on every change.

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

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from radixkv.config import EVICTION_POLICIES
from radixkv.errors import ConfigError

if TYPE_CHECKING:
    from radixkv.mem.tree_node import TreeNode

Priority = tuple


class EvictionPolicy:
    """Base class: subclasses define `priority`; the smallest priority is evicted first."""

    name: ClassVar[str] = ""
    page_granular: ClassVar[bool] = False

    def priority(self, node: TreeNode, end: int) -> Priority:
        """Rank of leaf `node` cut to its first `end` tokens; the smallest is evicted first."""
        raise NotImplementedError

    def on_access(self, node: TreeNode, now: int, hit: bool) -> None:
        """Called when a match (`hit=True`) or insert passes through `node` (or creates it),
        before the node's statistics are updated and it is re-ranked."""

    def on_evict(self, node: TreeNode, now: int) -> None:
        """Called when eviction takes pages from leaf `node` (before they go)."""

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


class ReusePolicy(EvictionPolicy):
    """Reuse-aware LRU: each leaf's idle time is discounted by its odds of being used again.

    Model. A cached prefix is used again (its conversation continues, its document is asked
    about again) with some probability, after an idle gap of typical length `tau`. A leaf idle
    for time `a` is then still worth keeping in proportion to `odds * exp(-a / tau)`, and
    ranking leaves by that is ranking them by `last_access + tau * ln(odds)`: LRU on a clock
    that runs slower for likely prefixes (plain LRU is the case of equal odds). Three online
    quantities fill the model in:

    - odds ~ turns: a prefix whose conversation has already continued k-1 times (its chain's
      oldest node was matched k-1 times) is k times as likely to continue as a fresh one. On the
      Mooncake conversation trace the measured odds for k = 1..4 are 0.43, 0.72, 1.04, 1.44.
    - cost: a token at depth d costs `1 + d / attention_scale` to recompute (linear layers plus
      attention over everything before it), so deep tails are worth more per token than shallow
      ones; `attention_scale=None` ranks on reuse odds alone.
    - tau: the idle time scale of reuse. Gaps observed before hits are censored (a prefix
      idle longer than the cache keeps things is evicted before its hit can be seen), so tau is
      the larger of the mean idle gap before a hit on a conversation node (one with at most one
      child: shared trunks hit by every request do not count) and the mean idle age at which
      leaves are evicted; both are exponentially weighted means over about the last `window`
      events. Before any observation tau is 0 and the policy is LRU.

    The rank depends on the node's tail depth, so eviction re-ranks after each page.
    """

    name = "reuse"
    page_granular = True

    def __init__(self, attention_scale: float | None = 8192.0, window: int = 1000):
        if attention_scale is not None and attention_scale <= 0:
            raise ConfigError(f"attention_scale must be > 0 or None, got {attention_scale}")
        if window < 1:
            raise ConfigError(f"window must be >= 1, got {window}")
        self.attention_scale = attention_scale
        self.window = window
        self.hit_gap = 0.0  # mean idle gap before a hit, in the cache's clock ticks
        self.evict_age = 0.0  # mean idle age of evicted leaves, same units

    @property
    def tau(self) -> float:
        return max(self.hit_gap, self.evict_age)

    def on_access(self, node: TreeNode, now: int, hit: bool) -> None:
        if hit and len(node.children) <= 1 and node.parent is not None:
            self.hit_gap += (now - node.last_access - self.hit_gap) / self.window

    def on_evict(self, node: TreeNode, now: int) -> None:
        self.evict_age += (now - node.last_access - self.evict_age) / self.window

    @staticmethod
    def turns(node: TreeNode) -> int:
        """Requests that extended this node's conversation: its chain's oldest node's hits + 1.

        The chain is the run of single-child ancestors below the first shared (branching)
        node, e.g. below a system prompt that many conversations start with.
        """
        top = node
        while top.parent is not None and top.parent.parent is not None and len(top.parent.children) == 1:
            top = top.parent
        return top.hit_count + 1

    def priority(self, node: TreeNode, end: int) -> Priority:
        log_value = math.log(self.turns(node))
        if self.attention_scale is not None:
            log_value += math.log1p((node.depth + end) / self.attention_scale)
        return (node.last_access + self.tau * log_value,)


DEFAULT_ATTENTION_SCALE = 8192.0
"""Context length where a token's attention cost equals its linear-layer cost, when the model
is unknown (trace replays); the engine derives it from the model (see ModelConfig)."""

POLICIES: dict[str, Callable[..., EvictionPolicy]] = {
    "lru": lambda **_: LRUPolicy(),
    "lfu": lambda **_: LFUPolicy(),
    "fifo": lambda **_: FIFOPolicy(),
    "reuse": lambda **_: ReusePolicy(attention_scale=None),
    "reuse-cost": lambda attention_scale=None, **_: ReusePolicy(
        attention_scale=attention_scale or DEFAULT_ATTENTION_SCALE),
}
"""Online policies selectable by name (Belady needs an oracle and is built explicitly).
`reuse` ranks by reuse odds alone; `reuse-cost` also weighs each token's recompute cost."""
assert tuple(POLICIES) == EVICTION_POLICIES, "the config's list of eviction policies is this registry's"


def make_policy(policy: str | EvictionPolicy, attention_scale: float | None = None) -> EvictionPolicy:
    """A policy instance from its name (`lru`, `lfu`, `fifo`, `reuse`, `reuse-cost`) or an
    instance as is; `attention_scale` (tokens) sets `reuse-cost`'s recompute-cost model."""
    if isinstance(policy, EvictionPolicy):
        return policy
    try:
        factory = POLICIES[policy]
    except KeyError:
        raise ConfigError(
            f"unknown eviction policy {policy!r}; choose one of {sorted(POLICIES)}"
        ) from None
    return factory(attention_scale=attention_scale)
