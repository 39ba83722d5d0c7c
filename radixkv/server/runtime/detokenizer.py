"""The detokenizer process: token ids -> text, incrementally, for every request in flight.

    PULL <- scheduler:         DetokenizeParams (once per request), TokenBatch
    PUSH -> tokenizer manager: TextBatch

One `TextStream` per request (the same class the Engine's streams use): text is released only
once it cannot end in a partial UTF-8 character or in the start of a stop string, and the
final piece is cut before the stop string that ended generation.
"""

from __future__ import annotations

from radixkv.ipc import DetokenizeParams, TextBatch, TokenBatch
from radixkv.outputs import TextOutput
from radixkv.procs import PARENT_POLL_MS, become_child, parent_alive, quiet_compute_threads
from radixkv.server.runtime.sockets import Endpoints
from radixkv.tokenizer import TextStream


class Detokenizer:
    """Turns TokenBatches into TextBatches; holds one TextStream per unfinished request."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.streams: dict[str, TextStream] = {}
        self.params: dict[str, DetokenizeParams] = {}  # of requests whose first output is still to come

    def expect(self, params: DetokenizeParams) -> None:
        """How request `params.rid` detokenizes (sent before its first output)."""
        self.params[params.rid] = params

    def convert(self, batch: TokenBatch) -> TextBatch:
        texts = []
        for out in batch.outputs:
            stream = self.streams.get(out.rid)
            if stream is None:
                p = self.params.pop(out.rid, None)  # None: a request refused before it ran
                stream = self.streams[out.rid] = (
                    TextStream(self.tokenizer, p.skip_special_tokens, tuple(p.stops), p.trim_stop,
                               p.spaces_between_special_tokens) if p else TextStream(self.tokenizer))
            if out.finished:
                texts.append(stream.finish(out.new_ids, out.finish_reason))
                del self.streams[out.rid]
                self.params.pop(out.rid, None)
            else:
                texts.append(stream.push(out.new_ids))
        return TextBatch([TextOutput(*out.to_row(), text=text) for out, text in zip(batch.outputs, texts)])


def run_detokenizer_process(model_dir: str, endpoints: Endpoints, parent_pid: int, log_level: str) -> None:
    """Entry point of the detokenizer process (started by `radixkv.server.launch`)."""
    quiet_compute_threads()
    logger = become_child(parent_pid, log_level, "detokenizer")
    import zmq

    from radixkv.ipc import ProtocolError, decode, encode
    from radixkv.tokenizer import Tokenizer

    detokenizer = Detokenizer(Tokenizer(model_dir))
    ctx = zmq.Context(1)
    inbox = ctx.socket(zmq.PULL)
    inbox.bind(endpoints.detokenizer)
    outbox = ctx.socket(zmq.PUSH)
    outbox.connect(endpoints.tokenizer)
    try:
        while parent_alive(parent_pid):
            if not inbox.poll(PARENT_POLL_MS):
                continue
            try:
                msg = decode(inbox.recv())
            except ProtocolError as e:
                logger.error("dropping a message: %s", e)
                continue
            if isinstance(msg, DetokenizeParams):
                detokenizer.expect(msg)
            elif isinstance(msg, TokenBatch):
                outbox.send(encode(detokenizer.convert(msg)))
            else:
                logger.error("unexpected %s on the detokenizer's socket", type(msg).__name__)
    finally:
        inbox.close(linger=0)
        outbox.close(linger=500)
        ctx.term()
