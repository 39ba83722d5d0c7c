"""Prefill side: the bootstrap server, and the writes into decode servers' pools.

The scheduler `offer`s each finished prompt's cached pages under its room (the path stays
locked in the tree until `take_released` gives the room back) or says it `fail`ed. Decode
servers send `PullPages` to the bootstrap port (a ZMQ ROUTER bound at --disaggregation-host :
--disaggregation-bootstrap-port). One thread owns the socket and the transfer engine: when a
room has both an offer and a pull that agree (storage identity, prompt digest, a span inside
the offer), it writes the pages and answers `Pushed`; else `PullFailed` naming why.

Either side waits for the other at most `timeout` seconds (a pull: at most its own `wait`);
then the offer is released (nobody came for it) or the pull refused. No write begins after a
room's `CancelPull` or past its pull's wait, so a decode server that gave up can free its pages.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import zmq

from radixkv.disagg.transfer import PoolTransfer, TransferError
from radixkv.disagg.wire import CODEC, CancelPull, ProtocolError, PullFailed, PullPages, Pushed
from radixkv.errors import ConfigError

logger = logging.getLogger(__name__)
MAX_ROOMS = 4096  # offers / pulls / failures kept at once; the oldest go first
POLL_MS = 5


@dataclass(slots=True)
class Offer:
    pages: list[int]  # our pages of the prompt's first `end` tokens
    end: int  # the tokens a decode server may pull: the prompt but its last token, in whole pages
    digest: bytes  # `prompt_digest` of those tokens and the request's namespace
    deadline: float


@dataclass(slots=True)
class Pull:
    peer: bytes  # the ROUTER identity of the decode server's socket
    msg: PullPages
    deadline: float
    arrived: float = field(default_factory=time.monotonic)


@dataclass
class SenderStats:
    transfers: int = 0
    tokens: int = 0
    nbytes: int = 0
    seconds: float = 0.0
    refused: int = 0
    expired_offers: int = 0


class KVSender:
    """The prefill server's bootstrap server and writer (see the module docstring)."""

    def __init__(self, transfer: PoolTransfer, identity: bytes, page_size: int, host: str, port: int,
                 timeout: float):
        self.transfer, self.identity, self.page_size, self.timeout = transfer, identity, page_size, timeout
        self.stats = SenderStats()
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        try:
            self._sock.bind(f"tcp://{host}:{port}")
        except zmq.ZMQError as e:
            self._sock.close()
            self._ctx.term()
            raise ConfigError(f"disaggregation_bootstrap_port={port}: cannot listen on {host}:{port}: {e}") from None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._released: queue.SimpleQueue[tuple[int, bool]] = queue.SimpleQueue()
        self._offers: OrderedDict[int, Offer] = OrderedDict()
        self._pulls: OrderedDict[int, Pull] = OrderedDict()
        self._failed: OrderedDict[int, tuple[str, float]] = OrderedDict()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="radixkv-kv-sender", daemon=True)
        self._thread.start()

    # -- the scheduler's side --------------------------------------------------------------------
    def offer(self, room: int, pages: list[int], digest: bytes) -> None:
        """`room`'s prompt is computed: its first len(pages) pages are `pages` (locked until
        released); `digest` is `prompt_digest` of those tokens and the request's namespace."""
        self._inbox.put(("offer", room, pages, digest))

    def fail(self, room: int, message: str) -> None:
        """`room`'s prefill ended without pages to offer (`message`: why)."""
        self._inbox.put(("fail", room, message))

    def take_released(self) -> list[tuple[int, bool]]:
        """(room, second) for each offer whose pages are no longer needed (sent, expired, or
        `second`: dropped as a second offer under a room already offered)."""
        rooms = []
        while True:
            try:
                rooms.append(self._released.get_nowait())
            except queue.Empty:
                return rooms

    # -- the thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                if poller.poll(POLL_MS):
                    self._receive()
                self._take_inbox()
                self._match()
                self._expire(time.monotonic())
            except Exception:  # one bad room must not stop the server's transfers
                logger.exception("the KV sender hit an error; it goes on")

    def _receive(self) -> None:
        while True:
            try:
                peer, data = self._sock.recv_multipart(zmq.NOBLOCK)[:2]
            except zmq.Again:
                return
            except ValueError:
                continue
            try:
                msg = CODEC.decode(data)
            except ProtocolError as e:
                logger.warning("a bootstrap message that is not ours: %s", e)
                continue
            if isinstance(msg, PullPages):
                self._pull(peer, msg)
            elif isinstance(msg, CancelPull):
                pull = self._pulls.get(msg.room)
                if pull is not None and pull.peer == peer:
                    del self._pulls[msg.room]
                    self._answer(pull, PullFailed(msg.room, "cancelled"))

    def _pull(self, peer: bytes, msg: PullPages) -> None:
        if not isinstance(msg.room, int) or msg.room in self._pulls:
            self._send(peer, PullFailed(msg.room if isinstance(msg.room, int) else -1, "this room is already being pulled"))
            return
        failed = self._failed.get(msg.room)
        if failed is not None:
            self._send(peer, PullFailed(msg.room, failed[0]))
            return
        wait = min(float(msg.wait), self.timeout) if isinstance(msg.wait, (int, float)) else self.timeout
        self._pulls[msg.room] = Pull(peer, msg, time.monotonic() + max(0.0, wait))
        _bound(self._pulls, lambda room, pull: self._answer(pull, PullFailed(room, "too many rooms waiting")))

    def _take_inbox(self) -> None:
        now = time.monotonic()
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if item[0] == "offer":
                _, room, pages, digest = item
                if room in self._offers:  # a second request with the same room: keep the first
                    logger.warning("room %d offered twice; the second offer is dropped", room)
                    self._release(room, second=True)
                    continue
                self._offers[room] = Offer(pages, len(pages) * self.page_size, digest, now + self.timeout)
                _bound(self._offers, lambda room, offer: self._release(room))
            else:
                _, room, message = item
                self._failed[room] = (message, now + self.timeout)
                _bound(self._failed, lambda room, failed: None)
                pull = self._pulls.pop(room, None)
                if pull is not None:
                    self._answer(pull, PullFailed(room, message))

    def _match(self) -> None:
        for room in [r for r in self._pulls if r in self._offers]:
            pull, offer = self._pulls.pop(room), self._offers[room]
            why = self._refusal(pull, offer)
            if why is not None:  # the offer stays for the pull it was made for
                self.stats.refused += 1
                self._answer(pull, PullFailed(room, why))
                continue
            del self._offers[room]
            msg, ps = pull.msg, self.page_size
            start = time.perf_counter()
            try:
                nbytes = self.transfer.write(msg.session, msg.buffers, offer.pages[msg.start // ps: msg.end // ps],
                                             msg.pages)
            except (TransferError, TypeError, ValueError, OverflowError) as e:
                self._release(room)
                self._answer(pull, PullFailed(room, f"the prefill server could not write the pages: {e}"))
                continue
            seconds = time.perf_counter() - start
            self._release(room)
            s = self.stats
            s.transfers, s.tokens, s.nbytes, s.seconds = (s.transfers + 1, s.tokens + msg.end - msg.start,
                                                          s.nbytes + nbytes, s.seconds + seconds)
            self._answer(pull, Pushed(room, msg.end - msg.start, nbytes, seconds))

    def _refusal(self, pull: Pull, offer: Offer) -> str | None:
        msg, ps = pull.msg, self.page_size
        if msg.identity != self.identity:
            return ("the decode server runs another model, KV format, page size or pool layout than this "
                    "prefill server")
        if not (isinstance(msg.start, int) and isinstance(msg.end, int) and 0 <= msg.start < msg.end
                and msg.start % ps == 0 and msg.end == offer.end):
            return f"tokens [{msg.start}, {msg.end}) are not whole pages up to this prompt's {offer.end} cached tokens"
        if offer.digest != msg.digest:
            return "the decode server's prompt or cache namespace differs from this prefill server's"
        if not isinstance(msg.pages, list) or len(msg.pages) != (msg.end - msg.start) // ps:
            return "the decode server named a page count that does not match its span"
        if time.monotonic() > pull.deadline:
            return "the decode server stopped waiting"
        return None

    def _expire(self, now: float) -> None:
        for room in [r for r, o in self._offers.items() if o.deadline < now]:
            del self._offers[room]
            self.stats.expired_offers += 1
            self._release(room)
        for room in [r for r, p in self._pulls.items() if p.deadline < now]:
            pull = self._pulls.pop(room)
            self._answer(pull, PullFailed(room, f"this prefill server has no computed prompt for room {room} "
                                                f"after {now - pull.arrived:.1f} s"))
        for room in [r for r, (_, until) in self._failed.items() if until < now]:
            del self._failed[room]

    def _release(self, room: int, second: bool = False) -> None:
        self._released.put((room, second))

    def _answer(self, pull: Pull, msg: Pushed | PullFailed) -> None:
        self._send(pull.peer, msg)

    def _send(self, peer: bytes, msg: Pushed | PullFailed) -> None:
        try:
            self._sock.send_multipart([peer, CODEC.encode(msg)], zmq.NOBLOCK)
        except (zmq.ZMQError, ProtocolError) as e:
            logger.warning("could not answer room %s: %s", msg.room, e)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()
        self._ctx.term()
        self.transfer.close()

    def pending(self) -> int:
        return len(self._offers) + len(self._pulls)


def _bound(rooms: OrderedDict, drop) -> None:
    while len(rooms) > MAX_ROOMS:
        room, item = rooms.popitem(last=False)
        drop(room, item)
