"""What every HTTP endpoint shares, written once: the settings, reading a JSON body within its
limits, the error format and how typed errors map to HTTP statuses, and leaving when the client
does (server-sent events are `sse.py`).

Every error is `{"error": {"message", "type", "code"}}` with a 4xx/5xx status.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from radixkv.errors import ErrorKind, LoRAInUse, Overloaded, RadixKVError, kind_of_error
from radixkv.json_text import check_depth

DEFAULT_MAX_BODY_BYTES = 8 << 20
DEFAULT_SHUTDOWN_TIMEOUT = 30.0
STATUS_OF = {ErrorKind.INVALID_REQUEST: 400, ErrorKind.INTERNAL: 500, ErrorKind.UNAVAILABLE: 503}
TYPE_OF = {ErrorKind.INVALID_REQUEST: "invalid_request_error", ErrorKind.INTERNAL: "internal_error",
           ErrorKind.UNAVAILABLE: "service_unavailable"}
T = TypeVar("T")


@dataclass(frozen=True)
class ServerSettings:
    """What the HTTP front needs beyond the runtime: its names, keys and limits."""

    model_name: str  # what /v1/models lists and OpenAI requests must name
    api_keys: tuple[str, ...] = ()  # each a principal; none: every client is the same one
    admin_key: str | None = None  # may flush and see every tenant (`radixkv.tenancy`)
    cache_sharing: str = "per-key"  # `tenancy.SHARING`: each principal its own cache, or one for all
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT  # seconds a SIGTERM waits for requests in flight
    responses_store_size: int = 1024  # stored Responses API responses (previous_response_id), at most
    responses_store_ttl: float = 3600.0  # seconds a stored response is kept
    responses_store_bytes: int = 256 << 20  # the stored responses' memory, estimated, at most
    max_queued_requests: int = 4096  # requests held at once (TokenizerManager.admit)
    reasoning_parser: str | None = None  # --reasoning-parser (radixkv.server.api.reasoning)
    tool_call_parser: str | None = None  # --tool-call-parser (radixkv.server.api.tool_parsers)


class HTTPError(RadixKVError):
    """An error that is an HTTP answer of its own (404, 409, 413, ...)."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.kind = status, kind


class ClientDisconnected(Exception):
    """The client went away before its answer was ready (the work for it was cancelled)."""


def error_body(status: int, message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": status}}


def error_response(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(error_body(status, message, kind), status_code=status)


def error_of(e: BaseException) -> tuple[int, str, str]:
    """(status, message, type) of an exception: the core's typed errors mapped at this edge."""
    if isinstance(e, HTTPError):
        return e.status, str(e), e.kind
    if isinstance(e, ValidationError):
        return 400, validation_message(e), "invalid_request_error"
    if isinstance(e, Overloaded):
        return 429, str(e), "rate_limit_error"
    if isinstance(e, LoRAInUse):
        return 409, str(e), "conflict"
    if isinstance(e, RadixKVError):
        kind = kind_of_error(e)
        return STATUS_OF[kind], str(e), TYPE_OF[kind]
    return 500, f"internal error: {type(e).__name__}: {e}", "internal_error"


def validation_message(e: ValidationError) -> str:
    """pydantic's errors as one line a user can act on: which field, what is wrong."""
    parts = []
    for err in e.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "body"
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown field {where!r}")
        elif err["type"] == "missing":
            parts.append(f"missing field {where!r}")
        else:
            parts.append(f"{where}: {err['msg']}")
    more = f" (and {len(e.errors()) - 5} more)" if len(e.errors()) > 5 else ""
    return "; ".join(dict.fromkeys(parts)) + more


# -- request bodies --------------------------------------------------------------------------------
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


async def json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object; 413 past the size limit, 400 when malformed, nested too deeply,
    or holding text that is not Unicode (a lone UTF-16 surrogate)."""
    limit = request.app.state.settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPError(413, f"request body of {declared} bytes exceeds the limit of {limit} bytes (--max-body-bytes)")
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise HTTPError(413, f"request body exceeds the limit of {limit} bytes (--max-body-bytes)")
    try:
        text = body.decode("utf-8")  # strict: encoded surrogates are not UTF-8 (json.loads would pass them)
    except UnicodeDecodeError as e:
        raise HTTPError(400, f"the body is not UTF-8 text: {e}") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise HTTPError(400, "malformed JSON body: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, and numbers past Python's digit limit
        raise HTTPError(400, f"malformed JSON body: {e}") from None
    if not isinstance(data, dict):
        raise HTTPError(400, f"the body must be a JSON object, got {type(data).__name__}")
    check_depth(data, "")  # what walks it later (templates, schema compilers) recurses per level
    if _SURROGATE_ESCAPE.search(text):  # only then can a string hold a lone surrogate
        _check_unicode(data, "")
    return data


def _check_unicode(value: Any, where: str) -> None:
    """400 naming the field of the first string that cannot be UTF-8 (a lone surrogate)."""
    stack = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as e:
                raise HTTPError(400, f"{path or 'body'}: holds {item[e.start]!r} at character {e.start}, a lone "
                                     f"UTF-16 surrogate that is not text; send valid Unicode") from None
        elif isinstance(item, dict):
            stack.extend((v, f"{path}.{k}" if path else str(k)) for k, v in item.items())
            stack.extend((k, f"{path}.<key>" if path else "<key>") for k in item)
        elif isinstance(item, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(item))


async def parse(request: Request, model: type[T]) -> T:
    """The JSON body validated as `model` (a pydantic model that forbids unknown fields)."""
    return model.model_validate(await json_body(request))


BODY_MODELS: dict[str, type[BaseModel]] = {}
"""The request models the OpenAPI document publishes (`radixkv.server.http.app`)."""


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route that reads `model` from its JSON body: the published document
    describes the body the route really takes (the route parses it itself, see `parse`)."""
    BODY_MODELS[model.__name__] = model
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


def principal(request: Request) -> str:
    """Who is asking (`ApiKeyMiddleware`, `radixkv.tenancy.principal_of` of their key), or ''
    when the server has one principal (one key or none). Client-chosen request ids and stored
    responses are scoped to it."""
    return getattr(request.state, "principal", "")


def is_admin(request: Request) -> bool:
    """Whether the asker may act on every tenant: the admin key, or anyone on a server with one
    principal."""
    return getattr(request.state, "admin", True)


def cache_owner(request: Request) -> str:
    """The principal whose cache namespace the request's prefixes live in ('' when shared)."""
    settings: ServerSettings = request.app.state.settings
    return principal(request) if settings.cache_sharing == "per-key" else ""


def viewer(request: Request) -> str | None:
    """Whose cached nodes the asker may see (`radixkv.tenancy.visible`): None for all."""
    return None if is_admin(request) else cache_owner(request)


# -- work off the event loop -----------------------------------------------------------------------
_WORKERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="radixkv-http-work")


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on a worker thread: what a request's body may make slow (tokenizing a large
    batch, rendering a template, compiling its tools' schemas, which release the GIL) never
    holds up the event loop that answers every other request, /health included."""
    return await asyncio.get_running_loop().run_in_executor(_WORKERS, functools.partial(fn, *args))


# -- leaving with the client ---------------------------------------------------------------------
async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result, or `ClientDisconnected` once the client has gone (the work is cancelled,
    which aborts its requests)."""
    task = asyncio.ensure_future(work)

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise ClientDisconnected()
    return task.result()


async def all_or_none(*work: Awaitable[T]) -> list[T]:
    """Every result of `work`, run together; when one fails, the others are cancelled (their
    requests aborted) before its error is raised."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def first_then_rest(request: Request, items: AsyncIterator[T]) -> tuple[T | None, AsyncIterator[T]]:
    """The first item of `items` (waiting for it while watching the client), and an iterator
    over all of them from the first. Awaiting the first before a response starts lets an error
    that comes with it be answered with its HTTP status instead of inside a 200 stream."""
    try:
        first = await until_disconnected(request, items.__anext__())
    except StopAsyncIteration:
        first = None

    async def all_items() -> AsyncIterator[T]:
        if first is not None:
            yield first
            async for item in items:
                yield item

    return first, all_items()
