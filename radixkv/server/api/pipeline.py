"""What every API's request pipeline shares: the model a request names, a forced tool call's
grammar, and a stream that starts only once its first chunk came."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, TypeVar

from fastapi import Request

from radixkv.errors import InvalidRequestError
from radixkv.server.api.tools import ToolSet
from radixkv.server.http.common import HTTPError, first_then_rest

T = TypeVar("T")


def check_model(request: Request, name: str) -> None:
    settings, manager = request.app.state.settings, request.app.state.manager
    if name not in (settings.model_name, manager.info["model_dir"]):
        raise HTTPError(404, f"model {name!r} does not exist; this server serves {settings.model_name!r} "
                             f"(see GET /v1/models)", "not_found")


def with_call_grammar(params: dict[str, Any], tools: ToolSet) -> dict[str, Any]:
    """`params` constrained to the tools' call grammar (`tool_choice` required or named)."""
    given = [name for name in ("regex", "json_schema", "ebnf") if name in params]
    if given:
        raise InvalidRequestError(f"tool_choice={tools.choice.mode!r} constrains the output to a tool call; it "
                                  f"cannot be combined with {given[0] if given[0] != 'json_schema' else 'response_format'}")
    return {**params, "ebnf": tools.grammar()}


async def started(request: Request, chunks: AsyncIterator[T]) -> AsyncIterator[T]:
    """`chunks` once the first has come: a request that fails at once is an HTTP error, not a
    200 stream holding one."""
    try:
        _, rest = await first_then_rest(request, chunks)
    except BaseException:
        await chunks.aclose()
        raise
    return rest
