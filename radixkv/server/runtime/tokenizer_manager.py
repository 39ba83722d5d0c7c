"""TokenizerManager: the HTTP process's side of the runtime.

It tokenizes prompts and renders chat templates, validates each request against the limits the
scheduler announced (so a bad request gets HTTP 400 before it crosses a socket), keeps one
queue per request in flight, and routes the detokenizer's text to it. All of it runs on the
HTTP server's event loop; sockets:

    PUSH -> scheduler:  GenerateRequest, AbortMsg, ControlRequest
    PULL <- detokenizer (TextBatch) and scheduler (SchedulerReady/Failed, ControlReply)

Admission. The manager holds at most `max_queued` requests at once. A body is admitted whole
(`admit`: room for all of its prompts and samples, or none) before any of them is sent, so a
batch is never half computed; sends to the scheduler never fail (its socket has no high-water
mark: what it queues is bounded by admission), so an abort is never dropped.

Request ids. Every request runs under an id the manager makes (a random uuid). A client may
name its request (`rid`); that name is scoped to the client's principal (its API key), so one
client can neither abort another's request nor learn which names another has in flight.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import zmq
import zmq.asyncio

from radixkv.errors import (
    EngineError,
    ErrorKind,
    InvalidRequestError,
    LoRAInUse,
    Overloaded,
    ServiceUnavailable,
)
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
from radixkv.outputs import TextOutput
from radixkv.results import Collected
from radixkv.bootstrap import Bootstrap
from radixkv.retention import Retention
from radixkv.sampling_params import LogprobParams, SamplingParams
from radixkv.server.runtime.sockets import Endpoints
from radixkv.validation import RequestLimits, check_request

logger = logging.getLogger(__name__)
NO_LOGPROBS = LogprobParams()

Chunk = TextOutput
"""What one request produced since its previous chunk (its new tokens and their text)."""

__all__ = ["Chunk", "ServiceUnavailable", "Ticket", "TokenizerManager"]
DEFAULT_MAX_QUEUED = 4096


class Ticket:
    """Room held for the `left` requests of one admitted body (`TokenizerManager.admit`): each
    request takes its place as it starts; `release` gives back what was not taken."""

    def __init__(self, manager: TokenizerManager, count: int):
        self.manager, self.left = manager, count

    def take(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        self.manager.reserved -= 1
        return True

    def release(self) -> None:
        self.manager.reserved -= self.left
        self.left = 0

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class TokenizerManager:
    def __init__(self, tokenizer, endpoints: Endpoints, on_finished: Callable[[Chunk], None] | None = None,
                 max_queued: int = DEFAULT_MAX_QUEUED):
        self.tokenizer = tokenizer
        self.ctx = zmq.asyncio.Context(1)
        self.inbox = self.ctx.socket(zmq.PULL)
        self.inbox.bind(endpoints.tokenizer)
        self._sync_ctx = zmq.Context(1)
        self.to_scheduler = self._sync_ctx.socket(zmq.PUSH)  # sends never block; usable in `finally`
        self.to_scheduler.setsockopt(zmq.SNDHWM, 0)  # never full: admission bounds what waits in it
        self.to_scheduler.connect(endpoints.scheduler)
        self.max_queued = max_queued
        self.reserved = 0  # room admitted bodies hold for requests not yet started (`Ticket`)
        self.on_finished = on_finished
        self.queues: dict[str, asyncio.Queue[Chunk]] = {}  # request id -> its chunks
        self.client_rids: dict[tuple[str, str], str] = {}  # (principal, the client's rid) -> request id
        self._token_texts: dict[int, str] = {}
        self.calls: dict[str, asyncio.Future] = {}
        self.info: dict[str, Any] | None = None
        self.lora_adapters: dict[str, str] = {}  # name -> id of each LoRA adapter loaded (kept by `control`)
        self.limits: RequestLimits | None = None
        self.dead: str | None = None  # why the runtime cannot serve, once it cannot
        self.draining: str | None = None  # why new requests are refused while in-flight ones finish
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
        self.lora_adapters = dict(self.info.get("lora_adapters") or {})
        return self.info

    @property
    def in_flight(self) -> int:
        """Requests this server is waiting on."""
        return len(self.queues)

    def start_draining(self, reason: str) -> None:
        """Refuse new requests (503 with `reason`); those in flight go on."""
        self.draining = self.draining or reason

    def fail_all(self, reason: str) -> None:
        """The runtime cannot serve: every waiting request ends with an `unavailable` error."""
        self.dead = self.dead or reason
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(ServiceUnavailable(reason))
        for rid, queue in list(self.queues.items()):
            queue.put_nowait(Chunk.failed(rid, reason, ErrorKind.UNAVAILABLE))
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

    def token_text(self, token_id: int) -> str:
        """One token as text (special tokens included), for log-prob listings."""
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    def admit(self, count: int, what: str = "this request") -> Ticket:
        """Room for `count` requests, all or none: `InvalidRequestError` when `count` alone is
        more than the server holds, `Overloaded` (HTTP 429) when it does not fit beside the
        requests in flight now."""
        self._check_accepting()
        return self._reserve(count, what)

    def _reserve(self, count: int, what: str = "this request") -> Ticket:
        if count > self.max_queued:
            raise InvalidRequestError(f"{what} needs {count} generations (prompts x samples), more than this "
                                      f"server holds at once (--max-queued-requests {self.max_queued}); split it")
        held = len(self.queues) + self.reserved
        if held + count > self.max_queued:
            raise Overloaded(f"the server holds {held} of its {self.max_queued} requests (--max-queued-requests) "
                             f"and {what} needs {count}; retry later")
        self.reserved += count
        return Ticket(self, count)

    def check(self, input_ids: list[int], params: SamplingParams, logprob: LogprobParams = NO_LOGPROBS) -> None:
        """Raise `InvalidRequestError` if the request can never run (before anything is sent),
        `ServiceUnavailable` if the server takes no new requests."""
        self._check_accepting()
        check_request(input_ids, params, self.limits)
        logprob.check_prompt(len(input_ids))

    async def stream(self, input_ids: list[int], params: SamplingParams, rid: str | None = None,
                     namespace: str | None = None, logprob: LogprobParams = NO_LOGPROBS,
                     principal: str = "", retention: Retention | None = None,
                     ticket: Ticket | None = None, bootstrap: Bootstrap | None = None,
                     lora: str | None = None) -> AsyncIterator[Chunk]:
        """Chunks of one request as they decode (named `rid` if the client named it). Leaving
        early (a client that disconnects) aborts the request, so its pages come back.
        `retention`: how long the client asks its prefixes to stay cached (the scheduler caps
        it at --max-cache-retention). `bootstrap`: its prefill/decode pair's room (`radixkv.disagg`).

        Only a dead runtime refuses here: a request `check` accepted before draining began may
        still start its parts (the samples of n > 1 after their shared prefill)."""
        self._check_alive()
        if ticket is None or not ticket.take():
            self._reserve(1).take()  # a request of its own (a shared prefill): room for one more
        request_id, name = uuid.uuid4().hex, None
        if rid is not None:
            name = (principal, rid)
            if name in self.client_rids:
                raise InvalidRequestError(f"rid {rid!r} is already in use")
            self.client_rids[name] = request_id
        queue: asyncio.Queue[Chunk] = asyncio.Queue()
        self.queues[request_id] = queue
        finished = False
        try:
            self._send(GenerateRequest(request_id, input_ids, params, namespace, logprob, retention, bootstrap, lora))
            while not finished:
                chunk = await queue.get()
                finished = chunk.finished
                yield chunk if rid is None else replace(chunk, rid=rid)
        finally:
            del self.queues[request_id]
            if name is not None:
                del self.client_rids[name]
            if not finished and self.dead is None:
                self._send(AbortMsg(request_id))

    async def generate(self, input_ids: list[int], params: SamplingParams, rid: str | None = None,
                       namespace: str | None = None, logprob: LogprobParams = NO_LOGPROBS,
                       principal: str = "", retention: Retention | None = None,
                       ticket: Ticket | None = None, bootstrap: Bootstrap | None = None,
                       lora: str | None = None) -> tuple[str, Collected, Chunk]:
        """(text, everything it produced, last chunk) of one request; raises its error, if any."""
        text, collected = [], Collected()
        last = None
        async for chunk in self.stream(input_ids, params, rid, namespace, logprob, principal, retention, ticket,
                                       bootstrap, lora):
            text.append(chunk.text)
            collected.add(chunk)
            last = chunk
        last.raise_if_error()
        return "".join(text), collected, last

    def abort(self, rid: str, principal: str = "") -> bool:
        """Abort the request `principal` named `rid`, if it is in flight; whether it was."""
        request_id = self.client_rids.get((principal, rid))
        if request_id is None:
            return False
        self._send(AbortMsg(request_id))
        return True

    async def control(self, kind: str, timeout: float = 60.0, viewer: str | None = None,
                      args: dict[str, Any] | None = None) -> dict[str, Any]:
        """Ask the scheduler: "flush_cache", "stats", "cache_tree" (of what `viewer` may see),
        "load_lora" / "unload_lora" (`args`: lora_name, lora_path) or "lora_adapters"."""
        self._check_alive()
        call_id = uuid.uuid4().hex
        future = asyncio.get_running_loop().create_future()
        self.calls[call_id] = future
        try:
            self._send(ControlRequest(call_id, kind, viewer, args))
            reply: ControlReply = await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            raise ServiceUnavailable(f"the scheduler did not answer {kind!r} within {timeout:.0f} s") from None
        finally:
            self.calls.pop(call_id, None)
        if not reply.ok:
            message = reply.result.get("error", f"{kind} failed")
            raise {"conflict": LoRAInUse, "invalid": InvalidRequestError}.get(reply.result.get("kind"), EngineError)(message)
        if "adapters" in reply.result:  # what LoRA adapters are loaded, as of this answer
            self.lora_adapters = dict(reply.result["adapters"])
        return reply.result

    def adapter_id(self, name: str | None, field: str = "lora_path") -> str | None:
        """The id of the LoRA adapter `name` (None: the base model); 400 naming `field` if unknown."""
        if name is None:
            return None
        adapter = self.lora_adapters.get(name)
        if adapter is None:
            known = sorted(self.lora_adapters) or "none (start the server with --enable-lora)"
            raise InvalidRequestError(f"{field}={name!r}: no LoRA adapter of that name is loaded; loaded: {known}")
        return adapter

    def shutdown_scheduler(self) -> None:
        try:
            self._send(ControlRequest(uuid.uuid4().hex, "shutdown"))
        except zmq.ZMQError:
            pass

    # -- internals -----------------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self.dead is not None:
            raise ServiceUnavailable(self.dead)

    def _check_accepting(self) -> None:
        self._check_alive()
        if self.draining is not None:
            raise ServiceUnavailable(self.draining)

    def _send(self, msg) -> None:
        try:
            self.to_scheduler.send(encode(msg), zmq.NOBLOCK)
        except zmq.Again:
            raise ServiceUnavailable("the scheduler is not taking messages (its queue is full); retry") from None

    async def _receive_forever(self) -> None:
        while True:
            data = await self.inbox.recv()
            try:
                msg = decode(data)
            except ProtocolError as e:
                logger.error("dropping a message: %s", e)
                continue
            if isinstance(msg, TextBatch):
                for chunk in msg.outputs:
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
