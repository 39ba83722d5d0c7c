"""Trace replay over N workers behind a routing policy: what cache-aware routing keeps of one
big cache's hit rate, and how even the load stays.

Each worker is a real `RadixCache` + `PageAllocator` of `capacity_tokens` (LRU), served as in
`replay`. The router sees only what it routed (its per-worker `ApproxTree`s are bounded by the
same capacity). With `store_tokens`, every worker also has a host tier of `host_tokens` and all
of them share one storage tier of `store_tokens` (a Mooncake Store in a deployment), written
through as soon as a prefix is cached: a prefix any worker computed is a hit on every other. A worker's load is the number of requests it received among the last
`load_window` (a stand-in for in-flight requests in a trace without service times).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from radixkv.mem import PageAllocator, RadixCache
from radixkv.mem.host_tier import HostTier, HostTierConfig
from radixkv.mem.storage_tier import StorageTier, StorageTierConfig
from radixkv.routing import make_policy
from radixkv.workloads.trace import BLOCK_SIZE, TraceRequest, expand_tokens


@dataclass(frozen=True, slots=True)
class RoutedResult:
    policy: str
    workers: int
    capacity_tokens: int  # per worker
    requests: int
    prompt_tokens: int
    hit_tokens: int
    hit_rate: float
    requests_per_worker: tuple[int, ...]
    imbalance: float  # max / mean requests per worker
    decisions: dict
    host_tokens: int = 0  # per worker
    store_tokens: int = 0  # shared by all workers
    host_hit_tokens: int = 0
    store_hit_tokens: int = 0  # of hit_tokens: read from the shared store

    def to_json(self) -> dict:
        return asdict(self)


def replay_routed(trace: Sequence[TraceRequest], policy: str, workers: int, capacity_tokens: int,
                  page_size: int = BLOCK_SIZE, block_size: int = BLOCK_SIZE, load_window: int = 64,
                  progress: Callable[[int], None] | None = None, host_tokens: int = 0, store_tokens: int = 0,
                  **policy_options) -> RoutedResult:
    store = None
    if store_tokens:
        if host_tokens < page_size:
            raise ValueError("a shared store needs a host tier on every worker (host_tokens)")
        store = StorageTier(StorageTierConfig(store_tokens // page_size, page_size, "write-through"))

    def worker() -> RadixCache:
        host = HostTier(HostTierConfig(host_tokens // page_size, page_size)) if host_tokens >= page_size else None
        return RadixCache(PageAllocator(capacity_tokens // page_size, page_size), "lru", host_tier=host, storage=store)

    caches = [worker() for _ in range(workers)]
    router = make_policy(policy, workers, tree_capacity=capacity_tokens, page_size=page_size, **policy_options)
    recent: deque[int] = deque()
    loads = [0] * workers
    counts = [0] * workers
    hits = prompt = host_hits = store_hits = 0
    for req in trace:
        key = expand_tokens(req, block_size)
        w = router.route(key, loads, pin=req.session_id)
        counts[w] += 1
        recent.append(w)
        loads[w] += 1
        if len(recent) > load_window:
            loads[recent.popleft()] -= 1
        cache = caches[w]
        match = cache.peek(key)
        if match.storage_tokens:  # the prefetch, waited for
            match = cache.load_from_storage(match)
        match = cache.settle(match)
        cache.record_use(match)
        if match.host_tokens:
            on_device = match.num_tokens
            match = cache.load_back(match, key)
            host_hits += match.num_tokens - on_device - match.from_storage
            store_hits += match.from_storage
        hits += match.num_tokens
        prompt += len(key)
        cache.serve_and_cache(key, match)
        if progress is not None:
            progress(1)
    mean = len(trace) / workers
    return RoutedResult(policy, workers, capacity_tokens, len(trace), prompt, hits, hits / max(1, prompt),
                        tuple(counts), max(counts) / mean if mean else 0.0, dict(getattr(router, "decisions", {})),
                        host_tokens, store_tokens, host_hits, store_hits)
