"""A KV event subscriber as a KV-aware router writes one (the references' protocol): SUB to the
live stream, a DEALER to the replay socket for what it missed, a `PageLedger` of the pages."""

import socket
import time

import msgpack
import zmq

from radixkv.mem.cache_events import PageLedger
from radixkv.sched.kv_event_wire import END_OF_REPLAY, decode_batch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local(endpoint: str) -> str:
    """A bound endpoint as a local client connects to it."""
    return endpoint.replace("://*:", "://127.0.0.1:").replace("://0.0.0.0:", "://127.0.0.1:")


class Subscriber:
    """Follows one publisher: applies batches in sequence order, asks for replays on gaps."""

    def __init__(self, endpoint: str, replay_endpoint: str | None, topic: str, page_size: int):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.connect(local(endpoint))
        self.sub.setsockopt_string(zmq.SUBSCRIBE, topic)
        self.dealer = None
        if replay_endpoint is not None:
            self.dealer = self.ctx.socket(zmq.DEALER)
            self.dealer.connect(local(replay_endpoint))
        self.topic = topic.encode()
        self.ledger = PageLedger(page_size)
        self.last_seq = -1
        self.live = {}  # seq -> payload, as received live
        self.replays = []  # (seq, payload) of every replay answer

    def receive(self, timeout_ms: int = 100) -> int:
        """Apply every live message that comes within `timeout_ms` of the last; how many."""
        n = 0
        while self.sub.poll(timeout_ms):
            topic, seq_bytes, payload = self.sub.recv_multipart()
            assert topic == self.topic and len(seq_bytes) == 8
            seq = int.from_bytes(seq_bytes, "big")
            self.live[seq] = payload
            if seq > self.last_seq + 1 and self.dealer is not None:
                self.replay(self.last_seq + 1)
            if seq > self.last_seq:
                self.apply(seq, payload)
            n += 1
            timeout_ms = 20
        return n

    def replay(self, start: int) -> list[tuple[int, bytes]]:
        """Ask for every batch from `start` on; apply the ones not seen yet; the answer."""
        self.dealer.send_multipart([b"", start.to_bytes(8, "big")])
        answer = []
        while True:
            assert self.dealer.poll(10_000), "no answer from the replay socket"
            frames = self.dealer.recv_multipart()
            assert len(frames) == 4 and frames[0] == b"", frames
            _, topic, seq_bytes, payload = frames
            if seq_bytes == END_OF_REPLAY:
                assert topic == b"" and payload == b""
                break
            assert topic == self.topic
            seq = int.from_bytes(seq_bytes, "big")
            answer.append((seq, payload))
            if seq > self.last_seq:
                self.apply(seq, payload)
        self.replays.append(answer)
        return answer

    def apply(self, seq: int, payload: bytes) -> None:
        ts, events, dp_rank = decode_batch(payload)
        assert isinstance(msgpack.unpackb(payload)[0], float) and dp_rank == 0 and ts > 0
        self.ledger.apply_all(events)
        self.last_seq = seq

    def catch_up(self, published_batches: int, timeout: float = 20) -> None:
        """Until every published batch is applied (asking for a replay when the stream is quiet:
        a subscriber that joined late never sees the batches before it joined)."""
        deadline = time.monotonic() + timeout
        while self.last_seq < published_batches - 1:
            if not self.receive() and self.dealer is not None:
                self.replay(self.last_seq + 1)
            assert time.monotonic() < deadline, f"at seq {self.last_seq} of {published_batches} batches"

    def close(self) -> None:
        self.ctx.destroy(linger=0)
