"""Decode side: asks prefill servers for prompts' pages and hears when they arrived.

The scheduler `pull`s a room (where its prefill server's bootstrap port is, and a `PullPages`
naming the pages of our pool to write); one thread owns a DEALER socket per prefill server and
sends it. Each room ends once, in `take_outcomes`:

    Pushed      the pages are in our pool
    PullFailed  the prefill server refused or failed (nothing was or will be written)
    timed out   no answer within `timeout`: a `CancelPull` goes to the prefill server

and, separately, becomes `settled` when its pages may be reused: at once after an answer, and
after a time-out only once the prefill server answers the cancel or `grace` seconds (default:
the timeout again) more pass (it begins no write later than our wait after our ask arrived, nor
after our cancel, so late bytes cannot land on pages we gave to another request).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass

import zmq

from radixkv.disagg.transfer import PoolTransfer
from radixkv.disagg.wire import CODEC, CancelPull, ProtocolError, PullFailed, PullPages, Pushed

logger = logging.getLogger(__name__)
POLL_MS = 5
MAX_PEERS = 256  # prefill servers with an open socket; the least recently used is closed beyond it


@dataclass(frozen=True, slots=True)
class Outcome:
    """How `room` ended: `pushed` (with the transfer's tokens, bytes, seconds) or not (`message`)."""

    room: int
    pushed: bool
    message: str = ""
    tokens: int = 0
    nbytes: int = 0
    seconds: float = 0.0


@dataclass(slots=True)
class Waiting:
    address: str
    deadline: float
    timed_out: bool = False


class KVReceiver:
    """The decode server's side of transfers (see the module docstring)."""

    def __init__(self, transfer: PoolTransfer, identity: bytes, timeout: float, grace: float | None = None):
        """`identity`: our storage identity (a prefill server refuses another); `grace`: seconds a
        timed-out room's pages stay unsettled when its prefill server does not answer the cancel."""
        self.transfer, self.identity, self.timeout = transfer, identity, timeout
        self.grace = timeout if grace is None else grace
        self._ctx = zmq.Context()
        self._sockets: dict[str, zmq.Socket] = {}
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._outcomes: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._settled: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._rooms: dict[int, Waiting] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="radixkv-kv-receiver", daemon=True)
        self._thread.start()

    @property
    def session(self) -> str:
        return self.transfer.session

    @property
    def buffers(self) -> list[int]:
        return self.transfer.buffers

    # -- the scheduler's side --------------------------------------------------------------------
    def pull(self, address: str, msg: PullPages) -> None:
        """Ask the prefill server at `address` (tcp://host:port) for `msg.room`'s pages."""
        self._inbox.put(("pull", address, msg))

    def cancel(self, room: int) -> None:
        """Give up on `room` now (its client left): it ends as failed, settled later."""
        self._inbox.put(("cancel", room))

    def take_outcomes(self) -> list[Outcome]:
        return _drain(self._outcomes)

    def take_settled(self) -> list[int]:
        return _drain(self._settled)

    # -- the thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        while not self._stop.is_set():
            try:
                self._take_inbox(poller)
                if self._sockets and poller.poll(POLL_MS):
                    for sock in list(self._sockets.values()):
                        self._receive(sock)
                elif not self._sockets:
                    time.sleep(POLL_MS / 1000)
                self._expire(time.monotonic())
            except Exception:
                logger.exception("the KV receiver hit an error; it goes on")

    def _socket(self, address: str, poller: zmq.Poller) -> zmq.Socket:
        sock = self._sockets.pop(address, None)
        if sock is None:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(address)
            poller.register(sock, zmq.POLLIN)
            while len(self._sockets) >= MAX_PEERS:
                old_address = next(iter(self._sockets))
                if any(w.address == old_address for w in self._rooms.values()):
                    break
                old = self._sockets.pop(old_address)
                poller.unregister(old)
                old.close()
        self._sockets[address] = sock  # most recently used last
        return sock

    def _take_inbox(self, poller: zmq.Poller) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if item[0] == "pull":
                _, address, msg = item
                try:  # never block this thread: a dead peer's queue may be full
                    self._socket(address, poller).send(CODEC.encode(msg), zmq.NOBLOCK)
                except zmq.ZMQError as e:  # nothing went out, so nothing can be written: settled at once
                    self._outcomes.put(Outcome(msg.room, False, f"the prefill server at {address} cannot be "
                                                                f"reached: {e}"))
                    self._settled.put(msg.room)
                    continue
                self._rooms[msg.room] = Waiting(address, time.monotonic() + self.timeout)
            else:
                self._give_up(item[1], "cancelled")

    def _give_up(self, room: int, message: str) -> None:
        waiting = self._rooms.get(room)
        if waiting is None or waiting.timed_out:
            return
        waiting.timed_out = True
        waiting.deadline = time.monotonic() + self.grace
        sock = self._sockets.get(waiting.address)
        if sock is not None:
            try:
                sock.send(CODEC.encode(CancelPull(room)), zmq.NOBLOCK)
            except zmq.ZMQError:  # the grace still bounds how long its pages wait
                pass
        self._outcomes.put(Outcome(room, False, message))

    def _receive(self, sock: zmq.Socket) -> None:
        while True:
            try:
                data = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                msg = CODEC.decode(data)
            except ProtocolError as e:
                logger.warning("a message from a prefill server that is not ours: %s", e)
                continue
            if not isinstance(msg, (Pushed, PullFailed)):
                continue
            waiting = self._rooms.pop(msg.room, None)
            if waiting is None:
                continue
            if not waiting.timed_out:
                self._outcomes.put(Outcome(msg.room, True, "", msg.tokens, msg.nbytes, msg.seconds)
                                   if isinstance(msg, Pushed) else Outcome(msg.room, False, msg.message))
            self._settled.put(msg.room)

    def _expire(self, now: float) -> None:
        for room, waiting in list(self._rooms.items()):
            if waiting.deadline >= now:
                continue
            if waiting.timed_out:  # the grace after a cancel is over: nothing more can land
                del self._rooms[room]
                self._settled.put(room)
            else:
                self._give_up(room, f"no KV from the prefill server at {waiting.address} within "
                                    f"{self.timeout:g} s (--disaggregation-transfer-timeout)")

    def pending(self) -> int:
        return len(self._rooms)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for sock in self._sockets.values():
            sock.close()
        self._ctx.term()
        self.transfer.close()


def _drain(q: queue.SimpleQueue) -> list:
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out
