"""Storage prefetch for waiting requests (`--kv-storage-dir`).

Each step, before admission, `poll` looks at waiting requests it has not looked at: one whose
prefix continues in storage (`MatchResult.storage_tokens`) starts a read of those pages, which
runs in the storage tier's reader thread while the request waits. Reads that have finished are
installed into the host tier (the cache manager's `install`) at once, so the scheduling policy
sees them as host hits. At admission, `admit_ready` says whether a request may go now under the
prefetch policy and installs what has arrived:

    auto          while reading the rest is cheaper than computing it, wait; else go with what
                  has arrived. Reading costs the bytes left over the bandwidth the tier's reads
                  get (measured); computing costs the tokens left over the prefill speed
                  (measured by the scheduler's extend steps). Before either is measured, and
                  until a read stalls for `STALL_SECONDS`, it waits: a disk reads KV far faster
                  than a model computes it.
    best_effort   once any page has arrived, with whatever has;
    wait_complete once its read is done;
    timeout       once done or `--kv-storage-prefetch-timeout` passed.

The running batch never waits on a read: only installing (a copy in memory) runs on the
scheduler's thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from radixkv.mem import Prefetch, PrefixCache
from radixkv.sched.policy import match_key
from radixkv.sched.request import Req

logger = logging.getLogger(__name__)
LOOK_AHEAD = 64  # waiting requests looked at per step, from the front of the queue
STALL_SECONDS = 1.0  # auto: a read that brought nothing for this long is not waited for


class Prefetcher:
    """The storage reads of waiting requests (see the module docstring). `prefill_rate` says
    how many prompt tokens a second the model computes (None until measured)."""

    def __init__(self, cache: PrefixCache, policy: str, timeout: float,
                 prefill_rate: Callable[[], float | None] = lambda: None):
        self.cache, self.policy, self.timeout = cache, policy, timeout
        self.prefill_rate = prefill_rate
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
        now = time.monotonic()
        if self.policy == "auto":
            if not read.fetch.done and self.worth_waiting(read, now):
                return False
        elif not read.fetch.ready(self.policy, self.timeout, now):
            return False
        self._install(req.rid)
        req.peeked = None  # the tree changed under its look
        return True

    def worth_waiting(self, read: Prefetch, now: float) -> bool:
        """`auto`: whether reading the rest of `read` is expected to take less than computing it."""
        fetch, storage = read.fetch, self.cache.storage
        left = len(fetch.keys) - fetch.arrived  # stored pages still to come
        if left <= 0 or now - fetch.last_arrival > STALL_SECONDS:
            return False
        bandwidth, rate = storage.read_bandwidth, self.prefill_rate()
        if not bandwidth or not rate or not storage.page_bytes:
            return True  # nothing measured yet: a read beats computing
        return left * storage.page_bytes / bandwidth < left * storage.page_size / rate

    def _install(self, rid: str) -> None:
        read = self.reads.pop(rid)
        self.cache.install(read)

    def forget(self, req: Req) -> None:
        """`req` left the queue (admitted, aborted): its read, if any, is dropped."""
        self.looked.discard(req.rid)
        read = self.reads.pop(req.rid, None)
        if read is not None:
            self.cache.cancel_prefetch(read)

    def wait(self, seconds: float) -> None:
        """Nothing else can run: give the reads in flight a moment."""
        time.sleep(seconds)
