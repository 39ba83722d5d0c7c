"""Storage prefetch for waiting requests (`--kv-storage-dir`).

Each step, before admission, `poll` looks at waiting requests it has not looked at: one whose
prefix continues in storage (`MatchResult.storage_tokens`) starts a read of those pages, which
runs in the storage tier's reader thread while the request waits. Reads that have finished are
installed into the host tier (`StorageTieredCache.install`) at once, so the scheduling policy
sees them as host hits. At admission, `admit_ready` says whether a request may go now under the
prefetch policy (`best_effort`: once any page has arrived, with whatever has; `wait_complete`:
once its read is done; `timeout`: once done or `--kv-storage-prefetch-timeout` passed) and installs what
has arrived. The running batch never waits on a read: only installing (a copy in memory) runs
on the scheduler's thread.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from radixkv.config import EngineConfig
from radixkv.kv_bytes import host_tier_pages
from radixkv.mem import KVMemory
from radixkv.mem.disk_storage import DiskKVStorage
from radixkv.mem.page_keys import model_fingerprint, storage_identity
from radixkv.mem.storage_cache import Prefetch, StorageTieredCache
from radixkv.mem.storage_tier import StorageTierConfig
from radixkv.sched.policy import match_key
from radixkv.sched.request import Req

logger = logging.getLogger(__name__)
LOOK_AHEAD = 64  # waiting requests looked at per step, from the front of the queue


def open_storage(config: EngineConfig, model_dir: Path, memory: KVMemory) -> tuple[DiskKVStorage, bytes]:
    """The storage tier `--kv-storage-dir` asks for, over `memory`'s pool, and its key identity."""
    pool = memory.pool
    shapes = pool.page_shapes()
    identity = storage_identity(model_fingerprint(model_dir), config.cache.kv_cache_dtype, config.cache.page_size, shapes)
    row_bytes = sum(t.numel() // t.shape[0] * t.element_size() for tensors in pool.storage for t in tensors)
    pages = host_tier_pages(config.storage.kv_storage_size, config.cache.page_size, row_bytes, "kv_storage_size")
    tier_config = StorageTierConfig(pages, config.cache.page_size, config.storage.kv_storage_write_policy,
                                    config.storage.kv_storage_hit_threshold, config.storage.kv_storage_prefetch_policy,
                                    config.storage.kv_storage_prefetch_timeout)
    return DiskKVStorage(tier_config, config.storage.kv_storage_dir, identity, shapes), identity


class Prefetcher:
    """The storage reads of waiting requests (see the module docstring)."""

    def __init__(self, cache: StorageTieredCache, policy: str, timeout: float):
        self.cache, self.policy, self.timeout = cache, policy, timeout
        self.reads: dict[str, Prefetch] = {}  # rid -> its read in flight
        self.looked: set[str] = set()  # waiting requests already looked at

    @property
    def pending(self) -> bool:
        return bool(self.reads)

    def poll(self, waiting: Any) -> None:
        """Start reads for waiting requests not looked at yet; install the reads that are done."""
        for i, req in enumerate(waiting):
            if i >= LOOK_AHEAD:
                break
            if req.rid in self.looked:
                continue
            self.looked.add(req.rid)
            read = self.cache.prefetch(self.cache.peek(match_key(req), req.namespace))
            if read is not None:
                self.reads[req.rid] = read
                req.peeked = None
        for rid, read in list(self.reads.items()):
            if read.fetch.done:
                self._install(rid)

    def admit_ready(self, req: Req) -> bool:
        """Whether `req` may be admitted now; if so, what its read brought is installed."""
        read = self.reads.get(req.rid)
        if read is None:
            return True
        if not read.fetch.ready(self.policy, self.timeout, time.monotonic()):
            return False
        self._install(req.rid)
        req.peeked = None  # the tree changed under its look
        return True

    def _install(self, rid: str) -> None:
        read = self.reads.pop(rid)
        self.cache.install(read)

    def forget(self, req: Req) -> None:
        """`req` left the queue (admitted, aborted): its read, if any, is dropped."""
        self.looked.discard(req.rid)
        read = self.reads.pop(req.rid, None)
        if read is not None:
            read.fetch.cancel()
            self.cache.storage.finished(read.fetch, 0)

    def wait(self, seconds: float) -> None:
        """Nothing else can run: give the reads in flight a moment."""
        time.sleep(seconds)
