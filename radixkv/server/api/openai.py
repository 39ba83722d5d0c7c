"""OpenAI-compatible endpoints: GET /v1/models, POST /v1/chat/completions and /v1/completions.

Streaming is server-sent events in OpenAI's chunk format, ending with `data: [DONE]`;
`stream_options.include_usage` adds a last chunk with usage. `usage.prompt_tokens_details.
cached_tokens` is how much of the prompt the radix cache served. With `n > 1` the prompt is
computed once (a prefill-only request caches it) and the n samples read it from the cache;
choice j samples with `seed + j` when a seed is given.

Both endpoints are `OpenAIServing`s (`pipeline.Serving`): a body becomes one `Job` per prompt,
each `n` generations; log-probs in OpenAI's shapes are `openai_logprobs.py`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request

from radixkv.bootstrap import Bootstrap, bootstraps
from radixkv.errors import InvalidRequestError
from radixkv.results import Collected
from radixkv.retention import Retention
from radixkv.sampling_params import LogprobParams, SamplingParams
from radixkv.server.api.conversation import render_ids
from radixkv.server.api.openai_logprobs import chat_logprobs, completion_logprobs
from radixkv.server.api.pipeline import Generation, Result, Serving, Usage, check_model, with_call_grammar
from radixkv.server.api.protocol import (
    UNSUPPORTED_CHAT,
    UNSUPPORTED_COMPLETION,
    ChatCompletionBody,
    CompletionBody,
    check_choices,
    openai_retention,
    refuse_unsupported,
    sampling_dict,
)
from radixkv.server.api.tool_shapes import openai_tool_set
from radixkv.server.api.tools import CallArgs, CallStart, CallStream, ToolCall, ToolSet
from radixkv.server.http.app import Api
from radixkv.server.http.common import all_or_none, json_body, request_body
from radixkv.server.runtime.tokenizer_manager import Chunk, TokenizerManager
from radixkv.tenancy import salt_namespace
from radixkv.validation import check_token_ids

router = APIRouter()


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


def openai_usage(usage: Usage) -> dict[str, Any]:
    """OpenAI's usage: where the cached tokens came from (`{device, host, storage}`) beside
    their sum, as SGLang does (`cached_tokens_details`), and every prompt token by why it hit or
    missed (`cache`, `radixkv.mem.miss_causes`; omitted where a lookup was not explained)."""
    details: dict[str, Any] = {"cached_tokens": usage.cached_tokens, "cached_tokens_details": usage.cached}
    if usage.causes is not None:
        details["cache"] = usage.causes
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens, "prompt_tokens_details": details}


class Job:
    """One prompt and its n samples, validated; knows how much of the prompt was cached.
    `namespace`: the request's `cache_salt` namespace (None: the shared tree); `echo`: the
    prompt's text, to put before each completion (OpenAI's `echo`); `retention`: how long the
    cache is asked to keep its prefixes (`radixkv.retention`)."""

    def __init__(self, ids: list[int], params: list[SamplingParams], logprob: LogprobParams,
                 namespace: str | None = None, echo: str | None = None, retention: Retention | None = None,
                 bootstrap: Bootstrap | None = None, lora: str | None = None):
        self.ids, self.params, self.logprob, self.namespace, self.echo = ids, params, logprob, namespace, echo
        self.retention, self.bootstrap, self.lora = retention, bootstrap, lora
        self.cached: Chunk | None = None  # the prompt's lookup before this request's samples (n > 1)

    def generations(self) -> list[Generation]:
        return [Generation(self.ids, p, self.logprob, self.namespace, self.retention, bootstrap=self.bootstrap,
                           lora=self.lora) for p in self.params]

    async def prefill_if_shared(self, manager: TokenizerManager) -> None:
        """n > 1: compute the prompt once, so every sample reads it from the cache."""
        if len(self.params) > 1:
            _, _, self.cached = await self.generations()[0].prefill().generate(manager)


def jobs_for(manager: TokenizerManager, prompts: list[list[int]], body, max_tokens: int | None,
             echoes: list[str | None] | None = None, tools: ToolSet | None = None, lora: str | None = None) -> list[Job]:
    """One `Job` per prompt; with `tools` forced (`required` or a named function), every sample
    is generated under the tools' call grammar."""
    check_choices(body)
    jobs = []
    logprob = body.logprob_params()
    namespace = salt_namespace(body.cache_salt)
    retention = openai_retention(body.prompt_cache_retention, body.prompt_cache_key)
    rooms = bootstraps(body.bootstrap_host, body.bootstrap_port, body.bootstrap_room, len(prompts))
    if body.n > 1 and any(rooms):
        raise InvalidRequestError("bootstrap_room: a prefill/decode pair runs one sample per prompt (n=1)")
    for ids, echo, room in zip(prompts, echoes or [None] * len(prompts), rooms):
        max_new = max_tokens if max_tokens is not None else max(0, manager.limits.context_length - len(ids))
        dicts = [sampling_dict(body, max_new, j) for j in range(body.n)]
        dicts = [with_call_grammar(d, tools) for d in dicts]
        params = [SamplingParams.from_dict(d) for d in dicts]
        manager.check(ids, params[0], logprob)
        jobs.append(Job(ids, params, logprob, namespace, echo, retention, room, lora))
    return jobs


def job_cached(job: Job, lasts: list[Chunk]) -> Chunk:
    """The chunk that says what the cache held of the prompt: the first sample's, or, when the
    prompt was prefilled once for n samples, that prefill's."""
    return job.cached if job.cached is not None else lasts[0]


class OpenAIServing(Serving):
    """What both endpoints share: the body read with OpenAI fields this server does not
    implement refused by name and the model it names checked; n > 1 prefilled once per prompt;
    the response's id, time and model."""

    body_model: type = ChatCompletionBody
    unsupported: tuple[str, ...] = ()
    prefix = ""
    jobs: list[Job]

    async def parse(self) -> Any:
        raw = await json_body(self.request)
        refuse_unsupported(raw, self.unsupported)
        body = self.body_model.model_validate(raw)
        body.refuse_features_it_lacks()
        self.lora = self.check_model(body.model)  # the model field may name a LoRA adapter
        if body.lora_path is not None:
            named = self.manager.adapter_id(body.lora_path)
            if self.lora is not None and named != self.lora:
                raise InvalidRequestError(f"lora_path={body.lora_path!r} and model={body.model!r} name different adapters")
            self.lora = named
        return body

    def generations(self, jobs: list[Job]) -> list[Generation]:
        self.jobs = jobs
        self.meta = {"id": f"{self.prefix}-{uuid.uuid4().hex}", "created": int(time.time()),
                     "model": self.settings.model_name}
        return [g for job in jobs for g in job.generations()]

    async def prefill(self, generations: list[Generation]) -> None:
        await all_or_none(*(job.prefill_if_shared(self.manager) for job in self.jobs))

    def results_by_job(self, results: list[Result]) -> list[list[Result]]:
        starts = [0]
        for job in self.jobs:
            starts.append(starts[-1] + len(job.params))
        return [results[a:b] for a, b in zip(starts, starts[1:])]


def include_usage(body) -> bool:
    return bool(body.stream_options and body.stream_options.include_usage)


class ChatCompletions(OpenAIServing):
    body_model, unsupported, prefix = ChatCompletionBody, UNSUPPORTED_CHAT, "chatcmpl"
    client_names = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "json_schema": "response_format",
                    "top_logprobs_num": "top_logprobs"}

    def build(self, body: ChatCompletionBody) -> list[Generation]:
        if not body.messages:
            raise InvalidRequestError("messages must not be empty")
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        self.tools = openai_tool_set(body.tools, body.tool_choice, body.parallel_tool_calls)
        messages = [m.template_message(f"messages[{i}]") for i, m in enumerate(body.messages)]
        prompt = render_ids(self.manager.tokenizer, messages, self.tools,
                            continue_final_message=body.continue_final_message,
                            template_kwargs=body.chat_template_kwargs)
        return self.generations(jobs_for(self.manager, [prompt], body, max_tokens, tools=self.tools, lora=self.lora))

    def respond(self, body: ChatCompletionBody, generations: list[Generation], results: list[Result]) -> Any:
        (job,), tools = self.jobs, self.tools
        choices = []
        for j, (text, got, last) in enumerate(results):
            content, calls = tools.parse(text) if tools is not None else (text, [])
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = [call_json(c) for c in calls]
            choices.append({"index": j, "message": message, "logprobs": chat_logprobs(self.manager, job, got),
                            "finish_reason": chat_finish_reason(last.finish_reason, bool(calls))})
        usage = Usage.of(len(job.ids), sum(r[2].completion_tokens for r in results),
                         [job_cached(job, [r[2] for r in results])])
        return {**self.meta, "object": "chat.completion", "choices": choices, "usage": openai_usage(usage)}

    def events(self, body: ChatCompletionBody, generations: list[Generation],
               chunks: AsyncIterator[tuple[int, Chunk]]) -> AsyncIterator[dict[str, Any]]:
        return chat_events(self.manager, self.jobs[0], chunks, self.meta, include_usage(body), self.tools)


class Completions(OpenAIServing):
    body_model, unsupported, prefix = CompletionBody, UNSUPPORTED_COMPLETION, "cmpl"
    client_names = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "json_schema": "response_format",
                    "top_logprobs_num": "logprobs"}

    def build(self, body: CompletionBody) -> list[Generation]:
        prompts = completion_prompts(self.manager, body.prompt)
        echoes = echo_texts(self.manager, body, prompts) if body.echo else None
        return self.generations(jobs_for(self.manager, prompts, body, body.max_tokens, echoes, lora=self.lora))

    def respond(self, body: CompletionBody, generations: list[Generation], results: list[Result]) -> Any:
        choices, completion, cached = [], 0, []
        for i, (job, job_results) in enumerate(zip(self.jobs, self.results_by_job(results))):
            for j, (text, got, last) in enumerate(job_results):
                choices.append({"index": i * len(job.params) + j, "text": (job.echo or "") + text,
                                "logprobs": completion_logprobs(self.manager, job, got),
                                "finish_reason": finish_reason_name(last.finish_reason)})
                completion += last.completion_tokens
            cached.append(job_cached(job, [r[2] for r in job_results]))
        usage = Usage.of(sum(len(j.ids) for j in self.jobs), completion, cached)
        return {**self.meta, "object": "text_completion", "choices": choices, "usage": openai_usage(usage)}

    def events(self, body: CompletionBody, generations: list[Generation],
               chunks: AsyncIterator[tuple[int, Chunk]]) -> AsyncIterator[dict[str, Any]]:
        owner = {i: job for i, job in enumerate(j for j in self.jobs for _ in j.params)}
        return completion_events(self.manager, self.jobs, owner, chunks, self.meta, include_usage(body))


def model_card(request: Request) -> dict[str, Any]:
    settings, manager = request.app.state.settings, request.app.state.manager
    return {"id": settings.model_name, "object": "model", "created": 0, "owned_by": "radixkv",
            "root": manager.info["model_dir"], "max_model_len": manager.limits.context_length}


def adapter_card(request: Request, name: str) -> dict[str, Any]:
    """A LoRA adapter as vLLM lists one: its own model, with the base model as its parent."""
    base = request.app.state.settings.model_name
    return {"id": name, "object": "model", "created": 0, "owned_by": "radixkv", "root": name, "parent": base,
            "max_model_len": request.app.state.manager.limits.context_length}


@router.get("/v1/models")
async def models(request: Request):
    """The base model, then each LoRA adapter loaded."""
    adapters = sorted(request.app.state.manager.lora_adapters)
    return {"object": "list", "data": [model_card(request), *(adapter_card(request, a) for a in adapters)]}


@router.get("/v1/models/{model_id:path}")
async def model(request: Request, model_id: str):
    """One model (`client.models.retrieve`): the served one, by its name or its directory, or an adapter."""
    if check_model(request, model_id) is not None:
        return adapter_card(request, model_id.rpartition(":")[2] if model_id not in
                            request.app.state.manager.lora_adapters else model_id)
    return model_card(request)


@router.post("/v1/chat/completions", openapi_extra=request_body(ChatCompletionBody))
async def chat_completions(request: Request):
    return await ChatCompletions(request).handle()


@router.post("/v1/completions", openapi_extra=request_body(CompletionBody))
async def completions(request: Request):
    return await Completions(request).handle()


def completion_prompts(manager: TokenizerManager, prompt) -> list[list[int]]:
    if isinstance(prompt, str):
        return [manager.encode_text(prompt)]
    if not prompt:
        raise InvalidRequestError("prompt must not be empty")
    if isinstance(prompt[0], str):
        return [manager.encode_text(p) for p in prompt]
    vocab = manager.limits.vocab_size
    if isinstance(prompt[0], int):
        check_token_ids(prompt, vocab, "prompt")
        return [list(prompt)]
    for i, ids in enumerate(prompt):
        check_token_ids(ids, vocab, f"prompt[{i}]")
    return [list(p) for p in prompt]


def echo_texts(manager: TokenizerManager, body: CompletionBody, prompts: list[list[int]]) -> list[str]:
    """The text `echo` puts back: each prompt as sent (token-id prompts decoded)."""
    given = body.prompt if isinstance(body.prompt, list) else [body.prompt]
    if given and isinstance(given[0], str):
        return list(given)
    skip = body.skip_special_tokens if body.skip_special_tokens is not None else True
    return [manager.tokenizer.decode(ids, skip) for ids in prompts]


async def chat_events(manager: TokenizerManager, job: Job, chunks: AsyncIterator[tuple[int, Chunk]], meta: dict,
                      include_usage: bool, tools: ToolSet | None = None) -> AsyncIterator[dict[str, Any]]:
    """A choice's first chunk carries its first text (with the role), never an empty delta: clients
    time the first token by the first chunk. A chunk whose tokens' text is still held back (a
    partial character, a possible stop string, a possible tool call) is sent only when it has
    log-probs to carry. With tools, a call is sent as OpenAI streams it: a `tool_calls` delta with
    its id and name once the model names the tool, then its arguments in pieces as they come."""
    base = {**meta, "object": "chat.completion.chunk"}
    lasts: dict[int, Chunk] = {}
    opened: set[int] = set()
    readers = {j: CallStream(tools, pieces=True) for j in range(len(job.params))} \
        if tools is not None and tools.parses_calls else {}
    calls_sent: dict[int, int] = {}
    streamed: dict[str, int] = {}  # call id -> its index in its choice, while its arguments stream

    def call_deltas(j: int, events: list) -> list[dict[str, Any]]:
        """`tool_calls` delta entries of a choice's call events (`CallStart`, `CallArgs`, `ToolCall`)."""
        out = []
        for e in events:
            if isinstance(e, CallStart):
                index = calls_sent.get(j, 0)
                calls_sent[j], streamed[e.id] = index + 1, index
                out.append({"index": index, "id": e.id, "type": "function",
                            "function": {"name": e.name, "arguments": ""}})
            elif isinstance(e, CallArgs):
                out.append({"index": streamed[e.id], "function": {"arguments": e.text}})
            elif streamed.pop(e.id, None) is None:  # a call that came whole (a streamed one has gone out)
                out.append(call_json(e, calls_sent.get(j, 0)))
                calls_sent[j] = calls_sent.get(j, 0) + 1
        return out

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
            calls = call_deltas(j, [e for e in shown if not isinstance(e, str)])
        if text or calls or (chunk.new_ids and job.logprob.return_logprob):
            piece = Collected()
            piece.add(chunk)
            d = delta(j, text if text or not calls else None)
            if calls:
                d["tool_calls"] = calls
            yield {**base, "choices": [{"index": j, "delta": d,
                                        "logprobs": chat_logprobs(manager, job, piece), "finish_reason": None}]}
        if chunk.finished:
            lasts[j] = chunk
            yield {**base, "choices": [{"index": j, "delta": {} if j in opened else delta(j, ""), "logprobs": None,
                                        "finish_reason": chat_finish_reason(chunk.finish_reason,
                                                                            bool(calls_sent.get(j)))}]}
    if include_usage:
        finals = [lasts[j] for j in sorted(lasts)]
        yield {**base, "choices": [], "usage": openai_usage(Usage.of(
            len(job.ids), sum(c.completion_tokens for c in finals), [job_cached(job, finals)]))}


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
        yield {**base, "choices": [], "usage": openai_usage(Usage.of(
            sum(len(j.ids) for j in jobs), sum(c.completion_tokens for c in lasts.values()), cached))}


API = Api(router)
