"""Tool-call formats besides Hermes' (`--tool-call-parser`): calls a model writes in its own
format, read into `ToolCall`s, whole or as the text streams.

    hermes, qwen25, qwen3   <tool_call>{"name": ..., "arguments": {...}}</tool_call>  (`tools.CallStream`)
    mistral                 [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]
    llama3                  {"name": ..., "parameters": {...}} as the whole answer (Llama 3.1's
                            JSON tool calling; `<|python_tag|>` before it and `;` between calls
                            allowed)

`FormatStream` reads the last two: text before the format's start streams as content; from the
start on, the text is held and read at the end (a call arrives whole, as one `tool_calls`
delta). What does not parse as calls of the offered tools is shown as the text it was.
"""

from __future__ import annotations

import json
from typing import Any

from radixkv.server.api.markers import partial_suffix as _partial_suffix
from radixkv.server.api.tool_call import ToolCall, new_call_id

HERMES_FORMATS = ("hermes", "qwen25", "qwen3")
MISTRAL_START = "[TOOL_CALLS]"
PYTHON_TAG = "<|python_tag|>"


class FormatStream:
    """Calls of `tools` (a `ToolSet`) in format `fmt` ("mistral" or "llama3"), as CallStream reads Hermes'."""

    def __init__(self, tools, fmt: str):
        if fmt not in ("mistral", "llama3"):
            raise ValueError(f"no stream reader for tool-call format {fmt!r}")
        self.tools, self.fmt = tools, fmt
        self.buffer, self.inside, self.seen = "", False, False

    def push(self, text: str) -> list[str | ToolCall]:
        if self.inside:
            self.buffer += text
            return []
        self.buffer += text
        if self.fmt == "mistral":
            at = self.buffer.find(MISTRAL_START)
            if at >= 0:
                shown, self.buffer, self.inside = self.buffer[:at], self.buffer[at:], True
                return [shown] if shown else []
            keep = _partial_suffix(self.buffer, MISTRAL_START)
            shown, self.buffer = self.buffer[:len(self.buffer) - keep], self.buffer[len(self.buffer) - keep:]
            return [shown] if shown else []
        # llama3: a call is the whole answer, so only its very start decides
        stripped = self.buffer.lstrip()
        if not stripped:
            return []
        if stripped.startswith(("{", PYTHON_TAG)):
            self.inside = True
            return []
        if PYTHON_TAG.startswith(stripped) and not self.seen:
            return []
        self.seen = True
        shown, self.buffer = self.buffer, ""
        return [shown]

    def finish(self) -> list[str | ToolCall]:
        rest, self.buffer = self.buffer, ""
        if not self.inside:
            return [rest] if rest else []
        calls = read_calls(rest, self.fmt, self.tools)
        return calls if calls else [rest]


def read_calls(text: str, fmt: str, tools) -> list[ToolCall]:
    """The calls `text` (from the format's start) holds, or [] if it is not calls of `tools` only."""
    body = text.strip()
    if fmt == "mistral":
        body = body[len(MISTRAL_START):].strip() if body.startswith(MISTRAL_START) else body
    else:
        body = body[len(PYTHON_TAG):].strip() if body.startswith(PYTHON_TAG) else body
    objects = _json_values(body)
    if objects is None:
        return []
    flat: list[Any] = []
    for value in objects:
        flat.extend(value if isinstance(value, list) else [value])
    calls = []
    for obj in flat:
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return []
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some models write the arguments as JSON text
            try:
                args = json.loads(args)
            except ValueError:
                return []
        if not isinstance(args, dict) or tools.tool(obj["name"]) is None:
            return []
        calls.append(ToolCall(new_call_id(), obj["name"], json.dumps(args)))
    return calls


def _json_values(text: str) -> list[Any] | None:
    """The JSON values `text` is made of (separated by whitespace or `;`), or None."""
    decoder, values, i = json.JSONDecoder(), [], 0
    while i < len(text):
        while i < len(text) and text[i] in " \t\r\n;":
            i += 1
        if i == len(text):
            break
        try:
            value, i = decoder.raw_decode(text, i)
        except ValueError:
            return None
        values.append(value)
    return values or None
