"""The Mooncake transfer engine over this server's KV pool: page runs written into a peer's pool.

Each side registers every storage tensor of its pool once (`KVPool.storage`: per layer, K's and
V's tensors, each with leading dims (num_pages + 1, page_size)), so page `p` of a tensor is the
bytes [base + p * page_bytes, base + (p + 1) * page_bytes). A write of pages `src` to a peer's
pages `dst` is one batch of (local address, remote address, length) per tensor per run of pages
consecutive on both sides: one `batch_transfer_sync_write`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence

from radixkv.errors import EngineError

logger = logging.getLogger(__name__)


class TransferError(EngineError):
    """The transfer engine could not write a batch (peer gone, timeout, bad address)."""


def page_runs(src: Sequence[int], dst: Sequence[int]) -> list[tuple[int, int, int]]:
    """(first src page, first dst page, pages) for each run consecutive on both sides."""
    if len(src) != len(dst):
        raise ValueError(f"{len(src)} source pages for {len(dst)} destination pages")
    runs: list[tuple[int, int, int]] = []
    for s, d in zip(src, dst):
        if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == d:
            first_s, first_d, n = runs[-1]
            runs[-1] = (first_s, first_d, n + 1)
        else:
            runs.append((s, d, 1))
    return runs


@contextlib.contextmanager
def _quiet() -> Iterator:
    """Mooncake's start-up lines (one of them an 'E' line, 'Local segment descriptor not found',
    that every start prints) go to a file rather than stderr, unless --log-level debug; yields a
    function returning what was said (for an error message)."""
    said = ["see the lines above"]
    if logger.isEnabledFor(logging.DEBUG):
        yield lambda: said[0]
        return
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield lambda: said[0]
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            said[0] = sink.read()[-2000:].decode(errors="replace").strip()


class PoolTransfer:
    """One transfer engine (`session`: "host:port", what a peer names it by) over `tensors`, the
    pool's storage tensors in a fixed order (the peer's must match in shape per page)."""

    def __init__(self, tensors: Sequence, host: str, ib_device: str | None = None):
        if not logger.isEnabledFor(logging.DEBUG):  # Mooncake's own info lines only at --log-level debug
            os.environ.setdefault("MC_LOG_LEVEL", "WARNING")
        from mooncake.engine import TransferEngine

        for t in tensors:
            if not t.is_contiguous():
                raise ValueError("a KV storage tensor is not contiguous")
        self.tensors = list(tensors)
        self.buffers = [t.data_ptr() for t in self.tensors]
        self.page_bytes = [t[0].numel() * t.element_size() for t in self.tensors]
        self.engine = TransferEngine()
        protocol = "rdma" if ib_device else "tcp"
        with _quiet() as said:
            rc = self.engine.initialize(host, "P2PHANDSHAKE", protocol, ib_device or "")
        if rc != 0:
            raise EngineError(f"the Mooncake transfer engine did not start on {host} ({protocol}): {said()}")
        self.session = f"{host}:{self.engine.get_rpc_port()}"
        for t, base in zip(self.tensors, self.buffers):
            if self.engine.register_memory(base, t.numel() * t.element_size()) != 0:
                raise EngineError("the Mooncake transfer engine did not register the KV pool")
        logger.info("transfer engine %s (%s) over %d KV tensors", self.session, protocol, len(self.tensors))

    def write(self, session: str, peer_buffers: Sequence[int], src_pages: Sequence[int],
              dst_pages: Sequence[int]) -> int:
        """Write our `src_pages` into the peer's `dst_pages` (every tensor); the bytes written.

        Raises `TransferError` when the engine reports a failure."""
        if len(peer_buffers) != len(self.buffers):
            raise TransferError(f"the peer's pool has {len(peer_buffers)} KV tensors, ours {len(self.buffers)}")
        runs = page_runs(src_pages, dst_pages)
        src, dst, lengths = [], [], []
        for base, peer, size in zip(self.buffers, peer_buffers, self.page_bytes):
            for s, d, n in runs:
                src.append(base + s * size)
                dst.append(peer + d * size)
                lengths.append(n * size)
        if not lengths:
            return 0
        rc = self.engine.batch_transfer_sync_write(session, src, dst, lengths)
        if rc != 0:
            raise TransferError(f"the transfer engine failed to write {len(src_pages)} page(s) to {session} (rc {rc})")
        return sum(lengths)

    def close(self) -> None:
        for t, base in zip(self.tensors, self.buffers):
            try:
                self.engine.unregister_memory(base)
            except Exception:  # the engine is going away anyway
                pass
