"""Return holds: a finished request's cached sequence kept from new admissions for a moment,
for the next turn that extends it.

Why. Under memory pressure, admitting a queued request evicts the least recently used unlocked
leaves. With more live conversations than the pool holds, those leaves are the conversations
whose next turn is about to arrive (a chat client or an agent loop sends it as soon as the
answer is back). LRU over a cyclic working set larger than the cache hits nothing (a virtual
memory system's thrashing), so every turn recomputes its whole history while the pool is full of
histories that will be evicted before they return. A hold is load control: while the
conversations in the pool keep coming back, a cold request waits for room instead of evicting
one of them, and the pool serves a group of conversations at full reuse.

What. `hold(node)` locks the node a finished request's sequence ends on, like a running
request's lock: a new admission cannot evict its path. The hold ends when
  - claimed: a request is admitted whose cached prefix covers at least half of the held path
    (its next turn; `claim`): that request's own lock takes over;
  - expired: `seconds` pass (`expire`, every step);
  - yielded: running requests need the pages (their decode tokens and prefill chunks come
    before any queued request: `yield_for`), or a returning request does (the pool may be all
    holds when the returns arrive, and more come back than fit), or a request retracted from
    the running ones (it ran before any of them); or nothing runs and the queue cannot be admitted,
    and the hold is older than its *idle grace* (`end_idle`): twice the slowest of the recent
    claims' return times (`IDLE_GRACE` before any), so an idle pool waits only as long as
    returns have been seen to take;
  - released when the scheduler has nothing queued or running (no one wants the pages).

When. Holds pay only when held sequences come back. A hold claimed or expired is an outcome
(yielded ones say nothing about a return); while at least half of the last `WINDOW` outcomes
were claims (or fewer than `WARMUP` are known), every finished request is held; otherwise one
in `PROBE_EVERY`, so the share keeps being measured and holds resume when a workload starts
returning.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from radixkv.errors import CacheInvariantError
from radixkv.mem import PrefixCache

WINDOW = 32
WARMUP = 8
PROBE_EVERY = 8
CLAIM_SHARE = 0.5
IDLE_GRACE = 0.25  # seconds an idle pool waits for a return before any return was timed


@dataclass(slots=True, eq=False)  # a hold is itself: compared by identity
class _Hold:
    node: Any  # the TreeNode the held sequence ends on (locked once by this hold)
    taken: float  # clock seconds
    until: float


@dataclass(slots=True)
class HoldStats:
    taken: int = 0
    claimed: int = 0
    expired: int = 0
    yielded: int = 0
    skipped: int = 0  # finished requests not held because holds were not paying

    def to_dict(self) -> dict[str, int]:
        return {"holds_taken": self.taken, "holds_claimed": self.claimed, "holds_expired": self.expired,
                "holds_yielded": self.yielded, "holds_skipped": self.skipped}


def _end(node: Any) -> int:
    return node.depth + len(node.key)


def _on_path(upper: Any, lower: Any) -> bool:
    """Whether `upper` is `lower` or one of its ancestors."""
    while lower is not None and lower.depth >= upper.depth:
        if lower is upper:
            return True
        lower = lower.parent
    return False


class ReturnHolds:
    """The holds on finished requests' cached sequences (see the module docstring)."""

    def __init__(self, cache: PrefixCache, seconds: float, clock: Callable[[], float] = time.monotonic):
        if seconds <= 0:
            raise ValueError(f"hold seconds must be > 0, got {seconds}")
        self.cache = cache
        self.seconds = seconds
        self.clock = clock
        self.stats = HoldStats()
        self._holds: list[_Hold] = []  # oldest first
        self._outcomes: deque[bool] = deque(maxlen=WINDOW)  # True: claimed
        self._returns: deque[float] = deque(maxlen=WINDOW)  # seconds from hold to claim
        self._finished = 0

    def __len__(self) -> int:
        return len(self._holds)

    @property
    def paying(self) -> bool:
        """Whether recent holds came back often enough to hold every finished request."""
        if len(self._outcomes) < WARMUP:
            return True
        return sum(self._outcomes) >= CLAIM_SHARE * len(self._outcomes)

    def hold(self, node: Any) -> bool:
        """Hold the cached sequence ending at `node` (a finished request's, just inserted and
        unlocked); whether it was held."""
        if node is None or node.parent is None:  # nothing cached beyond the root
            return False
        self._finished += 1
        if not self.paying and self._finished % PROBE_EVERY:
            self.stats.skipped += 1
            return False
        self.cache.lock(node)
        now = self.clock()
        self._holds.append(_Hold(node, now, now + self.seconds))
        self.stats.taken += 1
        return True

    def claims(self, matched: Any) -> list[_Hold]:
        """The holds a request whose cached prefix ends at `matched` continues (it covers half or
        more of their path): a held sequence's return, which may take room from the other holds
        as no queued request may."""
        if not self._holds or matched is None or matched.parent is None:
            return []
        end = _end(matched)
        out = []
        for h in self._holds:
            held_end = _end(h.node)
            if 2 * min(end, held_end) < held_end:
                continue
            if _on_path(h.node, matched) if end >= held_end else _on_path(matched, h.node):
                out.append(h)
        return out

    def claim(self, claims: list[_Hold]) -> None:
        """A request was admitted that continues `claims` (`claims()` of its cached prefix, which
        it locked): those still held end as claimed."""
        now = None
        for h in claims:
            if h not in self._holds:  # ended meanwhile (yielded to make room for this request)
                continue
            now = self.clock() if now is None else now
            self._returns.append(now - h.taken)
            self._end(h, claimed=True, outcome=True)
            self.stats.claimed += 1

    def expire(self) -> None:
        """End the holds whose time is up."""
        if not self._holds:
            return
        now = self.clock()
        while self._holds and self._holds[0].until <= now:
            self._end(self._holds[0], claimed=False, outcome=True)
            self.stats.expired += 1

    def yield_for(self, short_tokens: int) -> None:
        """Running requests need `short_tokens` more evictable tokens: end holds, oldest first,
        until the cache has that many evictable or none is left."""
        while self._holds and self.cache.evictable_tokens < short_tokens:
            self._end(self._holds[0])
            self.stats.yielded += 1

    @property
    def idle_grace(self) -> float:
        """Seconds a hold may keep an idle pool's queue waiting."""
        grace = 2 * max(self._returns) if self._returns else IDLE_GRACE
        return min(self.seconds, grace)

    def end_idle(self) -> None:
        """Nothing runs and the queue cannot be admitted: end the holds past their idle grace."""
        limit = self.clock() - self.idle_grace
        for h in [h for h in self._holds if h.taken <= limit]:
            self._end(h)
            self.stats.yielded += 1

    def release_all(self) -> None:
        """End every hold unclaimed (nothing else can run, or nothing waits)."""
        while self._holds:
            self._end(self._holds[0])
            self.stats.yielded += 1

    def _end(self, h: _Hold, claimed: bool = False, outcome: bool = False) -> None:
        self._holds.remove(h)
        self.cache.unlock(h.node)
        if outcome:
            self._outcomes.append(claimed)

    def held_nodes(self) -> list[Any]:
        return [h.node for h in self._holds]

    def check(self) -> None:
        """Each hold is a live lock on a node still in the tree."""
        for h in self._holds:
            if h.node.lock_ref < 1:
                raise CacheInvariantError(f"hold on {h.node} without its lock")
            node = h.node
            while node.parent is not None:
                if node.parent.children.get(node.child_key) is not node:
                    raise CacheInvariantError(f"hold on {h.node}, which left the tree")
                node = node.parent
