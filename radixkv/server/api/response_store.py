"""The Responses API's stored conversations: what `previous_response_id` continues from.

A stored response keeps, beside the response object a client can GET, the conversation as
chat-template messages and the exact token ids the server ran for it: the prompt (`turn_ids`)
and what it generated (`output_ids`). The next turn's prompt starts with those ids, so it is a
token prefix of what the radix cache holds, never a re-tokenisation of the text.

Responses are scoped to the API key that made them (another key's id is unknown, as if it did
not exist) and the store is bounded: at most `max_responses` (the oldest go first) and at most
`max_age` seconds old. A response created with `store: false` is never kept.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from radixkv.errors import ConfigError
from radixkv.server.api.tools import ToolSet

DEFAULT_MAX_RESPONSES = 1024
DEFAULT_MAX_AGE = 3600.0


@dataclass(frozen=True)
class StoredResponse:
    """One response and the state its continuation needs."""

    body: dict[str, Any]  # the response object, as GET returns it
    instructions: str | None
    tools: ToolSet | None
    history: list[dict[str, Any]]  # the messages its prompt rendered (instructions first, if any)
    reply: dict[str, Any]  # the assistant message its output became
    turn_ids: list[int]  # the prompt's token ids
    output_ids: list[int]  # the generated token ids
    created: float = field(default_factory=time.monotonic)

    @property
    def conversation(self) -> list[dict[str, Any]]:
        """Every message so far, the reply last, without the instructions' system message."""
        start = 1 if self.instructions is not None else 0
        return [*self.history[start:], self.reply]


class ResponseStore:
    """Stored responses by (principal, id), bounded in count and age (see the module docstring)."""

    def __init__(self, max_responses: int = DEFAULT_MAX_RESPONSES, max_age: float = DEFAULT_MAX_AGE,
                 clock: Callable[[], float] = time.monotonic):
        if max_responses < 0:
            raise ConfigError(f"--responses-store-size={max_responses}: must be >= 0 (0 stores nothing)")
        if max_age <= 0:
            raise ConfigError(f"--responses-store-ttl={max_age}: must be > 0 seconds")
        self.max_responses, self.max_age, self.clock = max_responses, max_age, clock
        self._items: OrderedDict[tuple[str, str], StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        self._expire()
        return len(self._items)

    def put(self, principal: str, response_id: str, item: StoredResponse) -> None:
        if self.max_responses == 0:
            return
        item = replace(item, created=self.clock())
        self._items.pop((principal, response_id), None)
        self._items[(principal, response_id)] = item
        while len(self._items) > self.max_responses:
            self._items.popitem(last=False)
        self._expire()

    def get(self, principal: str, response_id: str) -> StoredResponse | None:
        """The response `principal` stored as `response_id`, if it is still kept."""
        self._expire()
        return self._items.get((principal, response_id))

    def delete(self, principal: str, response_id: str) -> bool:
        """Forget a response; whether it was kept."""
        self._expire()
        return self._items.pop((principal, response_id), None) is not None

    def _expire(self) -> None:
        oldest = self.clock() - self.max_age
        while self._items:
            key, item = next(iter(self._items.items()))
            if item.created >= oldest:
                return
            del self._items[key]
