"""Anthropic's Messages API: POST /v1/messages (streaming too) and /v1/messages/count_tokens.

The request (`anthropic_protocol`): system, messages of text / tool_use / tool_result blocks,
tools and tool_choice (`tools.anthropic_tool_set`; `any` and a named tool generate under the
call grammar), sampling (`max_tokens`, `stop_sequences`, `temperature`, `top_p`, `top_k`), and
`cache_control` breakpoints, which become a `Retention` (`conversation.breakpoint_retention`).
A last message of the assistant's is continued (Anthropic's prefill).

Usage, as Anthropic counts it (the three input figures add up to the prompt):
`cache_read_input_tokens`: prompt tokens the radix cache served; `cache_creation_input_tokens`:
tokens up to the last breakpoint that were not read from the cache (computed now, and
retained); `input_tokens`: the rest.

Streaming: Anthropic's named events (`message_start`, `ping`, per block `content_block_start` /
`content_block_delta` / `content_block_stop`, `message_delta`, `message_stop`); a failure after
the stream began ends it with an `error` event. Errors on these paths, streamed or not, are
Anthropic's shape (`error_body`): the app answers in it on every path under `PATH` (`API`).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from radixkv.errors import InvalidRequestError
from radixkv.retention import Retention
from radixkv.sampling_params import SamplingParams
from radixkv.server.api.anthropic_protocol import (
    CountTokensBody,
    MessagesBody,
    PromptFields,
    conversation_of,
)
from radixkv.server.api.conversation import breakpoint_retention, render_ids
from radixkv.server.api.pipeline import Generation, Result, Serving, Usage, check_model, only, with_call_grammar
from radixkv.server.api.reasoning import ReasoningParser
from radixkv.server.api.tool_shapes import anthropic_tool_set
from radixkv.server.api.tools import (
    CallArgs,
    CallStart,
    ToolCall,
    ToolSet,
    in_format,
    new_call_id,
)
from radixkv.server.http.app import Api
from radixkv.server.http.sse import StreamFormat, encode_stream
from radixkv.server.http.common import (
    json_body,
    off_loop,
    request_body,
)
from radixkv.server.runtime.tokenizer_manager import Chunk

router = APIRouter()
PATH = "/v1/messages"
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
               429: "rate_limit_error", 503: "overloaded_error"}
Event = tuple[str, dict[str, Any]]


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error: `{"type": "error", "error": {"type", "message"}}`, the type by status."""
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_response(status: int, message: str, kind: str | None = None) -> JSONResponse:
    """Anthropic's error answer (its type follows from the status; our `kind` is not shown)."""
    return JSONResponse(error_body(status, message), status_code=status)


STREAM = StreamFormat(named=True, done=False, error_event=lambda status, message, kind: error_body(status, message))
"""Anthropic's stream: named events, no `[DONE]`, a failure mid-stream an `error` event."""


@dataclass(frozen=True)
class Prompt:
    """A request's prompt, validated: its token ids, the tools offered, the retention its cache
    breakpoints ask for, and how many of its tokens the last breakpoint covers."""

    ids: list[int]
    tools: ToolSet | None
    retention: Retention | None
    breakpoint_end: int  # tokens

    def usage_of(self, usage: Usage) -> dict[str, int]:
        """Anthropic's usage of the pipeline's record."""
        return self.usage(usage.cached_tokens, usage.completion_tokens)

    def usage(self, cache_read: int, output_tokens: int) -> dict[str, int]:
        creation = max(0, self.breakpoint_end - cache_read)
        return {"input_tokens": len(self.ids) - cache_read - creation, "output_tokens": output_tokens,
                "cache_read_input_tokens": cache_read, "cache_creation_input_tokens": creation}


def prompt_of(request: Request, body: PromptFields) -> Prompt:
    if check_model(request, body.model) is not None:
        raise InvalidRequestError(f"model={body.model!r} is a LoRA adapter: adapters are served on /generate, "
                                  "/v1/chat/completions and /v1/completions, not the Messages API yet")
    body.refuse_features_it_lacks()
    tokenizer = request.app.state.manager.tokenizer
    tools = in_format(anthropic_tool_set(body.tools, body.tool_choice), request.app.state.settings.tool_call_parser)
    conversation = conversation_of(body)
    ids = render_ids(tokenizer, conversation.messages, tools, continue_final_message=conversation.prefill)
    retention = breakpoint_retention(tokenizer, ids, conversation.marks, tools)
    end = max((tokens for tokens, _ in retention.spans), default=0) if retention is not None else 0
    return Prompt(ids, tools, retention, end)


def tool_use_block(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": new_call_id("toolu_"), "name": call.name, "input": call.arguments_dict}


def stop_reason(reason: dict[str, Any] | None, called: bool, stop_sequences: list[str] | None
                ) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of the scheduler's finish reason: cut by max_tokens, ended on
    tool calls, on one of the stop sequences (the matched one), or at the end of the turn."""
    reason = reason or {}
    if reason.get("type") == "length":
        return "max_tokens", None
    if called:
        return "tool_use", None
    matched = reason.get("matched")
    if isinstance(matched, str) and matched in (stop_sequences or ()):
        return "stop_sequence", matched
    return "end_turn", None


def message_meta(request: Request) -> dict[str, Any]:
    return {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
            "model": request.app.state.settings.model_name}


class Messages(Serving):
    """POST /v1/messages: one generation; Anthropic's named events when it streams."""

    stream_format = STREAM
    client_names = {"max_new_tokens": "max_tokens", "stop": "stop_sequences"}

    async def parse(self) -> MessagesBody:
        return MessagesBody.model_validate(await json_body(self.request))

    def build(self, body: MessagesBody) -> list[Generation]:
        self.prompt = prompt = prompt_of(self.request, body)
        params = body.sampling_dict()
        params = with_call_grammar(params, prompt.tools)
        sampling = SamplingParams.from_dict(params)
        self.manager.check(prompt.ids, sampling)
        self.meta = message_meta(self.request)
        return [Generation(prompt.ids, sampling, retention=prompt.retention)]

    def respond(self, body: MessagesBody, generations: list[Generation], results: list[Result]) -> Any:
        ((text, _, last),) = results
        prompt = self.prompt
        parser = reasoning_of(self.request)
        reasoning, text = parser.split(text) if parser is not None else (None, text)
        content, calls = prompt.tools.parse(text) if prompt.tools is not None else (text, [])
        calls = [c for c in calls if c.complete]  # one max_tokens cut: stop_reason says so, its input is not whole
        blocks = ([{"type": "thinking", "thinking": reasoning, "signature": ""}] if reasoning else []) + \
            ([{"type": "text", "text": content}] if content else []) + [tool_use_block(c) for c in calls]
        reason, sequence = stop_reason(last.finish_reason, bool(calls), body.stop_sequences)
        return {**self.meta, "content": blocks, "stop_reason": reason, "stop_sequence": sequence,
                "usage": prompt.usage_of(Usage.of(len(prompt.ids), last.completion_tokens, [last]))}

    def events(self, body: MessagesBody, generations: list[Generation],
               chunks: AsyncIterator[tuple[int, Chunk]]) -> AsyncIterator[dict[str, Any]]:
        return payloads(message_events(self.prompt, only(chunks), self.meta, body.stop_sequences,
                                       reasoning_of(self.request)))


def reasoning_of(request: Request) -> ReasoningParser | None:
    name = request.app.state.settings.reasoning_parser
    return ReasoningParser(name) if name is not None else None


@router.post(PATH, openapi_extra=request_body(MessagesBody))
async def messages(request: Request):
    return await Messages(request).handle()


@router.post(f"{PATH}/count_tokens", openapi_extra=request_body(CountTokensBody))
async def count_tokens(request: Request):
    """The prompt's length in tokens, as POST /v1/messages would run it (nothing runs)."""
    body = CountTokensBody.model_validate(await json_body(request))
    return {"input_tokens": len((await off_loop(prompt_of, request, body)).ids)}


# -- streaming -------------------------------------------------------------------------------------
async def payloads(events: AsyncIterator[Event]) -> AsyncIterator[dict[str, Any]]:
    """The data of (name, data) events, each named by its data's type."""
    async for _, data in events:
        yield data


def event_bytes(events: AsyncIterator[Event]) -> AsyncIterator[bytes]:
    """`events` as named server-sent events; a typed error mid-stream ends it with an `error` event."""
    return encode_stream(payloads(events), STREAM)


class ContentStream:
    """A reply's content blocks as Anthropic streams them. A text block opens with its first
    text that is not blank (blank text before a tool call is dropped, as `ToolSet.parse` strips
    it) and closes before a tool_use block or at the end; a tool_use block starts once the
    model names its tool, its input follows in `input_json_delta` pieces as the model writes
    it, and it stops when the call ends."""

    def __init__(self) -> None:
        self.blocks = 0  # started so far; the open text block, if any, is the last
        self.text_open = False
        self.blank = ""  # blank text held while no text block is open
        self.calls = 0
        self.open_call: tuple[str, int] | None = None  # (call id, block index) of the tool_use streaming
        self.thinking_open = False

    def thinking(self, text: str) -> list[Event]:
        """A piece of the model's thinking (`--reasoning-parser`): a thinking block, before any other."""
        if not text:
            return []
        events = []
        if not self.thinking_open:
            self.thinking_open, self.blocks = True, self.blocks + 1
            events.append(("content_block_start", {"type": "content_block_start", "index": self.blocks - 1,
                                                   "content_block": {"type": "thinking", "thinking": "", "signature": ""}}))
        return events + [delta(self.blocks - 1, {"type": "thinking_delta", "thinking": text})]

    def close_thinking(self) -> list[Event]:
        if not self.thinking_open:
            return []
        self.thinking_open = False
        return [("content_block_stop", {"type": "content_block_stop", "index": self.blocks - 1})]

    def text(self, text: str) -> list[Event]:
        if not self.text_open and not (self.blank + text).strip():
            self.blank += text
            return []
        events = [] if self.text_open else self._open_text()
        text, self.blank = self.blank + text, ""
        return (events + [delta(self.blocks - 1, {"type": "text_delta", "text": text})]) if text else events

    def piece(self, piece: CallStart | CallArgs | ToolCall) -> list[Event]:
        """Events of a call's start, a piece of its input, or its end."""
        if isinstance(piece, CallStart):
            events, self.blank = self._close_text(), ""
            index, self.blocks, self.calls = self.blocks, self.blocks + 1, self.calls + 1
            self.open_call = (piece.id, index)
            return events + [("content_block_start", {"type": "content_block_start", "index": index, "content_block": {
                "type": "tool_use", "id": "toolu_" + piece.id.removeprefix("call_"), "name": piece.name, "input": {}}})]
        if isinstance(piece, CallArgs):
            return [delta(self.open_call[1], {"type": "input_json_delta", "partial_json": piece.text})]
        if self.open_call is not None and self.open_call[0] == piece.id:
            index, self.open_call = self.open_call[1], None
            return [("content_block_stop", {"type": "content_block_stop", "index": index})]
        return self.call(piece) if piece.complete else []

    def call(self, call: ToolCall) -> list[Event]:
        events, self.blank = self._close_text(), ""
        block, index = tool_use_block(call), self.blocks
        self.blocks, self.calls = self.blocks + 1, self.calls + 1
        return events + [
            ("content_block_start", {"type": "content_block_start", "index": index,
                                     "content_block": {**block, "input": {}}}),
            delta(index, {"type": "input_json_delta", "partial_json": call.arguments}),
            ("content_block_stop", {"type": "content_block_stop", "index": index})]

    def finish(self) -> list[Event]:
        """The last events of the content: blank text with nothing else is a text block of its own."""
        if self.blank and not self.calls and not self.text_open:
            events = self._open_text() + [delta(self.blocks - 1, {"type": "text_delta", "text": self.blank})]
            self.blank = ""
            return events + self._close_text()
        return self._close_text()

    def _open_text(self) -> list[Event]:
        self.text_open, self.blocks = True, self.blocks + 1
        return [("content_block_start", {"type": "content_block_start", "index": self.blocks - 1,
                                         "content_block": {"type": "text", "text": ""}})]

    def _close_text(self) -> list[Event]:
        if not self.text_open:
            return []
        self.text_open = False
        return [("content_block_stop", {"type": "content_block_stop", "index": self.blocks - 1})]


def delta(index: int, body: dict[str, Any]) -> Event:
    return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": body}


async def message_events(prompt: Prompt, chunks: AsyncIterator[Chunk], meta: dict[str, Any],
                         stop_sequences: list[str] | None, reasoning: ReasoningParser | None = None
                         ) -> AsyncIterator[Event]:
    """The Messages stream of one request's chunks (the first already came: it carries how
    much of the prompt the cache served, which `message_start` reports)."""
    content = ContentStream()
    reader = prompt.tools.reader(pieces=True) if prompt.tools is not None and prompt.tools.parses_calls else None
    thinking = reasoning.stream() if reasoning is not None else None
    opened = False
    async for chunk in chunks:
        if not opened:
            opened = True
            yield "message_start", {"type": "message_start", "message": {
                **meta, "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": prompt.usage_of(Usage.of(len(prompt.ids), 0, [chunk]))}}
            yield "ping", {"type": "ping"}
        text = chunk.text
        if thinking is not None:  # the thinking block comes first, closed once the answer starts
            thought, text = thinking.push(text)
            if chunk.finished:
                more, rest = thinking.finish()
                thought, text = thought + more, text + rest
            for event in content.thinking(thought) + (content.close_thinking() if text or chunk.finished else []):
                yield event
        if reader is None:
            shown: list[str | ToolCall] = [text] if text else []
        else:
            shown = reader.push(text) + (reader.finish() if chunk.finished else [])
        for piece in shown:
            for event in content.text(piece) if isinstance(piece, str) else content.piece(piece):
                yield event
        if chunk.finished:
            for event in content.finish():
                yield event
            reason, sequence = stop_reason(chunk.finish_reason, content.calls > 0, stop_sequences)
            yield "message_delta", {"type": "message_delta",
                                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                    "usage": prompt.usage_of(Usage.of(len(prompt.ids), chunk.completion_tokens,
                                                                      [chunk]))}
            yield "message_stop", {"type": "message_stop"}


API = Api(router, PATH, error_response)
