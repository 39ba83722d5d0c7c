"""Routing policies: which worker of a data-parallel group gets a request (the live router and
the trace simulator share them).

- `RoundRobin` and `LeastLoad`, for comparison.
- `CacheAware` (the SGLang router's rule). The router keeps one `ApproxTree` per worker: a
  bounded radix tree of the prompts it sent there, an approximation of that worker's cache. It
  sends a request to the worker whose tree holds the longest prefix of it, when that prefix is
  at least `min_match` of the prompt. Otherwise the request goes to the least-loaded worker.
  When the load is out of balance (max - min > `balance_abs` and max > `balance_rel` x min),
  it goes to the least-loaded worker whatever is cached. A `pin` (OpenAI's
  `prompt_cache_key`) keeps a conversation on the worker it first went to.

A key is any sequence of hashable symbols: token ids, characters, or trace block ids.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Hashable, Sequence

from radixkv.errors import ConfigError
from radixkv.mem import PageAllocator, RadixCache

POLICIES = ("cache_aware", "round_robin", "least_load")


class ApproxTree:
    """The prompts routed to one worker, as a radix tree of at most `capacity` symbols (LRU)."""

    def __init__(self, capacity: int, page_size: int = 1):
        if capacity < page_size:
            raise ConfigError(f"router tree capacity {capacity} is below one page ({page_size})")
        self.cache = RadixCache(PageAllocator(capacity // page_size, page_size), "lru")

    def match(self, key: Sequence[Hashable]) -> int:
        """Symbols of `key` this worker probably has cached."""
        return self.cache.peek(key).num_tokens

    def insert(self, key: Sequence[Hashable]) -> None:
        """Record that `key` went to this worker (evicting the least recently routed prefixes)."""
        key = tuple(key)
        key = key[: len(key) - len(key) % self.cache.page_size]
        if key:
            self.cache.serve_and_cache(key, self.cache.match_prefix(key))

    @property
    def size(self) -> int:
        return self.cache.total_tokens


class RoutingPolicy(ABC):
    name: str

    def __init__(self, num_workers: int):
        if num_workers < 1:
            raise ConfigError(f"routing needs at least one worker, got {num_workers}")
        self.num_workers = num_workers

    @abstractmethod
    def route(self, key: Sequence[Hashable], loads: Sequence[int], pin: Hashable | None = None) -> int:
        """The worker for a request with prompt `key`, given each worker's current load."""

    def forget_worker(self, worker: int) -> None:
        """`worker` went away (its cache with it)."""


class RoundRobin(RoutingPolicy):
    name = "round_robin"

    def __init__(self, num_workers: int):
        super().__init__(num_workers)
        self._next = 0

    def route(self, key, loads, pin=None) -> int:
        worker = self._next % self.num_workers
        self._next += 1
        return worker


class LeastLoad(RoutingPolicy):
    name = "least_load"

    def route(self, key, loads, pin=None) -> int:
        return min(range(self.num_workers), key=lambda w: (loads[w], w))


class CacheAware(RoutingPolicy):
    name = "cache_aware"

    def __init__(self, num_workers: int, tree_capacity: int, page_size: int = 1, min_match: float = 0.5,
                 balance_abs: int = 16, balance_rel: float = 1.5, max_pins: int = 100_000):
        super().__init__(num_workers)
        if not 0 <= min_match <= 1 or balance_abs < 0 or balance_rel < 1:
            raise ConfigError("cache-aware routing: min_match in [0, 1], balance_abs >= 0, balance_rel >= 1")
        self.trees = [ApproxTree(tree_capacity, page_size) for _ in range(num_workers)]
        self.tree_capacity, self.page_size = tree_capacity, page_size
        self.min_match, self.balance_abs, self.balance_rel = min_match, balance_abs, balance_rel
        self.pins: OrderedDict[Hashable, int] = OrderedDict()
        self.max_pins = max_pins
        self.decisions = {"cache": 0, "balance": 0, "least_load": 0, "pin": 0}

    def route(self, key, loads, pin=None) -> int:
        if pin is not None and pin in self.pins:
            worker = self.pins[pin]
            self.pins.move_to_end(pin)
            self.decisions["pin"] += 1
        else:
            worker = self._choose(key, loads)
            if pin is not None:
                self.pins[pin] = worker
                while len(self.pins) > self.max_pins:
                    self.pins.popitem(last=False)
        self.trees[worker].insert(key)
        return worker

    def _choose(self, key, loads) -> int:
        least = min(range(self.num_workers), key=lambda w: (loads[w], w))
        hi, lo = max(loads), min(loads)
        if hi - lo > self.balance_abs and hi > self.balance_rel * lo:
            self.decisions["balance"] += 1
            return least
        matches = [tree.match(key) for tree in self.trees]
        best = max(range(self.num_workers), key=lambda w: (matches[w], -loads[w], -w))
        if key and matches[best] >= self.min_match * len(key):
            self.decisions["cache"] += 1
            return best
        self.decisions["least_load"] += 1
        return least

    def forget_worker(self, worker: int) -> None:
        self.trees[worker] = ApproxTree(self.tree_capacity, self.page_size)
        for pin in [p for p, w in self.pins.items() if w == worker]:
            del self.pins[pin]


def make_policy(name: str, num_workers: int, tree_capacity: int = 1 << 22, page_size: int = 1,
                **options) -> RoutingPolicy:
    if name == "cache_aware":
        return CacheAware(num_workers, tree_capacity, page_size, **options)
    if name == "round_robin":
        return RoundRobin(num_workers)
    if name == "least_load":
        return LeastLoad(num_workers)
    raise ConfigError(f"routing policy {name!r}: choose one of {list(POLICIES)}")
