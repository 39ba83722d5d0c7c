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

from radixkv.errors import InvalidRequestError
from radixkv.results import Collected
from radixkv.server.api.conversation import render_ids
from radixkv.server.api.openai_jobs import (
    Job,
    call_json,
    chat_finish_reason,
    finish_reason_name,
    job_cached,
    jobs_for,
    openai_usage,
)
from radixkv.server.api.openai_logprobs import chat_logprobs, completion_logprobs
from radixkv.server.api.reasoning import ReasoningParser
from radixkv.server.api.pipeline import Generation, Result, Serving, Usage, check_model
from radixkv.server.api.protocol import (
    UNSUPPORTED_CHAT,
    UNSUPPORTED_COMPLETION,
    ChatCompletionBody,
    CompletionBody,
    refuse_unsupported,
)
from radixkv.server.api.tool_shapes import openai_tool_set
from radixkv.server.api.tools import CallArgs, CallStart, ToolSet, in_format
from radixkv.server.http.app import Api
from radixkv.server.http.common import all_or_none, json_body, request_body
from radixkv.server.runtime.tokenizer_manager import Chunk, TokenizerManager
from radixkv.validation import check_token_ids

router = APIRouter()


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
        self.tools = in_format(openai_tool_set(body.tools, body.tool_choice, body.parallel_tool_calls),
                               self.settings.tool_call_parser)
        messages = [m.template_message(f"messages[{i}]") for i, m in enumerate(body.messages)]
        prompt = render_ids(self.manager.tokenizer, messages, self.tools,
                            continue_final_message=body.continue_final_message,
                            template_kwargs=body.chat_template_kwargs)
        return self.generations(jobs_for(self.manager, [prompt], body, max_tokens, tools=self.tools, lora=self.lora))

    def reasoning(self, body: ChatCompletionBody) -> ReasoningParser | None:
        """The reasoning parser this request's output goes through (None: its text is all content)."""
        name = self.settings.reasoning_parser
        return ReasoningParser(name) if name is not None and body.separate_reasoning else None

    def respond(self, body: ChatCompletionBody, generations: list[Generation], results: list[Result]) -> Any:
        (job,), tools = self.jobs, self.tools
        parser = self.reasoning(body)
        choices = []
        for j, (text, got, last) in enumerate(results):
            reasoning, text = parser.split(text) if parser is not None else (None, text)
            content, calls = tools.parse(text) if tools is not None else (text, [])
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if parser is not None:
                message["reasoning_content"] = reasoning
            if calls:
                message["tool_calls"] = [call_json(c) for c in calls]
            choices.append({"index": j, "message": message, "logprobs": chat_logprobs(self.manager, job, got),
                            "finish_reason": chat_finish_reason(last.finish_reason, bool(calls))})
        usage = Usage.of(len(job.ids), sum(r[2].completion_tokens for r in results),
                         [job_cached(job, [r[2] for r in results])])
        return {**self.meta, "object": "chat.completion", "choices": choices, "usage": openai_usage(usage)}

    def events(self, body: ChatCompletionBody, generations: list[Generation],
               chunks: AsyncIterator[tuple[int, Chunk]]) -> AsyncIterator[dict[str, Any]]:
        return chat_events(self.manager, self.jobs[0], chunks, self.meta, include_usage(body), self.tools,
                           self.reasoning(body), body.stream_reasoning)


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
                      include_usage: bool, tools: ToolSet | None = None, reasoning: ReasoningParser | None = None,
                      stream_reasoning: bool = True) -> AsyncIterator[dict[str, Any]]:
    """A choice's first chunk carries its first text (with the role), never an empty delta: clients
    time the first token by the first chunk. A chunk whose tokens' text is still held back (a
    partial character, a possible stop string, a possible tool call) is sent only when it has
    log-probs to carry. With tools, a call is sent as OpenAI streams it: a `tool_calls` delta with
    its id and name once the model names the tool, then its arguments in pieces as they come. With a
    reasoning parser the thinking streams as `reasoning_content` deltas (all at once before the
    answer when `stream_reasoning` is false), and only the answer is read for calls."""
    base = {**meta, "object": "chat.completion.chunk"}
    lasts: dict[int, Chunk] = {}
    opened: set[int] = set()
    readers = {j: tools.reader(pieces=True) for j in range(len(job.params))} \
        if tools is not None and tools.parses_calls else {}
    thinking = {j: reasoning.stream() for j in range(len(job.params))} if reasoning is not None else {}
    held_reasoning: dict[int, str] = {}
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
        text, calls, thought = chunk.text, [], ""
        if j in thinking:
            thought, text = thinking[j].push(text)
            if chunk.finished:
                more_thought, more_text = thinking[j].finish()
                thought, text = thought + more_thought, text + more_text
            if not stream_reasoning:  # held until the answer starts (or the output ends)
                held_reasoning[j] = held_reasoning.get(j, "") + thought
                thought = held_reasoning.pop(j) if text or chunk.finished else ""
        if thought:
            d = delta(j, None)
            d["reasoning_content"] = thought
            yield {**base, "choices": [{"index": j, "delta": d, "logprobs": None, "finish_reason": None}]}
        if j in readers:
            shown = readers[j].push(text) + (readers[j].finish() if chunk.finished else [])
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
