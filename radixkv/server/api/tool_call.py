"""A tool call the model made (`ToolCall`), and the ids calls get: shared by every reader of calls
(`tools.CallStream`, `tool_parsers.FormatStream`) and the APIs that return them."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """A call the model made: `arguments` is JSON text (an object), as the APIs return it. A
    call the output ended inside (`complete` false: cut by max_tokens) has the arguments as far
    as they came, as OpenAI returns them; its `arguments_dict` is empty."""

    id: str
    name: str
    arguments: str
    complete: bool = True

    @property
    def arguments_dict(self) -> dict[str, Any]:
        return json.loads(self.arguments) if self.complete else {}

    def to_message(self) -> dict[str, Any]:
        """As an assistant message's `tool_calls` entry for a chat template."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments_dict}}


def new_call_id(prefix: str = "call_") -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"
