"""The storage tier: KV pages kept below the host tier, keyed by their block hash (`block_hash`).

The cache's tier controller decides *what* moves (`radixkv.mem.tier_controller`); a
`StorageTier` owns the pages' index, its size budget and its LRU. The unit it stores, reads
and evicts is a *run*: the consecutive pages of one prefix written together (one node's edge,
one file on disk). A key is held by at most one run; a run written later skips the keys
already held, so runs never overlap. Eviction drops whole runs, least recently used first.

`StorageTier` itself keeps no bytes (the trace simulator uses it to count pages);
`radixkv.mem.disk_storage.DiskKVStorage` keeps every run in a file of a directory and
survives restarts.

A stored page is a *block* of `page_size` tokens of its own, a whole number of the device
pool's pages (`block_tokens`: 64 by default, whatever the device page size): one key, one
check and one read per block, not per device page (SGLang's HiCache stores 64-token pages
under a page-1 device pool the same way). The tier controller groups device pages into blocks.

Reads are *fetches*: `fetch(keys)` starts reading the pages of `keys` (a prefix's
continuation, in order) and returns a `Fetch` whose leading `arrived` pages are ready. Here a
fetch is done at once; on disk it runs in a thread while the request waits for admission,
and the tier measures the bandwidth its reads get (`read_bandwidth`), which the `auto`
prefetch policy weighs against computing the same tokens.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from radixkv.config import STORAGE_PREFETCH_POLICIES as PREFETCH_POLICIES
from radixkv.config.fields import STORAGE_BLOCK_TOKENS
from radixkv.config import STORAGE_WRITE_POLICIES as WRITE_POLICIES
from radixkv.errors import ConfigError


def block_tokens(requested: int | None, device_page_size: int) -> int:
    """Tokens per stored page: `requested` (a multiple of the device page size), or by
    default `STORAGE_BLOCK_TOKENS` rounded up to whole device pages."""
    if requested is not None:
        if requested < 1 or requested % device_page_size:
            raise ConfigError(f"kv_storage_block_size={requested}: must be a multiple of page_size ({device_page_size})")
        return requested
    return -(-STORAGE_BLOCK_TOKENS // device_page_size) * device_page_size


@dataclass(frozen=True, slots=True)
class StorageTierConfig:
    """`num_pages` stored pages (blocks) of `page_size` tokens at most (a multiple of the
    device pool's page size: see `block_tokens`).

    `write_policy`: a page goes to storage when the host tier lets it go (`write-back`), as soon
    as it is cached (`write-through`: what replicas sharing a store need; whatever that write
    missed is still written back), or once it has been hit `hit_threshold` times
    (`write-through-selective`: only hot data reaches the disk, and it is there before any
    eviction). `prefetch_policy`: a request whose
    prefix continues in storage waits while reading the rest costs less than computing it
    (`auto`: see `radixkv.sched.prefetch`), is admitted with whatever has arrived
    (`best_effort`), only once all of it has (`wait_complete`), or once it has or
    `prefetch_timeout` seconds passed (`timeout`). `persist_timeout`: seconds a clean shutdown spends writing what the faster
    tiers hold (`TierController.persist`)."""

    num_pages: int
    page_size: int
    write_policy: str = "write-back"
    hit_threshold: int = 2
    prefetch_policy: str = "auto"
    prefetch_timeout: float = 1.0
    persist_timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.num_pages < 1:
            raise ConfigError(f"storage tier: num_pages must be >= 1, got {self.num_pages}")
        if self.page_size < 1:
            raise ConfigError(f"storage tier: page_size must be >= 1, got {self.page_size}")
        if self.write_policy not in WRITE_POLICIES:
            raise ConfigError(f"kv_storage_write_policy={self.write_policy!r}: must be one of {list(WRITE_POLICIES)}")
        if self.hit_threshold < 1:
            raise ConfigError(f"kv_storage_hit_threshold={self.hit_threshold}: must be >= 1")
        if self.prefetch_policy not in PREFETCH_POLICIES:
            raise ConfigError(f"kv_storage_prefetch_policy={self.prefetch_policy!r}: must be one of "
                              f"{list(PREFETCH_POLICIES)}")
        if not self.prefetch_timeout >= 0:
            raise ConfigError(f"kv_storage_prefetch_timeout={self.prefetch_timeout}: must be >= 0 seconds")
        if not self.persist_timeout >= 0:
            raise ConfigError(f"kv_storage_persist_timeout={self.persist_timeout}: must be >= 0 seconds")

    @property
    def selective(self) -> bool:
        """Pages are written once hot, and only then (never on the host tier's eviction)."""
        return self.write_policy == "write-through-selective"

    @property
    def on_insert(self) -> bool:
        """Pages are written as soon as they are cached."""
        return self.write_policy == "write-through"


class Fetch:
    """A read of the pages of `keys` (in order). `arrived` leading pages are ready (`pages[i]`:
    one tensor per storage tensor of the pool, or None where the tier keeps no bytes); `done`
    once no more will arrive (all of them, a page that failed its check, or `cancel`)."""

    def __init__(self, keys: Sequence[bytes]):
        self.keys = list(keys)
        self.started = self.last_arrival = time.monotonic()
        self.pages: list[Any] = []
        self.arrived = 0
        self.done = False
        self.cancelled = False

    def add(self, page: Any) -> None:
        """One more page has arrived (the reader's thread)."""
        self.pages.append(page)
        self.arrived += 1
        self.last_arrival = time.monotonic()

    @property
    def complete(self) -> bool:
        return self.arrived == len(self.keys)

    def cancel(self) -> None:
        self.cancelled = True

    def ready(self, policy: str, timeout: float, now: float | None = None) -> bool:
        """Whether a request waiting on this fetch may be admitted under `policy` (`auto` is
        the prefetcher's to decide: here it waits for the whole read)."""
        if self.done:
            return True
        if policy == "best_effort":  # with what has arrived, once anything has
            return self.arrived > 0
        if policy == "timeout":
            return (time.monotonic() if now is None else now) - self.started >= timeout
        return False  # wait_complete


@dataclass(slots=True)
class Prefetch:
    """A read from storage for one request: the pages continuing `key` from token `start`."""

    fetch: Fetch
    key: tuple
    namespace: Any
    start: int

    @property
    def tokens(self) -> int:
        return len(self.fetch.keys)


@dataclass(slots=True)
class Run:
    """Consecutive pages of one prefix, stored together."""

    id: Any
    keys: list[bytes]
    nbytes: int = 0
    meta: Any = field(default=None)  # the backend's (a file path)


class StorageTier:
    """The index, budget and LRU of stored runs, without data (see the module docstring).
    `shared`: other servers write to it too (a Mooncake Store), so what it holds is asked, not
    indexed here, and a shutdown does not persist into it (it was written through)."""

    shared = False

    def __init__(self, config: StorageTierConfig):
        self.config = config
        self.page_size = config.page_size
        self.enabled = True
        self._index: dict[bytes, tuple[Run, int]] = {}  # key -> (its run, its page in the run)
        self._runs: OrderedDict[Any, Run] = OrderedDict()  # least recently used first
        self._ids = itertools.count()
        self.stored_pages = 0
        self.on_evict: Callable[[list[bytes]], None] | None = None  # told the keys of each run evicted
        self.page_bytes = 0  # bytes per stored page (0 where the tier keeps no bytes)
        self.read_bandwidth: float | None = None  # bytes/s its reads get, once measured (None: not yet)
        self.counters = {"written_pages": 0, "read_pages": 0, "evicted_pages": 0, "bytes_written": 0,
                         "bytes_read": 0, "prefetches": 0, "prefetches_complete": 0, "prefetches_partial": 0,
                         "prefetches_failed": 0, "corrupt_files": 0, "write_errors": 0, "skipped_pages": 0}

    # -- lookup --------------------------------------------------------------------------------
    @property
    def may_hold(self) -> bool:
        """Whether a lookup can find anything (a cheap test before hashing a key)."""
        return self.enabled and self.stored_pages > 0

    def holds(self, key: bytes) -> bool:
        return self.enabled and key in self._index

    def held_run(self, keys: Sequence[bytes] | Any) -> int:
        """How many leading keys of `keys` (any iterable: it is read only as far as it hits) the
        tier holds."""
        n = 0
        for key in keys:
            if not self.holds(key):
                break
            n += 1
        return n

    # -- writing -------------------------------------------------------------------------------
    def needs(self, keys: Sequence[bytes]) -> bool:
        """Whether `write(keys, ...)` would store anything (so its rows are worth copying)."""
        return self.enabled and not all(self._held_or_pending(k) for k in keys)

    def write(self, keys: Sequence[bytes], rows: Any = None, wait: bool = False) -> int:
        """Store the pages of `keys` (their bytes in `rows`: one CPU tensor `[n, *shape]` per
        storage tensor, or None here), skipping keys already held; returns pages queued. A
        backend whose writes are behind skips the run, or with `wait` waits for room."""
        if not self.enabled:
            return 0
        new = [i for i, k in enumerate(keys) if not self._held_or_pending(k)][: self.config.num_pages]
        if not new or not self._store([keys[i] for i in new], rows, new, wait):
            return 0
        return len(new)

    def _held_or_pending(self, key: bytes) -> bool:
        return key in self._index

    def _store(self, keys: list[bytes], rows: Any, picked: list[int], wait: bool = False) -> bool:
        """Keep the run of `keys` (`picked`: their positions in the rows given); whether it was."""
        self._register(Run(next(self._ids), keys))
        return True

    def _register(self, run: Run) -> None:
        """Index a run that is now stored, and evict over the budget."""
        for i, key in enumerate(run.keys):
            self._index[key] = (run, i)
        self._runs[run.id] = run
        self.stored_pages += len(run.keys)
        self.counters["written_pages"] += len(run.keys)
        self.counters["bytes_written"] += run.nbytes
        self._evict_over_budget(keep=run.id)

    def _evict_over_budget(self, keep: Any = None) -> None:
        """Drop the least recently used runs (never `keep`, the one just stored) until the
        stored pages fit the budget."""
        while self.stored_pages > self.config.num_pages:
            victim = next((run for rid, run in self._runs.items() if rid != keep), None)
            if victim is None:
                break  # one run larger than the whole budget: it alone stays
            self._drop_run(victim)

    def _drop_run(self, run: Run, evicted: bool = True) -> None:
        del self._runs[run.id]
        for key in run.keys:
            if self._index.get(key, (None,))[0] is run:
                del self._index[key]
        self.stored_pages -= len(run.keys)
        if evicted:
            self.counters["evicted_pages"] += len(run.keys)
            if self.on_evict is not None:
                self.on_evict(run.keys)
        self._delete(run)

    def _delete(self, run: Run) -> None:
        """Backend hook: the run's bytes go."""

    # -- reading -------------------------------------------------------------------------------
    def fetch(self, keys: Sequence[bytes]) -> Fetch:
        """Start reading the pages of `keys` (which the tier holds, in order); see `Fetch`."""
        fetch = Fetch(keys)
        self.counters["prefetches"] += 1
        for key in fetch.keys:
            held = self._index.get(key)
            if held is None:
                break
            self._runs.move_to_end(held[0].id)
            fetch.add(None)
        self.counters["read_pages"] += fetch.arrived
        fetch.done = True
        return fetch

    def finished(self, fetch: Fetch, used_pages: int) -> None:
        """A fetch was installed with `used_pages` of its pages (for the prefetch counters)."""
        key = "prefetches_complete" if fetch.complete and used_pages >= len(fetch.keys) else (
            "prefetches_failed" if fetch.done and not fetch.complete and not fetch.cancelled else "prefetches_partial")
        self.counters[key] += 1

    # -- life ----------------------------------------------------------------------------------
    @property
    def location(self) -> str:
        """Where the stored pages are (for log lines)."""
        return "memory"

    def stats(self) -> dict[str, Any]:
        return {"storage_enabled": self.enabled, "storage_total_tokens": self.config.num_pages * self.page_size,
                "storage_used_tokens": self.stored_pages * self.page_size,
                **{f"storage_{k}": v for k, v in self.counters.items()}}

    def flush(self) -> None:
        """Wait for writes in flight (none here)."""

    def close(self) -> None:
        """Stop the tier's threads, waiting for writes in flight (none here)."""
