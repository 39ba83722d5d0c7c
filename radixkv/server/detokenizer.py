"""The detokenizer process: token ids -> text, incrementally, for every request in flight.

    PULL <- scheduler:         TokenBatch
    PUSH -> tokenizer manager: TextBatch

One `TextStream` per request (the same class the Engine's streams use): text is released only
once it cannot end in a partial UTF-8 character or in the start of a stop string, and the
final piece is cut before the stop string that ended generation.
"""

from __future__ import annotations

from radixkv.procs import PARENT_POLL_MS, become_child, parent_alive, quiet_compute_threads
from radixkv.server.sockets import Endpoints


class Detokenizer:
    """Turns TokenBatches into TextBatches; holds one TextStream per unfinished request."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.streams: dict = {}

    def convert(self, batch):
        from radixkv.ipc import TextBatch
        from radixkv.tokenizer import TextStream

        texts = []
        for i, rid in enumerate(batch.rids):
            stream = self.streams.get(rid)
            if stream is None:
                stream = self.streams[rid] = TextStream(self.tokenizer, batch.skip_special_tokens[i],
                                                        tuple(batch.stops[i]))
            if batch.finished[i]:
                text = stream.finish(batch.new_ids[i], batch.finish_reasons[i])
                del self.streams[rid]
            else:
                text = stream.push(batch.new_ids[i])
            texts.append(text)
        return TextBatch(batch.rids, texts, batch.new_ids, batch.finished, batch.finish_reasons,
                         batch.prompt_tokens, batch.cached_tokens, batch.completion_tokens, batch.ttft,
                         batch.latency, batch.errors, batch.error_codes, batch.output_logprobs,
                         batch.output_top_logprobs, batch.input_logprobs, batch.input_top_logprobs)


def run_detokenizer_process(model_dir: str, endpoints: Endpoints, parent_pid: int, log_level: str) -> None:
    """Entry point of the detokenizer process (started by `radixkv.server.launch`)."""
    quiet_compute_threads()
    logger = become_child(parent_pid, log_level, "detokenizer")
    import zmq

    from radixkv.ipc import ProtocolError, TokenBatch, decode, encode
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
                batch = decode(inbox.recv())
            except ProtocolError as e:
                logger.error("dropping a message: %s", e)
                continue
            if not isinstance(batch, TokenBatch):
                logger.error("unexpected %s on the detokenizer's socket", type(batch).__name__)
                continue
            outbox.send(encode(detokenizer.convert(batch)))
    finally:
        inbox.close(linger=0)
        outbox.close(linger=500)
        ctx.term()
