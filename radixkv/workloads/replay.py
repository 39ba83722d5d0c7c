"""Replay a trace through the real RadixCache + PageAllocator and count prefix hits.

Each request, in file order, does what the scheduler does for it: match its prompt, lock the
match, allocate pages for the rest (evicting unlocked leaves when short), then cache the whole
prompt and unlock. A prompt larger than the whole pool is served uncached.

The cache's clock is the trace's time (`timestamp`, ms), so retention hints (`hints`) run out
as they would have in the traced service.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from radixkv.mem import (
    BeladyPolicy,
    EvictionPolicy,
    PageAllocator,
    PrefixCache,
    TreeNode,
    make_policy,
    make_prefix_cache,
)
from radixkv.mem.host_tier import HostTier, HostTierConfig
from radixkv.mem.storage_tier import StorageTier, StorageTierConfig
from radixkv.retention import Retention
from radixkv.workloads.trace import BLOCK_SIZE, TraceRequest, expand_tokens, rehash

OFFLINE_POLICIES = ("belady", "reuse-oracle")
"""Policies that read the future: `belady` (when each page is next used) and `reuse-oracle`
(only whether it is ever used again; LRU among those that are) -- bounds, not runtime options."""
BASE = "base"
"""The name a per-adapter report gives the base model's requests (those with no adapter)."""
BOUNDS = ("none", "inf")
"""Pseudo-policies: `none` disables the cache, `inf` gives it room for the whole trace."""
HINTS = ("none", "oracle", "all")
"""Retention hints a replay's requests carry: none; `oracle`: `Retention.whole(hint_seconds)` on
each request whose cached prompt a later request holds whole (what a client that knows its
conversation goes on would send); `all`: that hint on every request (blanket hints)."""


class TraceClock:
    """The cache's clock in a replay: the current request's trace time, in seconds."""

    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


@dataclass(frozen=True, slots=True)
class ReplayResult:
    policy: str
    page_size: int
    capacity_tokens: int
    requests: int
    prompt_tokens: int
    hit_tokens: int
    hit_rate: float
    seconds: float
    tokens_per_second: float
    evicted_tokens: int
    uncached_requests: int
    prefill_work: float  # recompute cost of all prompt tokens (see `token_cost`)
    prefill_work_saved: float  # cost of the tokens served from the cache
    host_capacity_tokens: int = 0  # the host tier (0: none)
    host_hit_tokens: int = 0  # of `hit_tokens`, copied back from the host tier (storage's excluded)
    storage_capacity_tokens: int = 0  # the storage tier (0: none)
    storage_hit_tokens: int = 0  # of `hit_tokens`, read from the storage tier
    hints: str = "none"  # retention hints the requests carried (see HINTS)
    hint_seconds: float = 0.0  # how long each hint asked to keep its request's prefixes
    hinted_requests: int = 0
    # Per LoRA adapter ("base" for the base model), when the trace names any: requests, prompt
    # tokens and hit tokens (each adapter's cache is its own namespace, so they never share).
    adapters: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def device_hit_tokens(self) -> int:
        return self.hit_tokens - self.host_hit_tokens - self.storage_hit_tokens

    def to_json(self) -> dict:
        return asdict(self)


def token_cost_prefix_sum(n: int, attention_scale: int) -> float:
    """Recompute cost of tokens at positions [0, n): each costs `1 + position / attention_scale`.

    A token's prefill cost is its linear layers (constant) plus its attention over everything
    before it (linear in its position); `attention_scale` is the context length at which the two
    are equal (about 8-16k tokens for 1-8B models), so deep tokens cost more to rebuild.
    """
    return n + n * (n - 1) / (2 * attention_scale)


class BeladyOracle:
    """Next use of a tree node, read from the future of the trace (for `BeladyPolicy`).

    Eviction takes a leaf's pages from its tail, so a leaf is ranked by its last page: it is
    next used by the first later request that holds that whole page, i.e. whose block at the
    page's last token has the same prefix id and reaches that token.
    """

    def __init__(self, trace: Sequence[TraceRequest], block_size: int = BLOCK_SIZE):
        self.block_size = block_size
        self.now = 0
        self._uses: dict[int, tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
        for i, req in enumerate(trace):
            last = len(req.hash_ids) - 1
            for b, h in enumerate(req.hash_ids):
                length = block_size if b < last else req.input_length - block_size * last
                idx, lens = self._uses[h]
                idx.append(i)
                lens.append(length)

    def _block_of(self, node: TreeNode, position: int) -> tuple[int, int]:
        """(prefix id, offset in its block) of the token at `position` (inside `node`)."""
        offset = position % self.block_size
        target = position - offset  # position of the block's first token (the prefix id)
        while node.depth > target:
            node = node.parent
        return node.key[target - node.depth], offset

    def __call__(self, node: TreeNode, end: int) -> float:
        h, offset = self._block_of(node, node.depth + end - 1)
        return self._next_use(h, offset, self.now)

    def _next_use(self, h: int, offset: int, after: int) -> float:
        """The first request after the `after`-th whose block `h` reaches token `offset` of it."""
        idx, lens = self._uses.get(h, ((), ()))
        for j in range(bisect.bisect_right(idx, after), len(idx)):
            if lens[j] > offset:
                return float(idx[j])
        return math.inf

    def continued(self, i: int, req: TraceRequest, tokens: int) -> bool:
        """Whether a request after the `i`-th (`req`) holds the first `tokens` tokens of `req`'s
        prompt: a later turn of its conversation reuses all of it that was cached."""
        if tokens <= 0:
            return False
        last = tokens - 1
        return self._next_use(req.hash_ids[last // self.block_size], last % self.block_size, i) != math.inf


class ReuseOraclePolicy(EvictionPolicy):
    """Knows whether each page will ever be used again, not when: pages never used again go
    first, LRU among the rest. Separates what foresight of reuse is worth from foresight of time."""

    name = "reuse-oracle"
    page_granular = True

    def __init__(self, next_use: BeladyOracle):
        self.next_use = next_use

    def priority(self, node: TreeNode, end: int) -> tuple:
        return (self.next_use(node, end) != math.inf, node.last_access)


def build_cache(
    policy: str | EvictionPolicy,
    capacity_tokens: int,
    page_size: int,
    trace: Sequence[TraceRequest],
    block_size: int = BLOCK_SIZE,
    attention_scale: float | None = None,
    host_capacity_tokens: int = 0,
    host_write_policy: str = "write-back",
    clock: Callable[[], float] | None = None,
    storage_capacity_tokens: int = 0,
) -> tuple[PrefixCache, BeladyOracle | None]:
    """The cache a replay runs: `policy` over `capacity_tokens` of device pages, with a host tier
    of `host_capacity_tokens` and a storage tier of `storage_capacity_tokens` under it (0: none;
    storage needs the host tier)."""
    clock = clock or TraceClock()
    if policy in BOUNDS:  # room for the whole trace: nothing is ever evicted
        capacity_tokens = sum(r.input_length for r in trace) + page_size
    allocator = PageAllocator(max(1, capacity_tokens // page_size), page_size)
    host = None
    if host_capacity_tokens >= page_size:
        host = HostTier(HostTierConfig(host_capacity_tokens // page_size, page_size, host_write_policy))
    storage = None
    if storage_capacity_tokens >= page_size:
        if host is None:
            raise ValueError("a storage tier needs a host tier above it (host_capacity_tokens)")
        storage = StorageTier(StorageTierConfig(storage_capacity_tokens // page_size, page_size))
    tiers = dict(host_tier=host, clock=clock, storage=storage)
    if policy == "none":
        return make_prefix_cache(allocator, disabled=True), None
    if policy == "inf":
        return make_prefix_cache(allocator, "lru", **tiers), None
    if policy in OFFLINE_POLICIES:
        oracle = BeladyOracle(trace, block_size)
        rule = BeladyPolicy(oracle) if policy == "belady" else ReuseOraclePolicy(oracle)
        return make_prefix_cache(allocator, rule, **tiers), oracle
    return make_prefix_cache(allocator, make_policy(policy, attention_scale), **tiers), None


def replay(
    trace: Sequence[TraceRequest],
    policy: str | EvictionPolicy = "lru",
    capacity_tokens: int = 5_120_000,
    page_size: int = BLOCK_SIZE,
    block_size: int = BLOCK_SIZE,
    attention_scale: int = 8192,
    progress: Callable[[int], None] | None = None,
    check_every: int = 0,
    host_capacity_tokens: int = 0,
    host_write_policy: str = "write-back",
    hints: str = "none",
    hint_seconds: float = 300.0,
    storage_capacity_tokens: int = 0,
) -> ReplayResult:
    """Replay `trace` through a cache of `capacity_tokens`; `check_every` > 0 runs the
    invariant check every that many requests (slow; for tests). With `host_capacity_tokens`,
    evicted prefixes go to a host tier of that size and matches load them back (counted as
    hits, and separately as `host_hit_tokens`); with `storage_capacity_tokens` too, what the
    host tier lets go goes to a storage tier of that size, and a match continuing there is
    read back through the host tier first (`storage_hit_tokens`). `hints` (one of HINTS) gives requests a
    retention hint of `hint_seconds`, read against the trace's time.

    A trace with real `input_ids` is first rehashed at page granularity, so the replay shares
    exactly the pages the real tokens would share.
    """
    if trace and all(r.input_ids is not None for r in trace):
        trace, block_size = rehash(trace, page_size), page_size
    if hints not in HINTS:
        raise ValueError(f"hints={hints!r}: must be one of {HINTS}")
    clock = TraceClock()
    cache, oracle = build_cache(policy, capacity_tokens, page_size, trace, block_size, attention_scale,
                                host_capacity_tokens, host_write_policy, clock, storage_capacity_tokens)
    allocator = cache.allocator
    name = policy if isinstance(policy, str) else policy.name
    hint = Retention.whole(hint_seconds)
    future = (oracle or BeladyOracle(trace, block_size)) if hints == "oracle" else None
    hit_tokens = prompt_tokens = uncached = host_hits = storage_hits = hinted = 0
    by_adapter: dict[str, dict[str, int]] = {}
    per_adapter = any(r.adapter is not None for r in trace)
    work = saved = 0.0
    start = time.perf_counter()
    for i, req in enumerate(trace):
        key = expand_tokens(req, block_size)
        clock.seconds = req.timestamp / 1000
        if oracle is not None:
            oracle.now = i
        match = cache.peek(key)
        if match.storage_tokens:  # the prefetch, waited for
            match = cache.load_from_storage(match)
        match = cache.settle(match)
        cache.record_use(match)
        if match.host_tokens:
            on_device = match.num_tokens
            match = cache.load_back(match, key)
            host_hits += match.num_tokens - on_device - match.from_storage
            storage_hits += match.from_storage
        hit_tokens += match.num_tokens
        prompt_tokens += len(key)
        if per_adapter:
            use = by_adapter.setdefault(BASE if req.adapter is None else req.adapter,
                                        {"requests": 0, "prompt_tokens": 0, "hit_tokens": 0})
            use["requests"] += 1
            use["prompt_tokens"] += len(key)
            use["hit_tokens"] += match.num_tokens
        work += token_cost_prefix_sum(len(key), attention_scale)
        saved += token_cost_prefix_sum(match.num_tokens, attention_scale)
        retention = None
        if hints == "all" or (future is not None and future.continued(i, req, cache.aligned(len(key)))):
            retention, hinted = hint, hinted + 1
        uncached += not cache.serve_and_cache(key, match, retention)
        if check_every and i % check_every == 0:
            cache.check_invariants(inflight_pages=0)
        if progress is not None:
            progress(1)
    seconds = time.perf_counter() - start
    return ReplayResult(
        policy=name,
        page_size=page_size,
        capacity_tokens=allocator.total_tokens,
        requests=len(trace),
        prompt_tokens=prompt_tokens,
        hit_tokens=hit_tokens,
        hit_rate=hit_tokens / max(1, prompt_tokens),
        seconds=seconds,
        tokens_per_second=prompt_tokens / max(seconds, 1e-9),
        evicted_tokens=cache.stats_evicted_tokens,
        uncached_requests=uncached,
        prefill_work=work,
        prefill_work_saved=saved,
        host_capacity_tokens=host_capacity_tokens,
        host_hit_tokens=host_hits,
        storage_capacity_tokens=storage_capacity_tokens,
        storage_hit_tokens=storage_hits,
        hints=hints,
        hint_seconds=hint_seconds if hints != "none" else 0.0,
        hinted_requests=hinted,
        adapters=by_adapter,
    )
