"""KVEventPublisher: a scheduler's KV cache events on ZMQ, for KV-aware routers.

    PUB     endpoint         every batch: [topic, seq (8 bytes, big-endian), EventBatch]
    ROUTER  replay_endpoint  a subscriber (DEALER or REQ) sends a start sequence number (8 bytes,
                             big-endian) and gets back, on the same socket, every buffered batch
                             from it on as [topic, seq, EventBatch], then [b"", -1, b""]

Sequence numbers start at 0 and grow by one per batch, so a subscriber sees a gap and asks for
what it missed. The last `buffer_steps` batches are kept for replay; a start older than that
is answered with the whole tree as one batch (AllBlocksCleared, then BlockStored for every held
page, parents first), numbered as the last batch published, so a late subscriber can always
rebuild the tree and go on from the next live batch. That tree is the publisher's own
`PageLedger` of the events it sent, kept on its thread: replay never touches the scheduler's
tree. (Frames and event bytes: `radixkv.sched.kv_event_wire`.)

The scheduler hands over each step's events (`publish`, non-blocking); one thread of this
object's own encodes, sends, buffers and answers replays, waking only when there is work.
`close` sends what is queued, then closes the sockets and their context.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from typing import Any

import zmq

from radixkv.config import KVEventsConfig
from radixkv.errors import ConfigError
from radixkv.mem.cache_events import CacheEvent, PageLedger
from radixkv.sched.kv_event_wire import END_OF_REPLAY, encode_batch, sequence_bytes

logger = logging.getLogger(__name__)
CLOSE_LINGER_MS = 200  # how long the last batches may take to leave when closing


class KVEventPublisher:
    """Publishes KV cache event batches (see the module docstring) for pages of `page_size`
    tokens. Raises `ConfigError` naming the endpoint that cannot be bound or connected."""

    def __init__(self, config: KVEventsConfig, page_size: int):
        self.config = config
        self.page_size = page_size
        self.topic = config.topic.encode()
        self.published_batches = 0  # handed over by `publish`: the next one gets this sequence number
        self.published_events = 0
        self._ctx = zmq.Context(1)
        self._pub = self._ctx.socket(zmq.PUB)
        self._replay: zmq.Socket | None = None
        try:
            self._pub.set_hwm(config.hwm)
            self.endpoint = self._open(self._pub, config, config.endpoint, config.binds, "endpoint")
            self.replay_endpoint = None
            if config.replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.SNDHWM, config.buffer_steps + 2)  # a whole replay, never dropped
                self.replay_endpoint = self._open(self._replay, config, config.replay_endpoint, True,
                                                  "replay_endpoint")
        except BaseException:
            self._close_sockets(linger=0)
            raise
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._ledger = PageLedger(page_size)
        self._next_seq = 0
        self._inbox: queue.SimpleQueue[tuple[float, list[CacheEvent]] | None] = queue.SimpleQueue()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    @staticmethod
    def _open(sock: zmq.Socket, config: KVEventsConfig, address: str, bind: bool, key: str) -> str:
        """Bind (on loopback unless `config.expose`) or connect `sock`; the address it ended up
        on (a bound wildcard port resolved). Binding beyond loopback is logged as a warning."""
        try:
            if not bind:
                sock.connect(address)
                return address
            if config.exposed(address):
                logger.warning("KV events: %s binds %s, beyond this machine: the feed carries every tenant's "
                               "token ids and has no credential (docs: Security model)", key, address)
            address = config.bind_address(address)
            sock.bind(address)
        except zmq.ZMQError as e:
            raise ConfigError(f"kv_events_config: {key}={address!r}: cannot "
                              f"{'bind' if bind else 'connect'} ({e})") from None
        return sock.getsockopt_string(zmq.LAST_ENDPOINT)

    # -- the scheduler's side --------------------------------------------------------------------
    def publish(self, events: list[CacheEvent]) -> None:
        """Queue one batch (a step's events, oldest first); returns at once. A replay asked for
        after this returns includes the batch."""
        self._inbox.put((time.time(), events))
        self.published_batches += 1
        self.published_events += len(events)
        self._wake()

    def describe(self) -> dict[str, Any]:
        """Where to subscribe (for /server_info): endpoints as bound, topic, page size."""
        return {"endpoint": self.endpoint, "replay_endpoint": self.replay_endpoint,
                "topic": self.config.topic, "page_size": self.page_size, "block_size": self.page_size,
                "encoding": self.config.encoding, "buffer_steps": self.config.buffer_steps}

    def stats(self) -> dict[str, int]:
        return {"kv_event_batches": self.published_batches, "kv_events_published": self.published_events}

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued, stop the thread, close the sockets and their context."""
        if self._thread.is_alive():
            self._inbox.put(None)
            self._wake()
            self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("the KV event publisher did not stop within %.1f s", timeout)
            return  # its sockets are still in use: the process exit takes them
        self._close_sockets(linger=CLOSE_LINGER_MS)
        for fd in (self._wake_read, self._wake_write):
            os.close(fd)

    def _wake(self) -> None:
        try:
            os.write(self._wake_write, b"\0")
        except BlockingIOError:  # the pipe is full of wake-ups already
            pass

    def _close_sockets(self, linger: int) -> None:
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=linger)
        self._ctx.term()

    # -- the publisher's thread ------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._wake_read, zmq.POLLIN)
        if self._replay is not None:
            poller.register(self._replay, zmq.POLLIN)
        while True:
            ready = dict(poller.poll())
            if self._wake_read in ready:
                try:
                    os.read(self._wake_read, 4096)
                except BlockingIOError:
                    pass
            stop = self._send_queued()
            if self._replay is not None and self._replay in ready:
                self._serve_replays()
            if stop:
                return

    def _send_queued(self) -> bool:
        """Send every queued batch; whether the stop sign came."""
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return False
            if item is None:
                return True
            try:
                self._send(*item)
            except Exception:  # a bad batch must not end publishing
                logger.exception("could not publish a KV event batch")

    def _send(self, ts: float, events: list[CacheEvent]) -> None:
        seq = self._next_seq
        payload = encode_batch(events, ts, self.page_size, self.config.encoding)
        self._pub.send_multipart([self.topic, sequence_bytes(seq), payload])
        self._next_seq += 1
        self._buffer.append((seq, payload))
        self._ledger.apply_all(events)

    def _serve_replays(self) -> None:
        while self._replay.poll(0):
            frames = self._replay.recv_multipart()
            # REQ and DEALER clients put an empty frame before their start; answer in kind
            if len(frames) == 3 and not frames[1] and len(frames[2]) == 8:
                head, start = frames[:2], int.from_bytes(frames[2], "big")
            elif len(frames) == 2 and len(frames[1]) == 8:
                head, start = frames[:1], int.from_bytes(frames[1], "big")
            else:
                logger.warning("ignoring a replay request of %d frame(s): expected an 8-byte start", len(frames))
                continue
            try:
                for seq, payload in self._replay_from(start):
                    self._replay.send_multipart([*head, self.topic, sequence_bytes(seq), payload])
            except Exception:
                logger.exception("could not answer a KV event replay from %d", start)
            self._replay.send_multipart([*head, b"", END_OF_REPLAY, b""])

    def _replay_from(self, start: int) -> list[tuple[int, bytes]]:
        """The batches a subscriber starting at `start` needs: the buffered ones from there, or
        the whole tree as of the last batch when the buffer no longer reaches back so far."""
        oldest = self._buffer[0][0] if self._buffer else self._next_seq
        if start >= oldest:
            return [(seq, payload) for seq, payload in self._buffer if seq >= start]
        tree = encode_batch(self._ledger.events(), time.time(), self.page_size, self.config.encoding)
        return [(self._next_seq - 1, tree)]
