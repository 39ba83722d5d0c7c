"""TokenizerManager: the HTTP process's side of the runtime.

It tokenizes prompts and renders chat templates, validates each request against the limits the
scheduler announced (so a bad request gets HTTP 400 before it crosses a socket), keeps one
queue per request in flight, and routes the detokenizer's text to it. All of it runs on the
HTTP server's event loop; sockets:

    PUSH -> scheduler:  GenerateRequest, AbortMsg, ControlRequest
    PULL <- detokenizer (TextBatch) and scheduler (SchedulerReady/Failed, ControlReply)
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import astuple, dataclass
from typing import Any

import zmq
import zmq.asyncio

from radixkv.errors import EngineError, InvalidRequestError, RadixKVError
from radixkv.ipc import (
    AbortMsg,
    ControlReply,
    ControlRequest,
    GenerateRequest,
    ProtocolError,
    SchedulerFailed,
    SchedulerReady,
    TextBatch,
    decode,
    encode,
)
from radixkv.results import Collected
from radixkv.sampling_params import LogprobParams, SamplingParams
from radixkv.server.sockets import Endpoints
from radixkv.validation import RequestLimits, check_request

logger = logging.getLogger(__name__)
NO_LOGPROBS = LogprobParams()


class ServiceUnavailable(RadixKVError):
    """The runtime cannot serve (a process died, or it is shutting down): HTTP 503."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """What one request produced since its previous chunk."""

    rid: str
    text: str
    new_ids: list[int]
    finished: bool
    finish_reason: dict[str, Any] | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft: float | None
    latency: float | None
    error: str | None
    error_code: int
    output_logprobs: list[float] | None = None
    output_top_logprobs: list | None = None
    input_logprobs: list | None = None
    input_top_logprobs: list | None = None

    def meta_info(self) -> dict[str, Any]:
        return {"id": self.rid, "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "completion_tokens": self.completion_tokens, "finish_reason": self.finish_reason,
                "ttft": self.ttft, "e2e_latency": self.latency}

    def raise_if_error(self) -> None:
        if self.error is None:
            return
        if self.error_code == 400:
            raise InvalidRequestError(self.error)
        if self.error_code == 503:
            raise ServiceUnavailable(self.error)
        raise EngineError(self.error)


def chunks_of(batch: TextBatch) -> list[Chunk]:
    return [Chunk(*row) for row in zip(batch.rids, batch.texts, batch.new_ids, batch.finished,
                                        batch.finish_reasons, batch.prompt_tokens, batch.cached_tokens,
                                        batch.completion_tokens, batch.ttft, batch.latency, batch.errors,
                                        batch.error_codes, batch.output_logprobs, batch.output_top_logprobs,
                                        batch.input_logprobs, batch.input_top_logprobs)]


class TokenizerManager:
    def __init__(self, tokenizer, endpoints: Endpoints, on_finished: Callable[[Chunk], None] | None = None):
        self.tokenizer = tokenizer
        self.ctx = zmq.asyncio.Context(1)
        self.inbox = self.ctx.socket(zmq.PULL)
        self.inbox.bind(endpoints.tokenizer)
        self._sync_ctx = zmq.Context(1)
        self.to_scheduler = self._sync_ctx.socket(zmq.PUSH)  # sends never block; usable in `finally`
        self.to_scheduler.connect(endpoints.scheduler)
        self.on_finished = on_finished
        self.queues: dict[str, asyncio.Queue[Chunk]] = {}
        self._token_texts: dict[int, str] = {}
        self.calls: dict[str, asyncio.Future] = {}
        self.info: dict[str, Any] | None = None
        self.limits: RequestLimits | None = None
        self.dead: str | None = None  # why the runtime cannot serve, once it cannot
        self._ready: asyncio.Future | None = None
        self._task: asyncio.Task | None = None

    # -- start and stop ----------------------------------------------------------------------
    def start(self) -> None:
        self._ready = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._receive_forever(), name="radixkv-tokenizer-manager")

    async def wait_ready(self) -> dict[str, Any]:
        """The scheduler's info once its model is loaded; raises if it failed to start."""
        self.info = await self._ready
        self.limits = RequestLimits(**self.info["limits"])
        return self.info

    def fail_all(self, reason: str) -> None:
        """The runtime cannot serve: every waiting request ends with a 503 error."""
        self.dead = self.dead or reason
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(ServiceUnavailable(reason))
        for rid, queue in list(self.queues.items()):
            queue.put_nowait(Chunk(rid, "", [], True, {"type": "abort", "message": reason},
                                   0, 0, 0, None, None, reason, 503))
        for future in self.calls.values():
            if not future.done():
                future.set_exception(ServiceUnavailable(reason))

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.inbox.close(linger=0)
        self.to_scheduler.close(linger=0)
        self.ctx.term()
        self._sync_ctx.term()

    # -- requests ------------------------------------------------------------------------------
    def encode_text(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        return self.tokenizer.apply_chat_template(messages)

    def token_text(self, token_id: int) -> str:
        """One token as text (special tokens included), for log-prob listings."""
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    def check(self, input_ids: list[int], params: SamplingParams, logprob: LogprobParams = NO_LOGPROBS) -> None:
        """Raise `InvalidRequestError` if the request can never run (before anything is sent)."""
        self._check_alive()
        check_request(input_ids, params, self.limits)
        logprob.check_prompt(len(input_ids))

    async def stream(self, input_ids: list[int], params: SamplingParams, rid: str | None = None,
                     namespace: str | None = None, logprob: LogprobParams = NO_LOGPROBS) -> AsyncIterator[Chunk]:
        """Chunks of one request as they decode. Leaving early (a client that disconnects)
        aborts the request, so its pages come back."""
        self._check_alive()
        rid = rid or uuid.uuid4().hex
        if rid in self.queues:
            raise InvalidRequestError(f"rid {rid!r} is already in use")
        queue: asyncio.Queue[Chunk] = asyncio.Queue()
        self.queues[rid] = queue
        finished = False
        try:
            self._send(GenerateRequest(rid, input_ids, params.to_dict(), namespace, list(astuple(logprob))))
            while not finished:
                chunk = await queue.get()
                finished = chunk.finished
                yield chunk
        finally:
            del self.queues[rid]
            if not finished and self.dead is None:
                self._send(AbortMsg(rid))

    async def generate(self, input_ids: list[int], params: SamplingParams, rid: str | None = None,
                       namespace: str | None = None, logprob: LogprobParams = NO_LOGPROBS
                       ) -> tuple[str, Collected, Chunk]:
        """(text, everything it produced, last chunk) of one request; raises its error, if any."""
        text, collected = [], Collected()
        last = None
        async for chunk in self.stream(input_ids, params, rid, namespace, logprob):
            text.append(chunk.text)
            collected.add(chunk)
            last = chunk
        last.raise_if_error()
        return "".join(text), collected, last

    async def prefill(self, input_ids: list[int]) -> None:
        """Compute and cache a prompt's KV without generating (before n > 1 samples of it)."""
        await self.generate(input_ids, SamplingParams(max_new_tokens=0))

    def abort(self, rid: str) -> bool:
        """Abort `rid` if this server has it in flight; whether it had."""
        if rid not in self.queues:
            return False
        self._send(AbortMsg(rid))
        return True

    async def control(self, kind: str, timeout: float = 60.0) -> dict[str, Any]:
        """Ask the scheduler: "flush_cache" or "stats"."""
        self._check_alive()
        call_id = uuid.uuid4().hex
        future = asyncio.get_running_loop().create_future()
        self.calls[call_id] = future
        try:
            self._send(ControlRequest(call_id, kind))
            reply: ControlReply = await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            raise ServiceUnavailable(f"the scheduler did not answer {kind!r} within {timeout:.0f} s") from None
        finally:
            self.calls.pop(call_id, None)
        if not reply.ok:
            raise EngineError(reply.result.get("error", f"{kind} failed"))
        return reply.result

    def shutdown_scheduler(self) -> None:
        try:
            self._send(ControlRequest(uuid.uuid4().hex, "shutdown"))
        except zmq.ZMQError:
            pass

    # -- internals -----------------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self.dead is not None:
            raise ServiceUnavailable(self.dead)

    def _send(self, msg) -> None:
        self.to_scheduler.send(encode(msg), zmq.NOBLOCK)

    async def _receive_forever(self) -> None:
        while True:
            data = await self.inbox.recv()
            try:
                msg = decode(data)
            except ProtocolError as e:
                logger.error("dropping a message: %s", e)
                continue
            if isinstance(msg, TextBatch):
                for chunk in chunks_of(msg):
                    queue = self.queues.get(chunk.rid)
                    if queue is not None:
                        queue.put_nowait(chunk)
                    if chunk.finished and self.on_finished is not None:
                        self.on_finished(chunk)
            elif isinstance(msg, ControlReply):
                future = self.calls.get(msg.call_id)
                if future is not None and not future.done():
                    future.set_result(msg)
            elif isinstance(msg, SchedulerReady):
                if not self._ready.done():
                    self._ready.set_result(msg.info)
            elif isinstance(msg, SchedulerFailed):
                self.fail_all(msg.message)
            else:
                logger.error("unexpected %s on the tokenizer manager's socket", type(msg).__name__)
