"""OpenAI-compatible endpoints: GET /v1/models, POST /v1/chat/completions and /v1/completions.

Streaming is server-sent events in OpenAI's chunk format, ending with `data: [DONE]`;
`stream_options.include_usage` adds a last chunk with usage. `usage.prompt_tokens_details.
cached_tokens` is how much of the prompt the radix cache served. With `n > 1` the prompt is
computed once (a prefill-only request caches it) and the n samples read it from the cache;
choice j samples with `seed + j` when a seed is given.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from fastapi import APIRouter, Request

from radixkv.errors import EngineError, InvalidRequestError, RadixKVError
from radixkv.results import Collected
from radixkv.sampling_params import LogprobParams, SamplingParams
from radixkv.server.http_common import (
    all_or_none,
    HTTPError,
    first_then_rest,
    json_body,
    request_body,
    streaming_response,
    until_disconnected,
)
from radixkv.server.protocol import (
    UNSUPPORTED_CHAT,
    UNSUPPORTED_COMPLETION,
    ChatCompletionBody,
    CompletionBody,
    check_choices,
    refuse_unsupported,
    sampling_dict,
)
from radixkv.server.tokenizer_manager import Chunk, TokenizerManager

router = APIRouter()
T = TypeVar("T")


def finish_reason_name(reason: dict[str, Any] | None) -> str | None:
    return None if reason is None else reason.get("type")


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


class Job:
    """One prompt and its n samples, validated; knows how much of the prompt was cached."""

    def __init__(self, ids: list[int], params: list[SamplingParams], logprob: LogprobParams):
        self.ids, self.params, self.logprob = ids, params, logprob
        self.cached_tokens: int | None = None  # of the prompt, before this request (n > 1)

    async def prefill_if_shared(self, manager: TokenizerManager) -> None:
        """n > 1: compute the prompt once, so every sample reads it from the cache."""
        if len(self.params) > 1:
            _, _, last = await manager.generate(self.ids, SamplingParams(max_new_tokens=0))
            self.cached_tokens = last.cached_tokens


def check_model(request: Request, name: str) -> None:
    settings, manager = request.app.state.settings, request.app.state.manager
    if name not in (settings.model_name, manager.info["model_dir"]):
        raise HTTPError(404, f"model {name!r} does not exist; this server serves {settings.model_name!r} "
                             f"(see GET /v1/models)", "not_found")


def jobs_for(manager: TokenizerManager, prompts: list[list[int]], body, max_tokens: int | None) -> list[Job]:
    check_choices(body)
    jobs = []
    logprob = body.logprob_params()
    for ids in prompts:
        max_new = max_tokens if max_tokens is not None else max(0, manager.limits.context_length - len(ids))
        params = [SamplingParams.from_dict(sampling_dict(body, max_new, j)) for j in range(body.n)]
        manager.check(ids, params[0], logprob)
        jobs.append(Job(ids, params, logprob))
    return jobs


@router.get("/v1/models")
async def models(request: Request):
    settings, manager = request.app.state.settings, request.app.state.manager
    return {"object": "list", "data": [{
        "id": settings.model_name, "object": "model", "created": 0, "owned_by": "radixkv",
        "root": manager.info["model_dir"], "max_model_len": manager.limits.context_length}]}


async def openai_body(request: Request, model: type[T], unsupported: tuple[str, ...]) -> T:
    """The body as `model`, with OpenAI fields this server does not implement refused by name
    and the model it names checked."""
    raw = await json_body(request)
    refuse_unsupported(raw, unsupported)
    body = model.model_validate(raw)
    check_model(request, body.model)
    return body


def response_meta(request: Request, prefix: str) -> dict[str, Any]:
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "created": int(time.time()),
            "model": request.app.state.settings.model_name}


@router.post("/v1/chat/completions", openapi_extra=request_body(ChatCompletionBody))
async def chat_completions(request: Request):
    manager: TokenizerManager = request.app.state.manager
    body = await openai_body(request, ChatCompletionBody, UNSUPPORTED_CHAT)
    if not body.messages:
        raise InvalidRequestError("messages must not be empty")
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    (job,) = jobs_for(manager, [manager.encode_chat([m.template_message() for m in body.messages])], body,
                      max_tokens)
    meta = response_meta(request, "chatcmpl")
    await until_disconnected(request, job.prefill_if_shared(manager))
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        streams = [(j, job.ids, p, job.logprob) for j, p in enumerate(job.params)]
        chunks = await started(request, merged(manager, streams))
        return streaming_response(chat_events(manager, job, chunks, meta, include_usage))
    results = await until_disconnected(request, all_or_none(
        *(manager.generate(job.ids, p, logprob=job.logprob) for p in job.params)))
    choices = [{"index": j, "message": {"role": "assistant", "content": text},
                "logprobs": chat_logprobs(manager, job, got), "finish_reason": finish_reason_name(last.finish_reason)}
               for j, (text, got, last) in enumerate(results)]
    return {**meta, "object": "chat.completion", "choices": choices,
            "usage": usage(len(job.ids), sum(r[2].completion_tokens for r in results),
                           job_cached(job, [r[2] for r in results]))}


@router.post("/v1/completions", openapi_extra=request_body(CompletionBody))
async def completions(request: Request):
    manager: TokenizerManager = request.app.state.manager
    body = await openai_body(request, CompletionBody, UNSUPPORTED_COMPLETION)
    jobs = jobs_for(manager, completion_prompts(manager, body.prompt), body, body.max_tokens)
    meta = response_meta(request, "cmpl")
    await until_disconnected(request, all_or_none(*(job.prefill_if_shared(manager) for job in jobs)))
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        streams, owner = [], {}
        for i, job in enumerate(jobs):
            for j, p in enumerate(job.params):
                index = i * len(job.params) + j
                streams.append((index, job.ids, p, job.logprob))
                owner[index] = job
        chunks = await started(request, merged(manager, streams))
        return streaming_response(completion_events(manager, jobs, owner, chunks, meta, include_usage))
    per_job = await until_disconnected(request, all_or_none(
        *(all_or_none(*(manager.generate(job.ids, p, logprob=job.logprob) for p in job.params)) for job in jobs)))
    choices, completion, cached = [], 0, 0
    for i, (job, results) in enumerate(zip(jobs, per_job)):
        for j, (text, got, last) in enumerate(results):
            choices.append({"index": i * len(job.params) + j, "text": text,
                            "logprobs": completion_logprobs(manager, job, got),
                            "finish_reason": finish_reason_name(last.finish_reason)})
            completion += last.completion_tokens
        cached += job_cached(job, [r[2] for r in results])
    return {**meta, "object": "text_completion", "choices": choices,
            "usage": usage(sum(len(j.ids) for j in jobs), completion, cached)}


def job_cached(job: Job, lasts: list[Chunk]) -> int:
    """Prompt tokens the cache served: the first sample's count, or, when the prompt was
    prefilled once for n samples, what that prefill found cached."""
    return job.cached_tokens if job.cached_tokens is not None else lasts[0].cached_tokens


def completion_prompts(manager: TokenizerManager, prompt) -> list[list[int]]:
    if isinstance(prompt, str):
        return [manager.encode_text(prompt)]
    if not prompt:
        raise InvalidRequestError("prompt must not be empty")
    if isinstance(prompt[0], str):
        return [manager.encode_text(p) for p in prompt]
    if isinstance(prompt[0], int):
        return [list(prompt)]
    return [list(p) for p in prompt]


def token_entry(manager: TokenizerManager, token_id: int, logprob: float) -> dict[str, Any]:
    text = manager.token_text(token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(manager: TokenizerManager, job: Job, got: Collected) -> dict[str, Any] | None:
    """OpenAI chat `logprobs`: {"content": [{token, logprob, bytes, top_logprobs}, ...]}."""
    if not job.logprob.return_logprob:
        return None
    tops = got.output_top if job.logprob.top_n else [[] for _ in got.ids]
    return {"content": [token_entry(manager, t, lp) | {"top_logprobs": [token_entry(manager, i, v) for v, i in top]}
                        for t, lp, top in zip(got.ids, got.output_logprobs, tops)]}


def completion_logprobs(manager: TokenizerManager, job: Job, got: Collected, offset: int = 0) -> dict[str, Any] | None:
    """OpenAI completions `logprobs`: tokens, token_logprobs, top_logprobs, text_offset."""
    if not job.logprob.return_logprob:
        return None
    tokens = [manager.token_text(t) for t in got.ids]
    offsets = []
    for tok in tokens:
        offsets.append(offset)
        offset += len(tok)
    top = ([{manager.token_text(i): v for v, i in alts} for alts in got.output_top]
           if job.logprob.top_n else None)
    return {"tokens": tokens, "token_logprobs": got.output_logprobs, "top_logprobs": top, "text_offset": offsets}


async def merged(manager: TokenizerManager, streams: list[tuple[int, list[int], SamplingParams, LogprobParams]]
                 ) -> AsyncIterator[tuple[int, Chunk]]:
    """(choice index, chunk) from several requests as they arrive; a failed chunk raises. Leaving
    early (a client that disconnects) cancels every request still running."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, ids: list[int], params: SamplingParams, logprob: LogprobParams) -> None:
        try:
            async for chunk in manager.stream(ids, params, logprob=logprob):
                await queue.put((index, chunk))
        except RadixKVError as e:
            await queue.put((index, e))
        except Exception as e:  # noqa: BLE001 - never leave the consumer waiting for a dead pump
            await queue.put((index, EngineError(f"choice {index} failed: {type(e).__name__}: {e}")))

    tasks = [asyncio.create_task(pump(*s)) for s in streams]
    try:
        remaining = len(streams)
        while remaining:
            index, item = await queue.get()
            if isinstance(item, Exception):
                raise item
            item.raise_if_error()
            if item.finished:
                remaining -= 1
            yield index, item
    finally:
        for task in tasks:
            task.cancel()


async def started(request: Request, chunks: AsyncIterator[tuple[int, Chunk]]) -> AsyncIterator[tuple[int, Chunk]]:
    """`chunks` once the first has come: a request that fails at once is an HTTP error, not a
    200 stream holding one."""
    try:
        _, rest = await first_then_rest(request, chunks)
    except BaseException:
        await chunks.aclose()
        raise
    return rest


async def chat_events(manager: TokenizerManager, job: Job, chunks: AsyncIterator[tuple[int, Chunk]], meta: dict,
                      include_usage: bool) -> AsyncIterator[dict[str, Any]]:
    base = {**meta, "object": "chat.completion.chunk"}
    for j in range(len(job.params)):
        yield {**base, "choices": [{"index": j, "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None, "finish_reason": None}]}
    lasts: dict[int, Chunk] = {}
    async for j, chunk in chunks:
        if chunk.text or chunk.new_ids:
            piece = Collected()
            piece.add(chunk)
            yield {**base, "choices": [{"index": j, "delta": {"content": chunk.text},
                                        "logprobs": chat_logprobs(manager, job, piece), "finish_reason": None}]}
        if chunk.finished:
            lasts[j] = chunk
            yield {**base, "choices": [{"index": j, "delta": {}, "logprobs": None,
                                        "finish_reason": finish_reason_name(chunk.finish_reason)}]}
    if include_usage:
        finals = [lasts[j] for j in sorted(lasts)]
        yield {**base, "choices": [], "usage": usage(len(job.ids), sum(c.completion_tokens for c in finals),
                                                     job_cached(job, finals))}


async def completion_events(manager: TokenizerManager, jobs: list[Job], owner: dict[int, Job],
                            chunks: AsyncIterator[tuple[int, Chunk]], meta: dict, include_usage: bool
                            ) -> AsyncIterator[dict[str, Any]]:
    base = {**meta, "object": "text_completion"}
    lasts: dict[int, Chunk] = {}
    offsets: dict[int, int] = {}
    async for index, chunk in chunks:
        if chunk.text or chunk.new_ids or chunk.finished:
            piece = Collected()
            piece.add(chunk)
            logprobs = completion_logprobs(manager, owner[index], piece, offsets.get(index, 0))
            offsets[index] = offsets.get(index, 0) + sum(len(manager.token_text(t)) for t in chunk.new_ids)
            yield {**base, "choices": [{"index": index, "text": chunk.text, "logprobs": logprobs,
                                        "finish_reason": finish_reason_name(chunk.finish_reason)
                                        if chunk.finished else None}]}
        if chunk.finished:
            lasts[index] = chunk
    if include_usage:
        cached = sum(job_cached(job, [lasts[k] for k in sorted(lasts) if owner[k] is job]) for job in jobs)
        yield {**base, "choices": [], "usage": usage(sum(len(j.ids) for j in jobs),
                                                     sum(c.completion_tokens for c in lasts.values()), cached)}
