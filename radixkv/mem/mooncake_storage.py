"""MooncakeKVStorage: the storage tier in a Mooncake Store that every replica shares.

Every replica of one model connects to the same Mooncake master (`--kv-storage-backend mooncake
--kv-storage-config '{"master_server_address": "HOST:PORT"}'`) and mounts part of its host
memory into the store; a page one replica writes, any other finds. A page's object key is
`radixkv/<storage identity>/<block hash>`: the identity (`storage_identity`: model, KV format,
block size, pool layout) keeps models apart, the block hash (`block_hash`, chained from the
request's cache namespace) keeps prefixes and tenants apart -- the same hash the disk tier, KV
events and traces use.

Value format: a 64-byte header -- `b"RKVM1\\n"`, the identity (16 bytes), the key (16 bytes),
the payload's CRC-32 (u32, little-endian), zeros -- then the payload (one stored page:
`PageLayout`), read straight into a buffer of ours and viewed in place (the header keeps every
tensor aligned). A value whose size, identity, key or CRC does not match is a miss (and is
removed from the store), never served. A batch read that fails is read again, halved.

What is stored is the master's to keep or evict: this tier keeps no index of its own beyond
short-lived answers (`LOOKUP_TTL`) to "does the store hold this key?", so a lookup from the
scheduler's thread is one batched RPC at most per `LOOKUP_BATCH` keys, and repeated looks at
a waiting request cost none.

Availability. Connecting runs in a thread (a missing master makes `setup` block for a long
time); until it succeeds, whenever the master does not answer the link thread's probe (once a
second), and from the first lookup that fails (the RPC timeout is cut to 1 s: a hung master holds
the scheduler's thread that long, once), the tier is *unavailable*: lookups miss and writes are
skipped (counted), so serving goes on from the device and host tiers. A warning is logged once
when the store goes away and a line when it is back; a master that restarted lost its objects,
so the answers remembered are dropped.
Threads: one writer, one reader (as on disk), one keeping the connection.
"""

from __future__ import annotations

import logging
import os
import queue
import struct
import threading
import time
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from radixkv.config.store_backend import INSTALL_HINT, MooncakeSettings
from radixkv.errors import ConfigError
from radixkv.mem.page_layout import PageLayout
from radixkv.mem.storage_tier import Fetch, StorageTier, StorageTierConfig

logger = logging.getLogger(__name__)

MAGIC = b"RKVM1\n"
_CRC = struct.Struct("<I")
HEADER_BYTES = 64
LOOKUP_BATCH = 16  # keys asked about in one RPC
LOOKUP_TTL = 1.0  # seconds an answer about a key is reused
HEALTH_SECONDS = 1.0  # how often the connection is checked
RETRY_SECONDS = 3.0  # how long after a failed connect the next one starts
SETUP_RETRIES = "1"  # Mooncake's client tries a missing master for ~90 s by default; once is ~4 s
RPC_TIMEOUT_MS = "1000"  # a master that hangs would hold a lookup (on the scheduler's thread) for 30 s
MAX_PENDING_BYTES = 256 << 20  # bytes queued for the writer at most; past it writes are skipped


def _store_class() -> Any:
    if not logger.isEnabledFor(logging.DEBUG):  # Mooncake's own info lines only at --log-level debug
        os.environ.setdefault("MC_LOG_LEVEL", "WARNING")
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as e:  # (checked at start-up too; a broken install lands here)
        raise ConfigError(f"kv_storage_backend='mooncake': cannot import mooncake.store ({e}): {INSTALL_HINT}") from None
    return MooncakeDistributedStore


class MooncakeKVStorage(StorageTier):
    """Stored pages in a Mooncake Store (see the module docstring). `page_shapes` is the pool's
    (shape per stored page, dtype) of each storage tensor; `identity` is what the pages' bytes
    depend on beyond their tokens (`storage_identity`)."""

    shared = True  # (another replica's writes are found: there is no local index to trust)

    def __init__(self, config: StorageTierConfig, settings: MooncakeSettings, identity: bytes,
                 page_shapes: Sequence[tuple[tuple[int, ...], torch.dtype]]):
        super().__init__(config)
        self.settings, self.identity = settings, identity
        self.layout = PageLayout(page_shapes)
        self.page_bytes = self.layout.page_bytes
        self._prefix = f"radixkv/{identity.hex()}/"
        self._header = HEADER_BYTES
        assert len(MAGIC) + len(identity) + 16 + _CRC.size <= HEADER_BYTES
        self._batch_bytes = max(self.page_bytes, settings.local_buffer_size // 2)  # one put/get batch at most
        self._cls = _store_class()
        self._client: Any = None
        self.available = False
        self._lock = threading.RLock()
        self._known: dict[bytes, tuple[bool, float]] = {}  # key -> (in the store, when asked)
        self._pending: set[bytes] = set()
        self._pending_bytes = 0
        self._writes: queue.Queue = queue.Queue()
        self._reads: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._warned = False
        self.counters.update({"lookups": 0, "store_unavailable": 0, "read_retries": 0})
        loops = {"writer": self._write_loop, "reader": self._read_loop, "link": self._link_loop}
        self._threads = [threading.Thread(target=f, name=f"kv-mooncake-{n}", daemon=True) for n, f in loops.items()]
        for t in self._threads:
            t.start()

    # -- the connection ------------------------------------------------------------------------
    def _link_loop(self) -> None:
        os.environ.setdefault("MC_STORE_CLIENT_SETUP_RETRIES", SETUP_RETRIES)  # (the user's settings win)
        os.environ.setdefault("MC_RPC_TIMEOUT_MS", RPC_TIMEOUT_MS)
        while not self._stop.is_set():
            if self._client is None:
                store = self._cls()
                try:
                    rc = store.setup(self.settings.as_setup())
                except Exception as e:  # (a bad address, an RDMA device that is not there)
                    rc = f"{type(e).__name__}: {e}"
                if self._stop.is_set():
                    return
                if rc == 0:
                    self._client = store
                    self._set_available(True)
                else:
                    self._set_available(False, f"cannot connect (setup returned {rc})")
                    self._stop.wait(RETRY_SECONDS)
                continue
            try:  # (the health check is local; a lookup is a round trip, bounded by RPC_TIMEOUT_MS)
                healthy = self._client.health_check() == 0 and self._client.is_exist(self._prefix + "probe") >= 0
            except Exception:
                healthy = False
            self._set_available(healthy, "its master does not answer")
            self._stop.wait(HEALTH_SECONDS)

    def _set_available(self, up: bool, why: str = "") -> None:
        with self._lock:
            was, self.available = self.available, up
            if up and not was:
                self._known.clear()  # (a master that restarted lost its objects)
        where = self.settings.master_server_address
        if up and not was:
            logger.info("KV storage: Mooncake store at %s connected%s", where, " again" if self._warned else "")
        elif not up and (was or not self._warned):
            self.counters["store_unavailable"] += 1
            logger.warning("KV storage: the Mooncake store at %s is unavailable: %s; serving goes on from the "
                           "device and host tiers, and the store is picked up again when it answers", where, why)
            self._warned = True

    # -- lookup --------------------------------------------------------------------------------
    def _name(self, key: bytes) -> str:
        return self._prefix + key.hex()

    @property
    def may_hold(self) -> bool:
        return self.enabled and self.available

    def _ask(self, keys: list[bytes]) -> list[bool]:
        """Whether the store holds each of `keys` (remembered answers first, one RPC for the rest)."""
        now = time.monotonic()
        with self._lock:
            answers = [self._known.get(k) for k in keys]
        unknown = [k for k, a in zip(keys, answers) if a is None or now - a[1] > LOOKUP_TTL]
        if unknown:
            store = self._client
            try:
                got = store.batch_is_exist([self._name(k) for k in unknown]) if store is not None else [-1] * len(unknown)
            except Exception:
                got = [-1] * len(unknown)
            self.counters["lookups"] += 1
            if any(g < 0 for g in got):  # (an error, not an answer: no more lookups until it answers again)
                self._set_available(False, f"a lookup failed (code {min(got)})")
            with self._lock:
                if len(self._known) > 1 << 16:
                    self._known.clear()
                for k, g in zip(unknown, got):
                    self._known[k] = (g == 1, now)
                answers = [self._known.get(k) for k in keys]
        return [bool(a and a[0]) for a in answers]

    def holds(self, key: bytes) -> bool:
        return self.may_hold and self._ask([key])[0]

    def held_run(self, keys: Iterable[bytes]) -> int:
        if not self.may_hold:
            return 0
        n, keys = 0, list(keys)
        for at in range(0, len(keys), LOOKUP_BATCH):
            for held in self._ask(keys[at:at + LOOKUP_BATCH]):
                if not held:
                    return n
                n += 1
        return n

    # -- writing -------------------------------------------------------------------------------
    def needs(self, keys: Sequence[bytes]) -> bool:
        if not self.may_hold:  # (a write the store would have taken, skipped while it is away)
            self.counters["skipped_pages"] += len(keys) * self.enabled
            return False
        with self._lock:
            rest = [k for k in keys if k not in self._pending]
        return bool(rest) and not all(self._ask(rest))

    def write(self, keys: Sequence[bytes], rows: Any = None, wait: bool = False) -> int:
        if not self.may_hold:
            self.counters["skipped_pages"] += len(keys)
            return 0
        return super().write(keys, rows, wait)

    def _held_or_pending(self, key: bytes) -> bool:
        with self._lock:
            pending = key in self._pending
        return pending or self._ask([key])[0]

    def _store(self, keys: list[bytes], rows: Any, picked: list[int], wait: bool = False) -> bool:
        if rows is None:
            raise ValueError("MooncakeKVStorage.write needs the pages' rows")
        nbytes = len(keys) * self.page_bytes
        with self._lock:
            if self._pending_bytes + nbytes > MAX_PENDING_BYTES and self._pending_bytes:
                self.counters["skipped_pages"] += len(keys)  # the store is behind: as without the tier
                return False
            self._pending.update(keys)
            self._pending_bytes += nbytes
        index = torch.tensor(picked, dtype=torch.int64)
        rows = [r.index_select(0, index) if len(picked) < r.shape[0] else r for r in rows]
        self._writes.put((keys, rows))
        return True

    def _write_loop(self) -> None:
        while True:
            job = self._writes.get()
            if job is None:
                self._writes.task_done()
                return
            keys, rows = job
            try:
                if self.available:
                    self._put(keys, rows)
                else:
                    self.counters["skipped_pages"] += len(keys)
            except Exception:  # never let the writer thread die silently
                logger.exception("KV storage: a write to the Mooncake store failed")
                self.counters["write_errors"] += 1
            finally:
                with self._lock:
                    self._pending.difference_update(keys)
                    self._pending_bytes -= len(keys) * self.page_bytes
                self._writes.task_done()

    def _value(self, key: bytes, payload: bytes) -> bytes:
        head = b"".join((MAGIC, self.identity, key, _CRC.pack(zlib.crc32(payload))))
        return b"".join((head, bytes(HEADER_BYTES - len(head)), payload))

    def _put(self, keys: list[bytes], rows: list[torch.Tensor]) -> None:
        per = max(1, self._batch_bytes // (self.page_bytes + self._header))
        for at in range(0, len(keys), per):
            part = keys[at:at + per]
            values = [self._value(k, self.layout.encode(rows, at + j)) for j, k in enumerate(part)]
            rc = self._client.put_batch([self._name(k) for k in part], values)
            if rc != 0:
                self.counters["write_errors"] += 1
                logger.debug("KV storage: Mooncake put_batch of %d page(s) returned %s", len(part), rc)
                return
            now = time.monotonic()
            with self._lock:
                for k in part:
                    self._known[k] = (True, now)
            self.stored_pages += len(part)  # (written by this replica; the store's size is the master's)
            self.counters["written_pages"] += len(part)
            self.counters["bytes_written"] += len(part) * self.page_bytes

    # -- reading -------------------------------------------------------------------------------
    def fetch(self, keys: Sequence[bytes]) -> Fetch:
        fetch = Fetch(keys)
        self.counters["prefetches"] += 1
        self._reads.put(fetch)
        return fetch

    def _read_loop(self) -> None:
        while True:
            fetch = self._reads.get()
            if fetch is None:
                return
            try:
                self._read(fetch)
            except Exception:
                logger.exception("KV storage: a read from the Mooncake store failed")
            finally:
                fetch.done = True

    def _read(self, fetch: Fetch) -> None:
        per = max(1, self._batch_bytes // (self.page_bytes + self._header))
        keys = fetch.keys
        for at in range(0, len(keys), per):
            if fetch.cancelled or not self.available:
                return
            part = keys[at:at + per]
            start = time.perf_counter()
            got = 0
            for key, page in zip(part, self._get_retrying(part)):
                page = self._check(key, page)
                if page is None:
                    break
                fetch.add(page)
                got += 1
            if got:
                rate = got * self.page_bytes / max(time.perf_counter() - start, 1e-6)
                self.read_bandwidth = rate if self.read_bandwidth is None else 0.7 * self.read_bandwidth + 0.3 * rate
            self.counters["read_pages"] += got
            self.counters["bytes_read"] += got * self.page_bytes
            if got < len(part):
                return

    def _get_retrying(self, keys: list[bytes]) -> list[tuple[torch.Tensor, int] | None]:
        """`_get`, from the first failed key asked again in half the batch down to one key (a miss):
        a large batch on a loaded machine can outlast the master's lease on its objects (LEASE_EXPIRED)."""
        out: list[tuple[torch.Tensor, int] | None] = []
        size = len(keys)
        while len(out) < len(keys):
            part = self._get(keys[len(out):len(out) + size])
            ok = next((i for i, value in enumerate(part) if value is None), len(part))
            out += part[:ok]
            if ok < len(part):
                if size == 1 or self._stop.is_set():
                    break  # (a miss)
                size = max(1, size // 2)
                self.counters["read_retries"] += 1
        return out + [None] * (len(keys) - len(out))

    def _get(self, keys: list[bytes]) -> list[tuple[torch.Tensor, int] | None]:
        """Each key's value read straight into one buffer of ours (registered with the store for
        the call): (the value's bytes, its size as the store reported it), or None if absent."""
        size = self._header + self.page_bytes
        buf = torch.empty(len(keys) * size, dtype=torch.uint8)  # (not zeroed: the reads fill it)
        base = buf.data_ptr()
        client = self._client
        if client.register_buffer(base, buf.numel()) != 0:
            return [None] * len(keys)
        try:
            got = client.batch_get_into([self._name(k) for k in keys], [base + i * size for i in range(len(keys))],
                                        [size] * len(keys))
        finally:
            client.unregister_buffer(base)
        return [(buf[i * size:(i + 1) * size], n) if n > 0 else None for i, n in enumerate(got)]

    def _check(self, key: bytes, value: tuple[torch.Tensor, int] | None) -> list[torch.Tensor] | None:
        """The page in `value` if it is whole and is `key`'s of this identity; else None (a
        value that is there but wrong is removed from the store)."""
        if value is None:
            with self._lock:
                self._known[key] = (False, time.monotonic())
            return None  # evicted since it was looked up
        data, n = value
        view = memoryview(data.numpy()).cast("B")
        head = len(MAGIC) + len(self.identity)
        ok = (n == self._header + self.page_bytes and view[:len(MAGIC)] == MAGIC
              and view[len(MAGIC):head] == self.identity and view[head:head + 16] == key)
        if ok:
            (crc,) = _CRC.unpack_from(view, head + 16)
            ok = zlib.crc32(view[self._header:]) == crc
        if not ok:
            self.counters["corrupt_files"] += 1
            logger.warning("KV storage: Mooncake object %s failed its check; removed, read as a miss", self._name(key))
            with self._lock:
                self._known[key] = (False, time.monotonic())
            try:
                self._client.remove(self._name(key), True)
            except Exception:
                pass
            return None
        return self.layout.decode(data, self._header)  # (views of this read's own buffer)

    # -- life ----------------------------------------------------------------------------------
    @property
    def location(self) -> str:
        return f"the Mooncake store at {self.settings.master_server_address}"

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "storage_backend": "mooncake", "storage_available": self.available,
                "storage_master": self.settings.master_server_address, "storage_pending_pages": len(self._pending),
                "storage_block_tokens": self.page_size,
                "storage_read_gbs": None if self.read_bandwidth is None else round(self.read_bandwidth / 1e9, 3)}

    def flush(self) -> None:
        """Wait until every queued write is in the store (or failed)."""
        self._writes.join()

    def close(self) -> None:
        self._stop.set()
        self._reads.put(None)
        self._writes.put(None)
        for t in self._threads[:2]:
            t.join(timeout=30)
        store, self._client, self.available = self._client, None, False
        if store is not None:
            try:
                store.close()
            except Exception:
                pass
