"""Rank 0's side of a tensor-parallel group: start ranks 1..N-1, feed them, stop them.

Start-up is a handshake through the `TCPStore` rank 0 hosts, so a rank that fails is reported
at once, by name, instead of after a collective's timeout:

    rank 0: store; spawn ranks 1..N-1          ranks: connect; set alive/r
    all:    join the process groups
    all:    load their shard                   ranks: set loaded/r (or error/r = why)
    rank 0: size the KV memory; TPStart        ranks: build the same memory; set ready/r

Then every forward is one `TPForward` broadcast, and `close` broadcasts `TPStop` and waits for
the ranks to exit (killing any that do not). Ranks also die with rank 0 however it exits.

Across machines (`--nnodes N`), rank 0 hosts the store at `--dist-init-addr` and starts only
its own node's ranks; each other node's `radixkv serve --node-rank R` starts its ranks
(`radixkv.tp.node`), which join through the same store. A node reports its ranks' failure
(`node-down/R`) and beats (`beat/R`) while it runs; a node whose beat stops for `NODE_SILENT_S`
is lost, as a local rank that exits is.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import weakref
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from radixkv.attention.forward_batch import ForwardBatch
from radixkv.config import EngineConfig
from radixkv.errors import TensorParallelError
from radixkv.mem.kv_memory import KVMemory
from radixkv.parallel.devices import rank_device
from radixkv.parallel.group import SEND_TIMEOUT, TPGroup
from radixkv.tp.journal import KVJournal
from radixkv.tp.messages import TP_CODEC, TPStart, TPStop, forward_message

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 600.0  # loading a shard of a large checkpoint can take minutes
STOP_TIMEOUT_S = 10.0
NODE_SILENT_S = 10.0  # a node whose beat has not changed for this long is lost
CHECK_EVERY_S = 1.0  # remote nodes are asked at most this often


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host, int(port)


def worker_command(rank: int, store_host: str, store_port: int, model_dir: Path, spec: str, gloo: str) -> list[str]:
    """The command line of tensor-parallel rank `rank` > 0 (its parent is the calling process)."""
    return [sys.executable, "-m", "radixkv.tp.worker", "--rank", str(rank), "--store-host", store_host,
            "--store-port", str(store_port), "--parent-pid", str(os.getpid()), "--model-dir", str(model_dir),
            "--config", spec, "--gloo-host", gloo]


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


class TPWorkers:
    """Ranks 1..N-1 of the group rank 0 (this process) leads; `group` is rank 0's collectives."""

    def __init__(self, config: EngineConfig, store: dist.TCPStore, procs: list[subprocess.Popen]):
        self.size = config.runtime.tp_size
        self.nodes = config.runtime.nnodes
        self.store = store
        self.procs = procs  # this node's ranks 1..k-1
        self._beats: dict[int, tuple[bytes, float]] = {}  # node -> (its last beat, when it changed)
        self._asked = 0.0
        self.journal = KVJournal()
        self.group: TPGroup | None = None
        self.failed: str | None = None  # why the group is lost, once it is
        self._closed = False
        self._finalizer = weakref.finalize(self, _kill, procs)  # also at interpreter exit

    @classmethod
    def launch(cls, config: EngineConfig, model_dir: Path) -> TPWorkers:
        """Start this node's ranks 1..k-1 and join the process groups with every rank (rank 0 is
        this process; with `nnodes` > 1 the other nodes start theirs)."""
        from radixkv.parallel.group import gloo_host

        rt = config.runtime
        if rt.node_rank != 0:
            raise TensorParallelError("node_rank > 0 only runs ranks, under `radixkv serve --node-rank R`")
        host, port = split_addr(rt.dist_init_addr) if rt.nnodes > 1 else ("127.0.0.1", 0)
        try:
            store = dist.TCPStore(host, port, None, True, timeout=timedelta(seconds=60), wait_for_workers=False)
        except Exception as e:
            raise TensorParallelError(f"dist_init_addr={rt.dist_init_addr!r}: cannot host the ranks' rendezvous "
                                      f"there ({e})") from None
        spec = json.dumps(config.to_kwargs())
        if rt.nnodes > 1:  # what the other nodes start their ranks with
            from radixkv.mem.storage_identity import model_fingerprint

            store.set("config", spec)
            store.set("model", json.dumps(model_fingerprint(model_dir), sort_keys=True))
        gloo = gloo_host(rt.dist_init_addr)
        procs = [subprocess.Popen(worker_command(rank, "127.0.0.1", store.port, model_dir, spec, gloo))
                 for rank in range(1, rt.ranks_per_node)]
        workers = cls(config, store, procs)
        try:
            workers._wait_for("alive", "start")
            workers.group = TPGroup(store, 0, rt.tp_size, rank_device(config, 0), gloo)
        except BaseException:
            workers.close()
            raise
        logger.info("tensor parallel: ranks 1..%d joined (this node's pids: %s)", config.runtime.tp_size - 1,
                    ", ".join(str(p.pid) for p in procs) or "none")
        return workers

    def wait_loaded(self) -> None:
        """Wait until every rank has loaded its shard (raises if one could not)."""
        self._wait_for("loaded", "load its shard of the model")

    def start(self, memory: KVMemory) -> None:
        """Have every rank build a KV memory like `memory` (its own KV heads), and record rank
        0's changes to `memory` from now on for them to replay."""
        host = memory.host
        self._send(TPStart(memory.allocator.num_pages, memory.req_table.max_reqs, memory.req_table.max_context_len,
                           host.config.num_pages if host is not None else 0,
                           host.config.write_policy if host is not None else "write-back"))
        self._wait_for("ready", "build their KV memory")
        memory.attach_journal(self.journal)

    def send_forward(self, fb: ForwardBatch) -> None:
        """Send every rank the batch, with the KV changes they must replay before it."""
        msg = forward_message(fb, self.journal.table_writes, self.journal.page_ops)
        self.journal.drain()  # only once the message holds them
        self._send(msg)

    def lost(self, cause: BaseException) -> TensorParallelError:
        """Mark the group lost after `cause` broke a joint forward (an error, or an interrupt
        that left the other ranks inside a collective), stop the other ranks, and return the
        error to raise."""
        self._check_ranks()
        if self.failed is None:
            self.failed = f"a tensor-parallel forward failed on rank 0: {type(cause).__name__}: {cause}"
        logger.error("%s; stopping the other ranks", self.failed)
        _kill(self.procs)
        return TensorParallelError(self.failed)

    def close(self) -> None:
        """Stop ranks 1..N-1 and wait for them (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self.failed is None and self.group is not None and all(p.poll() is None for p in self.procs):
            try:
                self._send(TPStop(), timeout=timedelta(seconds=STOP_TIMEOUT_S))
            except (TensorParallelError, KeyboardInterrupt):
                pass
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("tensor-parallel rank (pid %d) did not stop in %.0f s; killing it", p.pid,
                               STOP_TIMEOUT_S)
        self._finalizer()  # kills what is left, waits for it

    # -- internals -------------------------------------------------------------------------------
    def _send(self, msg, timeout: timedelta = SEND_TIMEOUT) -> None:
        if self.failed is not None:
            raise TensorParallelError(self.failed)
        if self._closed and not isinstance(msg, TPStop):
            raise TensorParallelError("the tensor-parallel ranks were stopped")
        data = TP_CODEC.encode(msg)
        try:
            self.group.broadcast_bytes(data, timeout)
        except Exception as e:
            raise self.lost(e) from e
        except BaseException as e:  # an interrupt mid-broadcast: the ranks cannot be trusted
            self.lost(e)
            raise

    def _check_ranks(self) -> None:
        """Set `failed` if a rank reported an error or exited, or another node is down or silent."""
        for rank, p in enumerate(self.procs, start=1):
            if self.store.check([f"error/{rank}"]):
                self.failed = f"tensor-parallel rank {rank} failed: {self.store.get(f'error/{rank}').decode()}"
                return
            code = p.poll()
            if code is not None:
                self.failed = f"tensor-parallel rank {rank} (pid {p.pid}) exited with code {code}"
                return
        if self.nodes > 1:
            self._check_nodes()

    def _check_nodes(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._asked < CHECK_EVERY_S:
            return
        self._asked = now
        k = self.size // self.nodes
        for node in range(1, self.nodes):
            for rank in range(node * k, (node + 1) * k):
                if self.store.check([f"error/{rank}"]):
                    self.failed = f"tensor-parallel rank {rank} (node {node}) failed: " \
                                  f"{self.store.get(f'error/{rank}').decode()}"
                    return
            if self.store.check([f"node-down/{node}"]):
                self.failed = f"node {node} is down: {self.store.get(f'node-down/{node}').decode()}"
                return
            beat = self.store.get(f"beat/{node}") if self.store.check([f"beat/{node}"]) else b""
            last = self._beats.get(node)
            if last is None or last[0] != beat:
                self._beats[node] = (beat, now)
            elif beat and now - last[1] > NODE_SILENT_S:
                self.failed = f"node {node} stopped answering (no beat for {NODE_SILENT_S:.0f} s)"
                return

    @property
    def healthy(self) -> bool:
        """Whether every rank is still there to compute (cheap: a `waitpid` per local rank; other
        nodes are asked at most once a second)."""
        if self.failed is None and (any(p.poll() is not None for p in self.procs) or self.nodes > 1):
            self._check_ranks()
        return self.failed is None and not self._closed

    def _wait_for(self, key: str, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        pending = set(range(1, self.size))
        while pending:
            self._check_ranks()
            if self.failed is not None:
                raise TensorParallelError(f"{self.failed} (while waiting for the ranks to {what})")
            pending = {r for r in pending if not self.store.check([f"{key}/{r}"])}
            if not pending:
                return
            if time.monotonic() > deadline:
                raise TensorParallelError(f"tensor-parallel rank(s) {sorted(pending)} did not {what} within "
                                          f"{START_TIMEOUT_S:.0f} s")
            time.sleep(0.05)
