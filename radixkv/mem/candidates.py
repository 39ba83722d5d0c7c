"""The eviction candidates of a radix tree: its unlocked device leaves, in eviction order.

A candidate's rank is (retention, policy priority), smallest first: leaves not retained
(`retain_until` unset or past when ranked) come first, by the eviction policy; retained leaves
(deadline ahead) after all of them, earliest deadline first. Entries are
`(rank, node id, node)`; the node keeps its entry in `node.candidate`, so removing it is
O(log n).

Deadlines run out as the clock moves without anything touching the node, so an entry's retained
flag can go stale; `expire` re-ranks every flagged entry whose deadline has passed (each re-rank
clears a flag, so it terminates), after which all flags are true at its clock reading.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

from sortedcontainers import SortedList

from radixkv.mem.eviction import EvictionPolicy
from radixkv.mem.tree_node import NOT_RETAINED, TreeNode

_FIRST_RETAINED = ((-sys.float_info.max,),)
"""Sorts after every unretained entry and before every retained one (for bisection)."""


class EvictionCandidates:
    """Unlocked leaves ranked for eviction (see the module docstring); the tree decides which
    nodes are candidates, this keeps them in order."""

    def __init__(self, policy: EvictionPolicy, clock: Callable[[], float]):
        self.policy = policy
        self.clock = clock  # seconds, never going back: what deadlines are read against
        self._entries: SortedList = SortedList()

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[tuple]:
        """Entries `((hold, priority), node id, node)`, lowest rank first (`hold` is the
        deadline of a retained entry, else `NOT_RETAINED`)."""
        return iter(self._entries)

    def rank(self, node: TreeNode, end: int, now: float | None = None) -> tuple:
        """Eviction rank of leaf `node` cut to its first `end` tokens at `now` (default: the
        clock, read only for a node that was ever retained)."""
        until = node.retain_until
        if until and until > (self.clock() if now is None else now):
            return (until, self.policy.priority(node, end))
        return (NOT_RETAINED, self.policy.priority(node, end))

    def add(self, node: TreeNode, now: float | None = None) -> None:
        entry = (self.rank(node, len(node.key), now), node.id, node)
        node.candidate = entry
        self._entries.add(entry)

    def drop(self, node: TreeNode) -> None:
        self._entries.remove(node.candidate)
        node.candidate = None

    def rerank(self, node: TreeNode, now: float | None = None) -> None:
        """Rank candidate `node` afresh (its deadline or the policy's view of it changed)."""
        self.drop(node)
        self.add(node, now)

    def lowest(self) -> TreeNode | None:
        return self._entries[0][2] if self._entries else None

    def pop_lowest(self) -> TreeNode:
        node = self._entries.pop(0)[2]
        node.candidate = None
        return node

    def expire(self) -> float | None:
        """Re-rank the entries whose deadline has passed since they were ranked, so they rank
        as any other leaf again; returns the clock reading the flags now hold at (None, and no
        clock read, when no entry is flagged retained)."""
        entries = self._entries
        if not entries or entries[-1][0][0] == NOT_RETAINED:  # retained ones sort last
            return None
        now = self.clock()
        while True:
            i = entries.bisect_left(_FIRST_RETAINED)  # the earliest deadline among the flagged
            if i == len(entries) or entries[i][0][0] > now:
                return now
            self.rerank(entries[i][2], now)

    def victims(self, num_tokens: int, page_size: int, tick: int) -> Iterator[tuple[TreeNode, int]]:
        """The leaves to evict to free `num_tokens` tokens, lowest rank first (flags gone stale
        re-ranked first, `expire`), each with the tokens of its edge it keeps (a multiple of
        `page_size`: eviction takes a leaf's tail first, the deepest tokens, the last a future
        match would reach), until that many are freed or no candidate is left. The caller evicts
        each before asking for the next (which may make its parent a candidate); `tick` is the
        tree's logical clock, for the policy's `on_evict`.

        When the policy ranks a leaf by its tail page (`page_granular`), the victim loses pages
        only while it stays the lowest-ranked candidate, then is re-ranked by its new tail;
        otherwise all its pages rank alike and it loses as many as are still needed."""
        freed = 0
        granular = self.policy.page_granular
        now = self.expire() if num_tokens > 0 else None
        while freed < num_tokens and self._entries:
            node = self.pop_lowest()
            self.policy.on_evict(node, tick)
            keep = len(node.key)
            if granular:
                # rank the runner-up afresh: a policy's ranks may drift with its learned state
                nxt = self.lowest()
                runner_up = self.rank(nxt, len(nxt.key), now) if nxt is not None else None
                while keep and freed < num_tokens:
                    keep -= page_size
                    freed += page_size
                    if keep and runner_up is not None and self.rank(node, keep, now) > runner_up:
                        break
            else:
                drop = min(keep, -(-(num_tokens - freed) // page_size) * page_size)
                keep -= drop
                freed += drop
            yield node, keep
