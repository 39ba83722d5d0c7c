"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}.

A response's input is text or items (`responses_protocol`), after `instructions`; its output
is a message and/or function calls (tools as in chat completions, `radixkv.server.api.tools`).
`previous_response_id` continues a stored conversation (`response_store`) from the exact token
ids the server ran for it, prompt and output as generated (`conversation.continue_ids`): the
new prompt is a token prefix hit by construction, and `usage.input_tokens_details.
cached_tokens` covers the whole previous turn. When that cannot hold (the instructions or tools
changed, or the chat template rewrites earlier turns) the conversation is rendered afresh.

Streaming sends OpenAI's typed events (`response.created` ... `response.completed`), each with
its `sequence_number`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI, Request

from radixkv.errors import InvalidRequestError
from radixkv.results import Collected
from radixkv.retention import Retention
from radixkv.sampling_params import SamplingParams
from radixkv.server.api.conversation import (
    breakpoint_retention,
    continue_ids,
    render_ids,
)
from radixkv.server.api.pipeline import Generation, Result, Serving, Usage, only, with_call_grammar
from radixkv.server.api.protocol import openai_retention
from radixkv.tenancy import salt_namespace
from radixkv.server.api.response_store import ResponseStore, StoredResponse
from radixkv.server.api.responses_protocol import ResponsesBody, input_messages
from radixkv.server.api.tool_shapes import openai_tool_set
from radixkv.server.api.reasoning import ReasoningParser
from radixkv.server.api.tools import CallArgs, CallStart, ToolCall, ToolSet, in_format
from radixkv.server.http.app import Api
from radixkv.server.http.sse import StreamFormat
from radixkv.server.http.common import (
    HTTPError,
    ServerSettings,
    json_body,
    principal,
    request_body,
)
from radixkv.server.runtime.tokenizer_manager import Chunk, TokenizerManager

router = APIRouter()
logger = logging.getLogger(__name__)


@dataclass
class Turn:
    """One response being made: its prompt, how it samples, and where it continues from."""

    body: ResponsesBody
    id: str
    history: list[dict[str, Any]]  # the messages the prompt renders
    ids: list[int]
    params: SamplingParams
    tools: ToolSet | None
    retention: Retention | None
    namespace: str | None
    exact: bool  # the prompt continues the previous response's exact token ids


def prepare(request: Request, body: ResponsesBody) -> Turn:
    """Validate the body and build the turn's prompt (400s name the field at fault)."""
    manager: TokenizerManager = request.app.state.manager
    store: ResponseStore = request.app.state.responses
    tokenizer = manager.tokenizer
    tools = in_format(openai_tool_set(body.tools, body.tool_choice, body.parallel_tool_calls, flat=True),
                      request.app.state.settings.tool_call_parser)
    options = body.prompt_cache_options
    new_messages, marks = input_messages(body.input, options.ttl if options else "30m")
    system = [{"role": "system", "content": body.instructions}] if body.instructions is not None else []
    prev = None
    if body.previous_response_id is not None:
        prev = store.get(principal(request), body.previous_response_id)
        if prev is None:
            raise InvalidRequestError(f"previous_response_id={body.previous_response_id!r}: no such stored response "
                                      f"(responses are kept per API key, at most {store.max_responses} of them for "
                                      f"{store.max_age:.0f} s; store=false ones are not kept)")
    earlier = prev.conversation if prev is not None else []
    history = [*system, *earlier, *new_messages]
    ids = None
    if prev is not None and prev.instructions == body.instructions and prev.tools == tools:
        ids = continue_ids(tokenizer, prev.history, prev.turn_ids, prev.output_ids, prev.reply, new_messages, tools)
        if ids is None:
            logger.info("previous_response_id=%s: the chat template does not continue the stored turn as generated; "
                        "rendering the conversation afresh", body.previous_response_id)
    exact = ids is not None
    if ids is None:
        ids = render_ids(tokenizer, history, tools)
    offset = len(system) + len(earlier)
    cuts = [([*history[: offset + i], cut], seconds) for i, cut, seconds in marks]
    spans = [r for r in (openai_retention(body.prompt_cache_retention, body.prompt_cache_key),
                         Retention.whole(Retention.named(options.ttl, "prompt_cache_options.ttl"))
                         if options is not None else None,
                         breakpoint_retention(tokenizer, ids, cuts, tools)) if r is not None]
    retention = Retention(tuple(s for r in spans for s in r.spans)) if spans else None
    params = sampling(manager, body, len(ids), tools)
    manager.check(ids, params)
    return Turn(body, f"resp_{uuid.uuid4().hex}", history, ids, params, tools, retention,
                salt_namespace(body.cache_salt), exact)


def sampling(manager: TokenizerManager, body: ResponsesBody, prompt_len: int, tools: ToolSet | None) -> SamplingParams:
    if body.prompt_cache_options is not None and body.prompt_cache_options.prewarm:
        max_new = 0
    elif body.max_output_tokens is not None:
        max_new = body.max_output_tokens
    else:
        max_new = max(0, manager.limits.context_length - prompt_len)
    params: dict[str, Any] = {"max_new_tokens": max_new}
    for name in ("temperature", "top_p", "seed"):
        if getattr(body, name) is not None:
            params[name] = getattr(body, name)
    schema = body.json_schema()
    if schema is not None:
        params["json_schema"] = schema
    params = with_call_grammar(params, tools)
    return SamplingParams.from_dict(params)


# -- the response object -----------------------------------------------------------------------------
def message_item(text: str, status: str = "completed", item_id: str | None = None) -> dict[str, Any]:
    return {"type": "message", "id": item_id or f"msg_{uuid.uuid4().hex}", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if text or
            status == "completed" else []}


def reasoning_item(text: str, status: str = "completed", item_id: str | None = None) -> dict[str, Any]:
    """A model's thinking (`--reasoning-parser`), as OpenAI's reasoning output item."""
    return {"type": "reasoning", "id": item_id or f"rs_{uuid.uuid4().hex}", "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}] if text or status == "completed" else []}


def reasoning_of(request: Request) -> ReasoningParser | None:
    name = request.app.state.settings.reasoning_parser
    return ReasoningParser(name) if name is not None else None


def call_item(call: ToolCall, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call.id.removeprefix('call_')}", "call_id": call.id,
            "name": call.name, "arguments": call.arguments if status != "in_progress" else "", "status": status}


def response_object(turn: Turn, model: str, status: str, output: list[dict[str, Any]],
                    last: Chunk | None, created: float) -> dict[str, Any]:
    """The Response as OpenAI returns it (the request's settings echoed)."""
    body = turn.body
    usage = responses_usage(Usage.of(len(turn.ids), last.completion_tokens, [last])) if last is not None else None
    incomplete = status == "incomplete"
    return {
        "id": turn.id, "object": "response", "created_at": int(created), "status": status,
        "completed_at": int(time.time()) if status == "completed" else None, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": body.instructions, "max_output_tokens": body.max_output_tokens, "model": model,
        "output": output, "parallel_tool_calls": turn.tools.parallel if turn.tools is not None else True,
        "previous_response_id": body.previous_response_id, "temperature": body.temperature, "top_p": body.top_p,
        "tool_choice": body.tool_choice if body.tool_choice is not None else "auto", "tools": body.tools or [],
        "text": body.text or {"format": {"type": "text"}}, "truncation": "disabled", "store": body.store,
        "metadata": body.metadata or {}, "user": body.user, "prompt_cache_key": body.prompt_cache_key,
        "prompt_cache_retention": body.prompt_cache_retention, "background": False, "service_tier": "default",
        "reasoning": {"effort": None, "summary": None}, "usage": usage,
        **({"prompt_cache_diagnostics": {"type": "unavailable"}}
           if body.prompt_cache_options is not None and body.prompt_cache_options.comparison_response_id else {}),
    }


def responses_usage(usage: Usage) -> dict[str, Any]:
    """The Responses API's usage of the pipeline's record (`cache`: the prompt by why it hit or missed)."""
    details = {"cached_tokens": usage.cached_tokens, "cache_write_tokens": usage.prompt_tokens - usage.cached_tokens,
               **({"cache": usage.causes} if usage.causes is not None else {})}
    return {"input_tokens": usage.prompt_tokens, "input_tokens_details": details,
            "output_tokens": usage.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.total_tokens}


def finished_status(last: Chunk) -> str:
    """`incomplete` when generation stopped at max_output_tokens (a prewarm's 0 tokens is complete)."""
    return "incomplete" if (last.finish_reason or {}).get("type") == "length" and last.completion_tokens \
        else "completed"


def outputs_of(turn: Turn, text: str) -> tuple[str | None, list[ToolCall]]:
    return turn.tools.parse(text) if turn.tools is not None else (text, [])


def remember(request: Request, turn: Turn, response: dict[str, Any], content: str | None, calls: list[ToolCall],
             output_ids: list[int]) -> None:
    """Store the response (unless `store: false`) with what its continuation needs."""
    if not turn.body.store:
        return
    reply: dict[str, Any] = {"role": "assistant", "content": content or ""}
    if calls:
        reply["tool_calls"] = [c.to_message() for c in calls]
    request.app.state.responses.put(principal(request), turn.id, StoredResponse(
        response, turn.body.instructions, turn.tools, turn.history, reply, list(turn.ids), list(output_ids)))


def stream_error(status: int, message: str, kind: str) -> dict[str, Any]:
    """The `error` event a typed error mid-stream ends a Responses stream with."""
    return {"type": "error", "code": kind, "message": message, "param": None}


# -- routes ----------------------------------------------------------------------------------------
class CreateResponse(Serving):
    """POST /v1/responses: one generation, its turn stored for `previous_response_id`."""

    stream_format = StreamFormat(named=True, numbered=True, done=False, error_event=stream_error)
    client_names = {"max_new_tokens": "max_output_tokens", "json_schema": "text.format"}

    async def parse(self) -> ResponsesBody:
        body = ResponsesBody.model_validate(await json_body(self.request))
        body.refuse_features_it_lacks()
        if self.check_model(body.model) is not None:
            raise InvalidRequestError(f"model={body.model!r} is a LoRA adapter: adapters are served on /generate, "
                                      "/v1/chat/completions and /v1/completions, not the Responses API yet")
        return body

    def build(self, body: ResponsesBody) -> list[Generation]:
        self.turn = turn = prepare(self.request, body)
        self.model, self.created = self.settings.model_name, time.time()
        return [Generation(turn.ids, turn.params, namespace=turn.namespace, retention=turn.retention)]

    def respond(self, body: ResponsesBody, generations: list[Generation], results: list[Result]) -> Any:
        ((text, got, last),) = results
        parser = reasoning_of(self.request)
        reasoning, text = parser.split(text) if parser is not None else (None, text)
        content, calls = outputs_of(self.turn, text)
        output = ([reasoning_item(reasoning)] if reasoning else []) + ([message_item(content)] if content else []) + \
            [call_item(c, "completed" if c.complete else "incomplete") for c in calls]
        response = response_object(self.turn, self.model, finished_status(last), output, last, self.created)
        remember(self.request, self.turn, response, content, calls, got.ids)
        return response

    def events(self, body: ResponsesBody, generations: list[Generation],
               chunks: AsyncIterator[tuple[int, Chunk]]) -> AsyncIterator[dict[str, Any]]:
        return response_events(self.request, self.turn, self.model, self.created, only(chunks))


@router.post("/v1/responses", openapi_extra=request_body(ResponsesBody))
async def create_response(request: Request):
    return await CreateResponse(request).handle()


@router.get("/v1/responses/{response_id}")
async def get_response(request: Request, response_id: str):
    stored = request.app.state.responses.get(principal(request), response_id)
    if stored is None:
        raise HTTPError(404, f"response {response_id!r} not found (responses are kept per API key, for a bounded "
                             f"time; store=false ones are not kept)", "not_found")
    return stored.body


@router.delete("/v1/responses/{response_id}")
async def delete_response(request: Request, response_id: str):
    if not request.app.state.responses.delete(principal(request), response_id):
        raise HTTPError(404, f"response {response_id!r} not found", "not_found")
    return {"id": response_id, "object": "response", "deleted": True}


# -- streaming -------------------------------------------------------------------------------------
async def response_events(request: Request, turn: Turn, model: str, created: float,
                          chunks: AsyncIterator[Chunk]) -> AsyncIterator[dict[str, Any]]:
    """OpenAI's event sequence: created, in_progress; per output item added, its deltas, done;
    completed (or incomplete) with the whole response."""
    output: list[dict[str, Any]] = []
    message: dict[str, Any] | None = None  # the message item being written
    text_parts: list[str] = []
    reader = turn.tools.reader(pieces=True) if turn.tools is not None and turn.tools.parses_calls else None
    parser = reasoning_of(request)
    thinking = parser.stream() if parser is not None else None
    thought: dict[str, Any] | None = None  # the reasoning item being written
    thought_parts: list[str] = []
    got, content, calls = Collected(), [], []
    streaming: dict[str, dict[str, Any]] = {}  # call id -> its item, while its arguments stream
    start = response_object(turn, model, "in_progress", [], None, created)
    yield {"type": "response.created", "response": start}
    yield {"type": "response.in_progress", "response": start}

    def close_message():
        nonlocal message
        if message is None:
            return
        done = "".join(text_parts)
        index = output.index(message)
        message["content"] = [{"type": "output_text", "text": done, "annotations": [], "logprobs": []}]
        message["status"] = "completed"
        yield {"type": "response.output_text.done", "item_id": message["id"], "output_index": index,
               "content_index": 0, "text": done, "logprobs": []}
        yield {"type": "response.content_part.done", "item_id": message["id"], "output_index": index,
               "content_index": 0, "part": message["content"][0]}
        yield {"type": "response.output_item.done", "output_index": index, "item": message}
        message = None

    def close_thought():
        nonlocal thought
        if thought is None:
            return
        done, index = "".join(thought_parts), output.index(thought)
        thought.update(content=[{"type": "reasoning_text", "text": done}], status="completed")
        yield {"type": "response.reasoning_text.done", "item_id": thought["id"], "output_index": index,
               "content_index": 0, "text": done}
        yield {"type": "response.output_item.done", "output_index": index, "item": thought}
        thought = None

    last = None
    async for chunk in chunks:
        chunk.raise_if_error()
        got.add(chunk)
        last = chunk
        text = chunk.text
        if thinking is not None:
            piece, text = thinking.push(text)
            if chunk.finished:
                more, rest = thinking.finish()
                piece, text = piece + more, text + rest
            if piece:
                if thought is None:
                    thought, thought_parts = reasoning_item("", "in_progress"), []
                    output.append(thought)
                    yield {"type": "response.output_item.added", "output_index": len(output) - 1, "item": dict(thought)}
                thought_parts.append(piece)
                yield {"type": "response.reasoning_text.delta", "item_id": thought["id"],
                       "output_index": output.index(thought), "content_index": 0, "delta": piece}
            if text or chunk.finished:
                for event in close_thought():
                    yield event
        shown = [text] if reader is None else reader.push(text) + (reader.finish() if chunk.finished else [])
        for piece in shown:
            if isinstance(piece, str):
                if not piece:
                    continue
                if message is None:
                    message, text_parts = message_item("", "in_progress"), []
                    output.append(message)
                    yield {"type": "response.output_item.added", "output_index": len(output) - 1, "item": message}
                    yield {"type": "response.content_part.added", "item_id": message["id"],
                           "output_index": len(output) - 1, "content_index": 0,
                           "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}
                text_parts.append(piece)
                content.append(piece)
                yield {"type": "response.output_text.delta", "item_id": message["id"],
                       "output_index": output.index(message), "content_index": 0, "delta": piece, "logprobs": []}
            elif isinstance(piece, CallArgs):  # a piece of the arguments, as they come
                item = streaming[piece.id]
                yield {"type": "response.function_call_arguments.delta", "item_id": item["id"],
                       "output_index": output.index(item), "delta": piece.text}
            else:
                if isinstance(piece, CallStart) or piece.id not in streaming:
                    for event in close_message():
                        yield event
                    item = call_item(ToolCall(piece.id, piece.name, ""), "in_progress")
                    output.append(item)
                    streaming[piece.id] = item
                    yield {"type": "response.output_item.added", "output_index": len(output) - 1, "item": dict(item)}
                    if isinstance(piece, CallStart):
                        continue
                    if piece.arguments:  # a call that came whole
                        yield {"type": "response.function_call_arguments.delta", "item_id": item["id"],
                               "output_index": len(output) - 1, "delta": piece.arguments}
                item = streaming.pop(piece.id)
                index = output.index(item)
                calls.append(piece)
                yield {"type": "response.function_call_arguments.done", "item_id": item["id"], "output_index": index,
                       "name": piece.name, "arguments": piece.arguments}
                item.update(arguments=piece.arguments, status="completed" if piece.complete else "incomplete")
                yield {"type": "response.output_item.done", "output_index": index, "item": item}
    for event in close_message():
        yield event
    status = finished_status(last)
    response = response_object(turn, model, status, output, last, created)
    text = "".join(content).strip() if calls else "".join(content)
    remember(request, turn, response, text or None, calls, got.ids)
    yield {"type": "response.completed" if status == "completed" else "response.incomplete", "response": response}


def keep_responses(app: FastAPI, settings: ServerSettings) -> None:
    """The store `previous_response_id` reads (bounded by `--responses-store-size` and `-ttl`)."""
    app.state.responses = ResponseStore(settings.responses_store_size, settings.responses_store_ttl,
                                        max_bytes=settings.responses_store_bytes)


API = Api(router, setup=keep_responses)
