"""Server-sent events, the one encoder every stream of this server goes through.

APIs differ only in how their streams read on the wire (`StreamFormat`): OpenAI's chat and
completions and the native API send bare `data:` events and end with `data: [DONE]`; the
Responses API names each event by its type and numbers it (`sequence_number`); Anthropic's
names its events. A typed error raised mid-stream ends every stream the same way: one last
event, the error in the API's own envelope (`StreamFormat.error_event`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi.responses import StreamingResponse

from radixkv.errors import RadixKVError
from radixkv.server.http.common import error_body, error_of

SSE_DONE = b"data: [DONE]\n\n"
Event = dict[str, Any]


@dataclass(frozen=True)
class StreamFormat:
    """How an API's stream reads on the wire."""

    named: bool = False  # each event has an `event:` line: its data's "type"
    numbered: bool = False  # each event's data ends with its `sequence_number` (from 0)
    done: bool = True  # the stream ends with `data: [DONE]`
    error_event: Callable[[int, str, str], Event] = error_body  # (status, message, type) -> the error's data


PLAIN = StreamFormat()
"""OpenAI's chat and completions streams, and the native API's."""


def sse(data: Event, event: str | None = None) -> bytes:
    """One server-sent event (with an `event:` line when `event` names it)."""
    head = f"event: {event}\n" if event is not None else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


async def encode_stream(events: AsyncIterator[Event], fmt: StreamFormat = PLAIN) -> AsyncIterator[bytes]:
    """`events` as server-sent events in `fmt`. A typed error raised mid-stream ends it with an
    error event: the one way every stream of this server fails."""
    n = 0

    def encode(data: Event) -> bytes:
        if fmt.numbered:
            data = {**data, "sequence_number": n}
        return sse(data, data["type"] if fmt.named else None)

    try:
        async for event in events:
            yield encode(event)
            n += 1
    except RadixKVError as e:
        yield encode(fmt.error_event(*error_of(e)))
    if fmt.done:
        yield SSE_DONE


def streaming_response(events: AsyncIterator[Event], fmt: StreamFormat = PLAIN) -> StreamingResponse:
    return StreamingResponse(encode_stream(events, fmt), media_type="text/event-stream")
