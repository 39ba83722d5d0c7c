"""DiskKVStorage: the storage tier in files of one local directory, kept across restarts.

File format (one run per file, `<identity>-<first page key>.kvp`, both in hex):

    b"RKVP2\\n"  u32 header length (little-endian)  header (JSON)  payload

A page's key is its block hash (`radixkv.mem.block_hash`), the same for every model; the
storage `identity` (`radixkv.mem.storage_identity`: model, KV format, page size, pool layout)
keeps each model's pages apart, in the file's name and its header. The header holds the
identity, the page size, the bytes per page, and per page its key (hex) and CRC-32; the
payload is the pages back to back, each page the rows of every storage tensor of the pool in
order (codes and scales alike: a quantised pool is stored quantised). A stored page is a block
of several device pages (`storage_tier.block_tokens`), so a page's key, check and read cover
64 tokens by default; consecutive pages of a run are read with one read call per
`READ_CHUNK` bytes, and the bandwidth those reads get (checks included) is measured.

Crash safety. A file is written under a temporary name and renamed into place, so a reader
never sees half a file under a real name; temporary files left by a killed server are deleted
at the next start. Start-up rebuilds the index from the headers alone (no page is read); a file
whose header does not parse or whose size does not match is deleted, and so is a file of the
first format (`RKVP1`, keyed by an older hash); one of another identity (another model, KV
format or page size) is left alone and ignored, with one log line. Every
page read is checked against its CRC; a page that fails it makes the file a miss: the file is
deleted and the fetch stops there. A write that fails (a full disk, a read-only directory)
turns the tier off with a warning; serving goes on without it.

Threads. One writer and one reader, each with its own queue; the scheduler's thread only
indexes, enqueues and installs. The index is shared, under a lock. One process uses a
directory at a time (an advisory lock on `.lock`, released when the process ends, however it
ends); a second one runs without the tier, with a warning.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import queue
import re
import struct
import threading
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from radixkv.mem.page_layout import PageLayout
from radixkv.mem.storage_tier import Fetch, Run, StorageTier, StorageTierConfig

logger = logging.getLogger(__name__)

MAGIC = b"RKVP2\n"
OLD_MAGIC = b"RKVP1\n"  # the first format: its keys are no block hashes, its files are deleted
SUFFIX = ".kvp"
TMP_MARK = ".tmp"
OURS_UNFINISHED = re.compile(r"^(?:(?:[0-9a-f]{32}-)?[0-9a-f]{32}\.kvp|\.probe)\.tmp\d+$")  # what a killed writer leaves
_HEAD = struct.Struct("<I")
MAX_HEADER = 64 << 20
MAX_PENDING_BYTES = 512 << 20  # rows queued for the writer at most; past it writes are skipped (or wait)
READ_CHUNK = 32 << 20  # bytes one read call asks for at most (pages arrive chunk by chunk)


class DiskKVStorage(StorageTier):
    """Runs of KV pages in `<directory>/<identity>-*.kvp` (see the module docstring).
    `page_shapes` is the pool's (shape per page, dtype) of each storage tensor; `identity` is
    what the pages' bytes depend on beyond their tokens (`storage_identity`)."""

    def __init__(self, config: StorageTierConfig, directory: str | Path, identity: bytes,
                 page_shapes: Sequence[tuple[tuple[int, ...], torch.dtype]]):
        super().__init__(config)
        self.directory = Path(directory)
        self.identity = identity
        self.layout = PageLayout(page_shapes)
        self.page_bytes = self.layout.page_bytes
        self._chunk_pages = max(1, READ_CHUNK // max(self.page_bytes, 1))
        self._lock = threading.RLock()
        self._pending: set[bytes] = set()
        self._pending_bytes = 0
        self.max_pending_bytes = MAX_PENDING_BYTES
        self._drained = threading.Condition(self._lock)
        self._writes: queue.Queue = queue.Queue()
        self._reads: queue.Queue = queue.Queue()
        self.foreign_files = 0
        self._open()
        self._writer = threading.Thread(target=self._write_loop, name="kv-storage-writer", daemon=True)
        self._reader = threading.Thread(target=self._read_loop, name="kv-storage-reader", daemon=True)
        self._writer.start()
        self._reader.start()

    # -- start-up ------------------------------------------------------------------------------
    def _open(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            probe = self.directory / f".probe{TMP_MARK}{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            self._turn_off(f"{self.directory} is not a writable directory ({e})")
            return
        self._lock_file = open(self.directory / ".lock", "a")  # held until this process ends
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_file.close()
            self._turn_off(f"another process uses {self.directory} (one server per storage directory)")
            return
        found = []
        for path in self.directory.iterdir():
            try:
                if OURS_UNFINISHED.match(path.name) and path.is_file():  # a write a killed server left
                    path.unlink(missing_ok=True)
                elif path.suffix == SUFFIX and path.is_file():
                    found.append((path.stat().st_mtime, path))
            except OSError:
                continue
        found.sort()  # least recently written first: the LRU's order
        corrupt = outdated = 0
        for _, path in found:
            header = self._read_header(path)
            if header == "foreign":
                self.foreign_files += 1
                continue
            if header == "outdated":
                outdated += 1
                path.unlink(missing_ok=True)
                continue
            if header is None or any(k in self._index for k in header["keys"]):  # broken, or a copy
                corrupt += header is None
                path.unlink(missing_ok=True)
                continue
            keys = header["keys"]
            run = Run(path.name, keys, header["size"],
                      {"path": path, "crc": header["crc"], "offset": header["offset"]})
            with self._lock:
                for i, key in enumerate(keys):
                    self._index[key] = (run, i)
                self._runs[run.id] = run
                self.stored_pages += len(keys)
        self.counters["corrupt_files"] += corrupt
        with self._lock:
            self._evict_over_budget()
        logger.info("KV storage %s: %d pages (%d tokens) of this model found%s%s%s", self.directory,
                    self.stored_pages, self.stored_pages * self.page_size,
                    f"; {corrupt} corrupt or truncated file(s) deleted" if corrupt else "",
                    f"; {outdated} file(s) of the first format deleted" if outdated else "",
                    f"; {self.foreign_files} file(s) of another model, KV format or page size ignored"
                    if self.foreign_files else "")

    def _read_header(self, path: Path) -> dict[str, Any] | str | None:
        """The file's header (its keys as bytes, each page's CRC, the payload's offset and the
        file's size); "foreign" for another identity; "outdated" for the first format; None when
        the file is broken in any way (it is then deleted: nothing in it is trusted)."""
        prefix = f"{self.identity.hex()}-"
        try:
            with open(path, "rb") as f:
                head = f.read(len(MAGIC) + _HEAD.size)
                if head[: len(OLD_MAGIC)] == OLD_MAGIC:
                    return "outdated"
                if not path.name.startswith(prefix) and head[: len(MAGIC)] == MAGIC:
                    return "foreign"  # (another identity's name; its header is not read)
                if len(head) < len(MAGIC) + _HEAD.size or head[: len(MAGIC)] != MAGIC:
                    return None
                (length,) = _HEAD.unpack(head[len(MAGIC):])
                if length > MAX_HEADER:
                    return None
                header = json.loads(f.read(length))
            if not isinstance(header, dict):
                return None
            if header.get("identity") != self.identity.hex() or header.get("page_bytes") != self.page_bytes \
                    or header.get("page_size") != self.page_size:
                return "foreign"
            keys = [bytes.fromhex(k) for k in header["keys"]]
            crc = [int(c) for c in header["crc"]]
            if not keys or len(keys) != len(crc) or path.stem != prefix + keys[0].hex():  # named by its first key
                return None
            size = len(head) + length + len(keys) * self.page_bytes
            if path.stat().st_size != size:
                return None  # torn: the pages are not all there
            return {"keys": keys, "crc": crc, "offset": len(head) + length, "size": size}
        except Exception:  # whatever a corrupt file holds, it is only a miss
            return None

    def _turn_off(self, why: str) -> None:
        if self.enabled:
            logger.warning("KV storage tier turned off: %s; serving goes on without it", why)
        self.enabled = False
        with self._lock:
            self._drained.notify_all()

    # -- writing -------------------------------------------------------------------------------
    def _held_or_pending(self, key: bytes) -> bool:
        with self._lock:
            return key in self._index or key in self._pending

    def _store(self, keys: list[bytes], rows: Any, picked: list[int], wait: bool = False) -> bool:
        if rows is None:
            raise ValueError("DiskKVStorage.write needs the pages' rows")
        nbytes = len(keys) * self.page_bytes
        with self._lock:
            if self._pending_bytes + nbytes > self.max_pending_bytes and self._pending_bytes:
                if not wait:  # the disk is behind: this run is dropped, as it would be without the tier
                    self.counters["skipped_pages"] += len(keys)
                    return False
                self._drained.wait_for(lambda: self._pending_bytes + nbytes <= self.max_pending_bytes
                                       or not self._pending_bytes or not self.enabled)
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
                if self.enabled:
                    self._write_file(keys, rows)
            except OSError as e:
                self.counters["write_errors"] += 1
                self._turn_off(f"writing to {self.directory} failed ({e})")
            except Exception:  # never let the writer thread die silently
                logger.exception("KV storage: a write failed")
                self.counters["write_errors"] += 1
            finally:
                with self._lock:
                    self._pending.difference_update(keys)
                    self._pending_bytes -= len(keys) * self.page_bytes
                    self._drained.notify_all()
                self._writes.task_done()

    def _write_file(self, keys: list[bytes], rows: list[torch.Tensor]) -> None:
        pages = [self.layout.encode(rows, j) for j in range(len(keys))]
        crc = [zlib.crc32(p) for p in pages]
        header = json.dumps({"identity": self.identity.hex(), "page_size": self.page_size,
                             "page_bytes": self.page_bytes, "keys": [k.hex() for k in keys],
                             "crc": crc}).encode()
        final = self.directory / f"{self.identity.hex()}-{keys[0].hex()}{SUFFIX}"
        tmp = self.directory / f"{final.name}{TMP_MARK}{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                f.write(MAGIC + _HEAD.pack(len(header)) + header)
                for page in pages:
                    f.write(page)
            os.replace(tmp, final)  # whole or not at all under its real name
        except BaseException:
            tmp.unlink(missing_ok=True)  # (a full disk gets its space back)
            raise
        offset = len(MAGIC) + _HEAD.size + len(header)
        run = Run(final.name, keys, offset + len(pages) * self.page_bytes,
                  {"path": final, "crc": crc, "offset": offset})
        with self._lock:  # (no run has this id: its first key was neither held nor pending)
            self._register(run)

    def _drop_run(self, run: Run, evicted: bool = True) -> None:
        with self._lock:
            if self._runs.get(run.id) is run:  # (a reader and the writer may both drop it)
                super()._drop_run(run, evicted)

    def _delete(self, run: Run) -> None:
        if run.meta is not None:
            Path(run.meta["path"]).unlink(missing_ok=True)

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
                logger.exception("KV storage: a read failed")
            finally:
                fetch.done = True

    def _read(self, fetch: Fetch) -> None:
        files: dict[int, Any] = {}  # id(run) -> its open file
        keys, i = fetch.keys, 0
        try:
            while i < len(keys):
                if fetch.cancelled or not self.enabled:
                    return
                with self._lock:
                    held = self._index.get(keys[i])
                    if held is None:
                        return  # evicted since the request looked
                    run, first = held
                    self._runs.move_to_end(run.id)
                n = 1  # the keys that go on in the same run, read with one call
                while (i + n < len(keys) and n < self._chunk_pages and first + n < len(run.keys)
                       and run.keys[first + n] == keys[i + n]):
                    n += 1
                pages = self._read_pages(run, first, n, files)
                for page in pages:
                    fetch.add(page)
                self.counters["read_pages"] += len(pages)
                self.counters["bytes_read"] += len(pages) * self.page_bytes
                if len(pages) < n:  # gone (evicted since it was looked up) or failed its check
                    with self._lock:
                        still = self._runs.get(run.id) is run
                    if still:
                        self.counters["corrupt_files"] += 1
                        logger.warning("KV storage: %s failed its check; deleted, read as a miss", run.id)
                        self._drop_run(run, evicted=False)
                    return
                i += n
        finally:
            for f in files.values():
                f.close()

    def _read_pages(self, run: Run, first: int, n: int, files: dict[int, Any]) -> list[list[torch.Tensor]]:
        """Pages `first` to `first + n` of `run`, each as one tensor per storage tensor (views
        of one buffer), read with one call; stops before the first torn or corrupt page."""
        meta, size = run.meta, self.page_bytes
        start = time.perf_counter()
        try:
            f = files.get(id(run))
            if f is None:
                f = files[id(run)] = open(meta["path"], "rb")
                if hasattr(os, "posix_fadvise"):  # the kernel reads the rest of the run ahead meanwhile
                    os.posix_fadvise(f.fileno(), meta["offset"] + first * size, 0, os.POSIX_FADV_WILLNEED)
            f.seek(meta["offset"] + first * size)
            data = torch.empty(n * size, dtype=torch.uint8)  # (not zeroed: the read fills it)
            view = memoryview(data.numpy()).cast("B")
            got = f.readinto(view) or 0
        except OSError:
            return []
        out = []
        for j in range(min(n, got // size)):
            if zlib.crc32(view[j * size:(j + 1) * size]) != meta["crc"][first + j]:
                break
            out.append(self.layout.decode(data, j * size))
        if out:
            rate = len(out) * size / max(time.perf_counter() - start, 1e-6)
            self.read_bandwidth = rate if self.read_bandwidth is None else 0.7 * self.read_bandwidth + 0.3 * rate
        return out

    # -- life ----------------------------------------------------------------------------------
    @property
    def location(self) -> str:
        return str(self.directory)

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "storage_dir": str(self.directory), "storage_foreign_files": self.foreign_files,
                "storage_pending_pages": len(self._pending), "storage_block_tokens": self.page_size,
                "storage_read_gbs": None if self.read_bandwidth is None else round(self.read_bandwidth / 1e9, 3)}

    def flush(self) -> None:
        """Wait until every queued write is on disk (or failed)."""
        self._writes.join()

    def close(self) -> None:
        self._reads.put(None)
        self._writes.put(None)
        self._writer.join(timeout=300)
        self._reader.join(timeout=5)
        lock = getattr(self, "_lock_file", None)
        if lock is not None and not lock.closed and not self._writer.is_alive():
            lock.close()  # (closing drops the lock; a writer still at it keeps it until the process ends)
