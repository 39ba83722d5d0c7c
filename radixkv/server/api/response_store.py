"""The Responses API's stored conversations: what `previous_response_id` continues from.

A stored response keeps, beside the response object a client can GET, the conversation as
chat-template messages and the exact token ids the server ran for it: the prompt (`turn_ids`)
and what it generated (`output_ids`). The next turn's prompt starts with those ids, so it is a
token prefix of what the radix cache holds, never a re-tokenisation of the text.

Responses are scoped to the API key that made them (another key's id is unknown, as if it did
not exist) and the store is bounded: at most `max_responses`, at most `max_bytes` of memory (each
response's size estimated when it is stored, `StoredResponse.nbytes`), the oldest going first,
and at most `max_age` seconds old. A response created with `store: false` is never kept, nor
one larger than the whole budget.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from radixkv.errors import ConfigError
from radixkv.server.api.tools import ToolSet

DEFAULT_MAX_RESPONSES = 1024
DEFAULT_MAX_AGE = 3600.0
DEFAULT_MAX_BYTES = 256 << 20
ID_BYTES = 36  # a token id in a Python list: the int and its slot
OBJECT_OVERHEAD = 3  # Python's dicts and strings over their JSON text, about
logger = logging.getLogger(__name__)


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
    def nbytes(self) -> int:
        """Memory it holds, estimated from its JSON text and its token ids."""
        text = json.dumps([self.body, self.instructions, self.history, self.reply], default=str)
        tools = 0 if self.tools is None else len(json.dumps([t.parameters for t in self.tools.tools]))
        return OBJECT_OVERHEAD * (len(text) + tools) + ID_BYTES * (len(self.turn_ids) + len(self.output_ids))

    @property
    def conversation(self) -> list[dict[str, Any]]:
        """Every message so far, the reply last, without the instructions' system message."""
        start = 1 if self.instructions is not None else 0
        return [*self.history[start:], self.reply]


class ResponseStore:
    """Stored responses by (principal, id), bounded in count and age (see the module docstring)."""

    def __init__(self, max_responses: int = DEFAULT_MAX_RESPONSES, max_age: float = DEFAULT_MAX_AGE,
                 clock: Callable[[], float] = time.monotonic, max_bytes: int = DEFAULT_MAX_BYTES):
        if max_responses < 0:
            raise ConfigError(f"--responses-store-size={max_responses}: must be >= 0 (0 stores nothing)")
        if max_age <= 0:
            raise ConfigError(f"--responses-store-ttl={max_age}: must be > 0 seconds")
        if max_bytes < 0:
            raise ConfigError(f"--responses-store-memory={max_bytes} bytes: must be >= 0")
        self.max_responses, self.max_age, self.clock, self.max_bytes = max_responses, max_age, clock, max_bytes
        self._items: OrderedDict[tuple[str, str], tuple[StoredResponse, int]] = OrderedDict()  # -> (item, nbytes)
        self.nbytes = 0

    def __len__(self) -> int:
        self._expire()
        return len(self._items)

    def put(self, principal: str, response_id: str, item: StoredResponse) -> bool:
        """Keep `item` (the oldest others go to make room); whether it was kept."""
        if self.max_responses == 0:
            return False
        size = item.nbytes
        if size > self.max_bytes:
            logger.info("response %s not stored: about %d bytes, more than --responses-store-memory (%d)",
                        response_id, size, self.max_bytes)
            return False
        self.delete(principal, response_id)
        self._items[(principal, response_id)] = (replace(item, created=self.clock()), size)
        self.nbytes += size
        while len(self._items) > self.max_responses or self.nbytes > self.max_bytes:
            self._pop_oldest()
        self._expire()
        assert self.nbytes == sum(s for _, s in self._items.values()), "the store's byte count drifted"
        return True

    def get(self, principal: str, response_id: str) -> StoredResponse | None:
        """The response `principal` stored as `response_id`, if it is still kept."""
        self._expire()
        found = self._items.get((principal, response_id))
        return None if found is None else found[0]

    def delete(self, principal: str, response_id: str) -> bool:
        """Forget a response; whether it was kept."""
        self._expire()
        found = self._items.pop((principal, response_id), None)
        if found is not None:
            self.nbytes -= found[1]
        return found is not None

    def _pop_oldest(self) -> None:
        _, (_, size) = self._items.popitem(last=False)
        self.nbytes -= size

    def _expire(self) -> None:
        oldest = self.clock() - self.max_age
        while self._items and next(iter(self._items.values()))[0].created < oldest:
            self._pop_oldest()
