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
from radixkv.mem.miss_causes import CAUSES
from radixkv.results import Collected
from radixkv.retention import Retention
from radixkv.sampling_params import LogprobParams, SamplingParams
from radixkv.server.api.conversation import render_ids
from radixkv.server.api.pipeline import check_model, started, with_call_grammar
from radixkv.server.api.protocol import (
    UNSUPPORTED_CHAT,
    UNSUPPORTED_COMPLETION,
    ChatCompletionBody,
    CompletionBody,
    check_choices,
    openai_retention,
    refuse_unsupported,
    salt_namespace,
    sampling_dict,
)
from radixkv.server.api.tools import CallStream, ToolCall, ToolSet, openai_tool_set
from radixkv.server.http.app import Api
from radixkv.server.http.common import (
    all_or_none,
    json_body,
    request_body,
    streaming_response,
    until_disconnected,
)
from radixkv.server.runtime.tokenizer_manager import Chunk, TokenizerManager

router = APIRouter()
T = TypeVar("T")


def finish_reason_name(reason: dict[str, Any] | None) -> str | None:
    return None if reason is None else reason.get("type")


def chat_finish_reason(reason: dict[str, Any] | None, called: bool) -> str | None:
    """OpenAI's chat finish reason: `tool_calls` when the output ended (not cut) on calls."""
    name = finish_reason_name(reason)
    return "tool_calls" if called and name == "stop" else name


def call_json(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    """A tool call as OpenAI's chat API shows it (with `index` in a stream's delta)."""
    out = {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    return out if index is None else {"index": index, **out}


def usage(prompt_tokens: int, completion_tokens: int, served: list[Chunk]) -> dict[str, Any]:
    """OpenAI's usage for prompts whose cache lookups `served` reports (one chunk per prompt):
    where the cached tokens came from (`{device, host, storage}`) beside their sum, as SGLang
    does (`cached_tokens_details`), and every prompt token by why it hit or missed (`cache`,
    `radixkv.mem.miss_causes`; omitted where a lookup was not explained)."""
    cached = {tier: sum(c.cached_tokens_details()[tier] for c in served) for tier in ("device", "host", "storage")}
    details: dict[str, Any] = {"cached_tokens": sum(cached.values()), "cached_tokens_details": cached}
    if served and all(c.cache_causes is not None for c in served):
        details["cache"] = {cause: sum(c.cache_causes.get(cause, 0) for c in served) for cause in CAUSES}
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": details}


class Job:
    """One prompt and its n samples, validated; knows how much of the prompt was cached.
    `namespace`: the request's `cache_salt` namespace (None: the shared tree); `echo`: the
    prompt's text, to put before each completion (OpenAI's `echo`); `retention`: how long the
    cache is asked to keep its prefixes (`radixkv.retention`)."""

    def __init__(self, ids: list[int], params: list[SamplingParams], logprob: LogprobParams,
                 namespace: str | None = None, echo: str | None = None, retention: Retention | None = None):
        self.ids, self.params, self.logprob, self.namespace, self.echo = ids, params, logprob, namespace, echo
        self.retention = retention
        self.cached: Chunk | None = None  # the prompt's lookup before this request's samples (n > 1)

    async def prefill_if_shared(self, manager: TokenizerManager) -> None:
        """n > 1: compute the prompt once, so every sample reads it from the cache."""
        if len(self.params) > 1:
            _, _, last = await manager.generate(self.ids, SamplingParams(max_new_tokens=0), namespace=self.namespace,
                                                retention=self.retention)
            self.cached = last

    def generate(self, manager: TokenizerManager, params: SamplingParams):
        return manager.generate(self.ids, params, namespace=self.namespace, logprob=self.logprob,
                                retention=self.retention)

    def streams(self, first_index: int = 0) -> list[tuple[int, Job, SamplingParams]]:
        return [(first_index + j, self, p) for j, p in enumerate(self.params)]


def jobs_for(manager: TokenizerManager, prompts: list[list[int]], body, max_tokens: int | None,
             echoes: list[str | None] | None = None, tools: ToolSet | None = None) -> list[Job]:
    """One `Job` per prompt; with `tools` forced (`required` or a named function), every sample
    is generated under the tools' call grammar."""
    check_choices(body)
    jobs = []
    logprob = body.logprob_params()
    namespace = salt_namespace(body.cache_salt)
    retention = openai_retention(body.prompt_cache_retention, body.prompt_cache_key)
    for ids, echo in zip(prompts, echoes or [None] * len(prompts)):
        max_new = max_tokens if max_tokens is not None else max(0, manager.limits.context_length - len(ids))
        dicts = [sampling_dict(body, max_new, j) for j in range(body.n)]
        if tools is not None and tools.forced:
            dicts = [with_call_grammar(d, tools) for d in dicts]
        params = [SamplingParams.from_dict(d) for d in dicts]
        manager.check(ids, params[0], logprob)
        jobs.append(Job(ids, params, logprob, namespace, echo, retention))
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
    body.refuse_features_it_lacks()
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
    tools = openai_tool_set(body.tools, body.tool_choice, body.parallel_tool_calls)
    messages = [m.template_message(f"messages[{i}]") for i, m in enumerate(body.messages)]
    prompt = render_ids(manager.tokenizer, messages, tools, continue_final_message=body.continue_final_message,
                        template_kwargs=body.chat_template_kwargs)
    (job,) = jobs_for(manager, [prompt], body, max_tokens, tools=tools)
    meta = response_meta(request, "chatcmpl")
    await until_disconnected(request, job.prefill_if_shared(manager))
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        chunks = await started(request, merged(manager, job.streams()))
        return streaming_response(chat_events(manager, job, chunks, meta, include_usage, tools))
    results = await until_disconnected(request, all_or_none(*(job.generate(manager, p) for p in job.params)))
    choices = []
    for j, (text, got, last) in enumerate(results):
        content, calls = tools.parse(text) if tools is not None else (text, [])
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [call_json(c) for c in calls]
        choices.append({"index": j, "message": message, "logprobs": chat_logprobs(manager, job, got),
                        "finish_reason": chat_finish_reason(last.finish_reason, bool(calls))})
    return {**meta, "object": "chat.completion", "choices": choices,
            "usage": usage(len(job.ids), sum(r[2].completion_tokens for r in results),
                           [job_cached(job, [r[2] for r in results])])}


@router.post("/v1/completions", openapi_extra=request_body(CompletionBody))
async def completions(request: Request):
    manager: TokenizerManager = request.app.state.manager
    body = await openai_body(request, CompletionBody, UNSUPPORTED_COMPLETION)
    prompts = completion_prompts(manager, body.prompt)
    echoes = echo_texts(manager, body, prompts) if body.echo else None
    jobs = jobs_for(manager, prompts, body, body.max_tokens, echoes)
    meta = response_meta(request, "cmpl")
    await until_disconnected(request, all_or_none(*(job.prefill_if_shared(manager) for job in jobs)))
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        streams = [s for i, job in enumerate(jobs) for s in job.streams(i * body.n)]
        chunks = await started(request, merged(manager, streams))
        owner = {index: job for index, job, _ in streams}
        return streaming_response(completion_events(manager, jobs, owner, chunks, meta, include_usage))
    per_job = await until_disconnected(request, all_or_none(
        *(all_or_none(*(job.generate(manager, p) for p in job.params)) for job in jobs)))
    choices, completion, cached = [], 0, []
    for i, (job, results) in enumerate(zip(jobs, per_job)):
        for j, (text, got, last) in enumerate(results):
            choices.append({"index": i * len(job.params) + j, "text": (job.echo or "") + text,
                            "logprobs": completion_logprobs(manager, job, got),
                            "finish_reason": finish_reason_name(last.finish_reason)})
            completion += last.completion_tokens
        cached.append(job_cached(job, [r[2] for r in results]))
    return {**meta, "object": "text_completion", "choices": choices,
            "usage": usage(sum(len(j.ids) for j in jobs), completion, cached)}


def job_cached(job: Job, lasts: list[Chunk]) -> Chunk:
    """The chunk that says what the cache held of the prompt: the first sample's, or, when the
    prompt was prefilled once for n samples, that prefill's."""
    return job.cached if job.cached is not None else lasts[0]


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


def echo_texts(manager: TokenizerManager, body: CompletionBody, prompts: list[list[int]]) -> list[str]:
    """The text `echo` puts back: each prompt as sent (token-id prompts decoded)."""
    given = body.prompt if isinstance(body.prompt, list) else [body.prompt]
    if given and isinstance(given[0], str):
        return list(given)
    skip = body.skip_special_tokens if body.skip_special_tokens is not None else True
    return [manager.tokenizer.decode(ids, skip) for ids in prompts]


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


def completion_logprobs(manager: TokenizerManager, job: Job, got: Collected, offset: int = 0,
                        with_prompt: bool = True) -> dict[str, Any] | None:
    """OpenAI completions `logprobs`: tokens, token_logprobs, top_logprobs, text_offset. With
    `echo` (and `with_prompt`: the piece that carries the prompt), the prompt's tokens come first,
    the first with no log-prob (null), as OpenAI and vLLM report them."""
    if not job.logprob.return_logprob:
        return None
    ids, lps, tops = list(got.ids), list(got.output_logprobs), list(got.output_top)
    if job.echo is not None and with_prompt:
        prompt = got.input_logprobs or []
        prompt_top = got.input_top or [None] * len(prompt)
        ids, lps, tops = [t for _, t in prompt] + ids, [v for v, _ in prompt] + lps, list(prompt_top) + tops
    tokens = [manager.token_text(t) for t in ids]
    offsets = []
    for tok in tokens:
        offsets.append(offset)
        offset += len(tok)
    top = ([None if alts is None else {manager.token_text(i): v for v, i in alts} for alts in tops]
           if job.logprob.top_n else None)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": top, "text_offset": offsets}


async def merged(manager: TokenizerManager, streams: list[tuple[int, Job, SamplingParams]]
                 ) -> AsyncIterator[tuple[int, Chunk]]:
    """(choice index, chunk) from several requests as they arrive; a failed chunk raises. Leaving
    early (a client that disconnects) cancels every request still running."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, job: Job, params: SamplingParams) -> None:
        try:
            async for chunk in manager.stream(job.ids, params, namespace=job.namespace, logprob=job.logprob,
                                              retention=job.retention):
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


async def chat_events(manager: TokenizerManager, job: Job, chunks: AsyncIterator[tuple[int, Chunk]], meta: dict,
                      include_usage: bool, tools: ToolSet | None = None) -> AsyncIterator[dict[str, Any]]:
    """A choice's first chunk carries its first text (with the role), never an empty delta: clients
    time the first token by the first chunk. A chunk whose tokens' text is still held back (a
    partial character, a possible stop string, a possible tool call) is sent only when it has
    log-probs to carry. With tools, a call is sent as one `tool_calls` delta once its block closes."""
    base = {**meta, "object": "chat.completion.chunk"}
    lasts: dict[int, Chunk] = {}
    opened: set[int] = set()
    readers = {j: CallStream(tools) for j in range(len(job.params))} if tools is not None and tools.parses_calls \
        else {}
    calls_sent: dict[int, int] = {}

    def delta(j: int, text: str | None) -> dict[str, Any]:
        if j in opened:
            return {"content": text}
        opened.add(j)
        return {"role": "assistant", "content": text}

    async for j, chunk in chunks:
        text, calls = chunk.text, []
        if j in readers:
            shown = readers[j].push(chunk.text) + (readers[j].finish() if chunk.finished else [])
            text = "".join(e for e in shown if isinstance(e, str))
            calls = [e for e in shown if isinstance(e, ToolCall)]
        if text or calls or (chunk.new_ids and job.logprob.return_logprob):
            piece = Collected()
            piece.add(chunk)
            d = delta(j, text if text or not calls else None)
            if calls:
                first = calls_sent.get(j, 0)
                d["tool_calls"] = [call_json(c, first + k) for k, c in enumerate(calls)]
                calls_sent[j] = first + len(calls)
            yield {**base, "choices": [{"index": j, "delta": d,
                                        "logprobs": chat_logprobs(manager, job, piece), "finish_reason": None}]}
        if chunk.finished:
            lasts[j] = chunk
            yield {**base, "choices": [{"index": j, "delta": {} if j in opened else delta(j, ""), "logprobs": None,
                                        "finish_reason": chat_finish_reason(chunk.finish_reason,
                                                                            bool(calls_sent.get(j)))}]}
    if include_usage:
        finals = [lasts[j] for j in sorted(lasts)]
        yield {**base, "choices": [], "usage": usage(len(job.ids), sum(c.completion_tokens for c in finals),
                                                     [job_cached(job, finals)])}


async def completion_events(manager: TokenizerManager, jobs: list[Job], owner: dict[int, Job],
                            chunks: AsyncIterator[tuple[int, Chunk]], meta: dict, include_usage: bool
                            ) -> AsyncIterator[dict[str, Any]]:
    """With `echo`, a choice's first chunk starts with the prompt (and its log-probs)."""
    base = {**meta, "object": "text_completion"}
    lasts: dict[int, Chunk] = {}
    offsets: dict[int, int] = {}
    async for index, chunk in chunks:
        job = owner[index]
        first = index not in offsets
        if chunk.text or chunk.new_ids or chunk.finished or (first and job.echo):
            piece = Collected()
            piece.add(chunk)
            logprobs = completion_logprobs(manager, job, piece, offsets.get(index, 0), with_prompt=first)
            if logprobs is not None:
                offsets[index] = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1]) if logprobs["tokens"] \
                    else offsets.get(index, 0)
            else:
                offsets[index] = offsets.get(index, 0)
            text = (job.echo or "") + chunk.text if first else chunk.text
            yield {**base, "choices": [{"index": index, "text": text, "logprobs": logprobs,
                                        "finish_reason": finish_reason_name(chunk.finish_reason)
                                        if chunk.finished else None}]}
        if chunk.finished:
            lasts[index] = chunk
    if include_usage:
        cached = [job_cached(job, [lasts[k] for k in sorted(lasts) if owner[k] is job]) for job in jobs]
        yield {**base, "choices": [], "usage": usage(sum(len(j.ids) for j in jobs),
                                                     sum(c.completion_tokens for c in lasts.values()), cached)}


API = Api(router)
