"""JSON from clients, bounded: how deep a value nests, and JSON text inside a string field
(a tool call's `arguments`, a `json_schema` given as text) parsed under the same bound.

Python's parser and everything that walks a parsed value (a chat template, a schema compiler,
`json.dumps`) recurse once per level, so a value nested a few thousand levels deep raises
`RecursionError` far from the field that held it. Every client value is checked here first:
too deep is an `InvalidRequestError` naming the field, never a 500.
"""

from __future__ import annotations

import json
from typing import Any

from radixkv.errors import InvalidRequestError

_CONTAINER_TYPES = (dict, list)  # what JSON parses objects and arrays into
MAX_DEPTH = 64
"""Deepest nesting of objects and arrays accepted in a request (a body, or JSON text in one of
its fields); real tool schemas and chat messages nest a dozen levels at most."""


def depth_path(value: Any, limit: int = MAX_DEPTH) -> list[str] | None:
    """The path (keys and indices) to the first container nested deeper than `limit`, or None
    when `value` nests `limit` levels or fewer. Iterative: any depth is safe to check. It runs
    on every request body, so it only visits containers (a list of 32k token ids is one pass
    of a comprehension) and spells out a path only for the container it reports."""
    if not isinstance(value, _CONTAINER_TYPES):
        return None
    stack: list[tuple[Any, int, Any]] = [(value, 1, None)]  # (container, depth, (parent's trail, step))
    while stack:
        item, depth, trail = stack.pop()
        if depth > limit:
            path = []
            while trail is not None:
                trail, step = trail
                path.append(step)
            return path[::-1]
        deeper = depth + 1
        if isinstance(item, dict):
            stack.extend((v, deeper, (trail, f".{k}")) for k, v in item.items() if isinstance(v, _CONTAINER_TYPES))
        else:
            stack.extend((v, deeper, (trail, f"[{i}]")) for i, v in enumerate(item) if isinstance(v, _CONTAINER_TYPES))
    return None


def check_depth(value: Any, where: str, limit: int = MAX_DEPTH) -> None:
    """`InvalidRequestError` naming `where` (and the start of the path down) when `value` nests
    deeper than `limit` levels."""
    path = depth_path(value, limit)
    if path is not None:
        raise InvalidRequestError(f"{shown_path(where, path)}: nested more than {limit} levels deep; at most "
                                  f"{limit} levels of objects and arrays are accepted")


def shown_path(where: str, path: list[str], steps: int = 4) -> str:
    """`where` and the first `steps` steps of `path`, the rest elided with how many there are."""
    base = (where + "".join(path[:steps])).lstrip(".") or "body"
    return base if len(path) <= steps else f"{base}... ({len(path)} levels down)"


def loads_bounded(text: str, where: str, limit: int = MAX_DEPTH) -> Any:
    """JSON text from a client's string field, parsed; `InvalidRequestError` naming `where`
    when it is not JSON or nests deeper than `limit`."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise InvalidRequestError(f"{where}: nested more than {limit} levels deep; at most {limit} levels of "
                                  f"objects and arrays are accepted") from None
    except ValueError as e:  # JSONDecodeError, and numbers past Python's digit limit
        raise InvalidRequestError(f"{where}: not valid JSON: {e}") from None
    check_depth(value, where, limit)
    return value
