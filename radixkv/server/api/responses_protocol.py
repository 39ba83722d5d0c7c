"""The Responses API's request body and its input items, as chat-template messages.

`input` is text (one user message) or a list of items:

    {"role": "user" | "system" | "developer" | "assistant", "content": str | [parts]}   a message
        (parts: {"type": "input_text" | "output_text", "text", "prompt_cache_breakpoint"?})
    {"type": "function_call", "call_id", "name", "arguments"}                         a call made
    {"type": "function_call_output", "call_id", "output"}                             its result

A part's `prompt_cache_breakpoint` (`{"mode": "explicit", "ttl"?: "30m" | "12h"}`) marks the end
of a prefix to keep cached (`radixkv.retention`): `input_messages` returns each mark as the
conversation cut right after that part, for `conversation.breakpoint_retention`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from radixkv.errors import InvalidRequestError
from radixkv.retention import Retention
from radixkv.sampling_params import SEED_MAX, SEED_MIN
from radixkv.server.api.protocol import (
    Strict,
    check_metadata,
    json_arguments,
    refuse_if_on,
    response_format_schema,
)

DEFAULT_BREAKPOINT_TTL = "30m"
ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
TEXT_PARTS = ("input_text", "output_text", "text")


class CacheOptions(Strict):
    """`prompt_cache_options`: `ttl` is how long each breakpoint is kept (here: retained)."""

    mode: Literal["implicit", "explicit"] = "implicit"
    ttl: Literal["30m", "12h"] = "30m"
    prewarm: bool = False  # cache the prompt, generate nothing
    comparison_response_id: str | None = None  # diagnostics: answered "unavailable" here


class ResponsesBody(Strict):
    """POST /v1/responses (OpenAI's fields; those this server lacks are refused when set)."""

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None  # include_obfuscation: no obfuscation is added here
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None  # {"format": {"type": "text" | "json_object" | "json_schema", ...}}
    store: bool = True
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prompt_cache_options: CacheOptions | None = None
    cache_salt: str | None = None  # vLLM's and SGLang's namespace (see tenancy.salt_namespace)
    truncation: Literal["disabled"] | None = None  # "auto" would drop turns; refused
    service_tier: Literal["auto", "default"] | None = None
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)  # an extension, as in vLLM
    include: list[str] | None = None  # nothing extra to include: accepted empty only
    # features this server lacks: accepted only when off
    background: bool = False
    conversation: Any = None
    reasoning: dict[str, Any] | None = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None
    prompt: Any = None

    def refuse_features_it_lacks(self) -> None:
        refuse_if_on(self, ("background", "conversation", "top_logprobs", "max_tool_calls", "prompt", "include"))
        check_metadata(self.metadata)
        if self.reasoning and any(v is not None for v in self.reasoning.values()):
            raise InvalidRequestError(f"reasoning={self.reasoning!r}: this server runs no reasoning models "
                                      f"(accepted only empty or null)")

    def json_schema(self) -> dict[str, Any] | None:
        """`text.format` as the JSON schema to constrain the output to (None: free text)."""
        fmt = (self.text or {}).get("format")
        if fmt is None:
            return None
        if not isinstance(fmt, dict):
            raise InvalidRequestError("text.format: must be an object with a type")
        if fmt.get("type") == "json_schema":  # flat here; chat's response_format nests it
            if not isinstance(fmt.get("schema"), dict):
                raise InvalidRequestError("text.format.schema: required, a JSON schema object")
            return fmt["schema"]
        try:
            return response_format_schema(fmt)
        except InvalidRequestError as e:
            raise InvalidRequestError(str(e).replace("response_format", "text.format")) from None


def input_messages(value: str | list[dict[str, Any]], default_ttl: str = DEFAULT_BREAKPOINT_TTL
                   ) -> tuple[list[dict[str, Any]], list[tuple[int, dict[str, Any], float]]]:
    """(messages, breakpoint marks) of `input`. A mark is `(message index, that message cut after
    the marked part, seconds)`: the conversation up to a mark is `messages[:i] + [cut]`."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}], []
    if not value:
        raise InvalidRequestError("input: must not be empty")
    messages: list[dict[str, Any]] = []
    marks: list[tuple[int, dict[str, Any], float]] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequestError(f"{where}: must be an object (a message or an item)")
        kind = item.get("type", "message")
        if kind == "message":
            role = ROLES.get(item.get("role"))
            if role is None:
                raise InvalidRequestError(f"{where}.role={item.get('role')!r}: must be one of {sorted(ROLES)}")
            text, cuts = _message_text(item.get("content"), f"{where}.content", default_ttl)
            message = {"role": role, "content": text}
            marks += [(len(messages), {"role": role, "content": cut}, seconds) for cut, seconds in cuts]
            messages.append(message)
        elif kind == "function_call":
            for name in ("call_id", "name", "arguments"):
                if not isinstance(item.get(name), str):
                    raise InvalidRequestError(f"{where}.{name}: required, a string")
            call = {"id": item["call_id"], "type": "function", "function": {
                "name": item["name"], "arguments": json_arguments(item["arguments"], f"{where}.arguments")}}
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise InvalidRequestError(f"{where}.call_id: required, the call_id of the call it answers")
            output = item.get("output")
            if isinstance(output, list):
                output, _ = _message_text(output, f"{where}.output", default_ttl)
            if not isinstance(output, str):
                raise InvalidRequestError(f"{where}.output: must be a string or text parts")
            messages.append({"role": "tool", "content": output, "tool_call_id": item["call_id"]})
        else:
            raise InvalidRequestError(f"{where}.type={kind!r}: supported items are message, function_call and "
                                      f"function_call_output")
    return messages, marks


def _message_text(content: Any, where: str, default_ttl: str) -> tuple[str, list[tuple[str, float]]]:
    """A message's text, and for each part with a breakpoint the text up to its end."""
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        raise InvalidRequestError(f"{where}: must be a string or a list of text parts")
    text, cuts = "", []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise InvalidRequestError(f"{where}[{j}].type={kind!r}: only text parts ({', '.join(TEXT_PARTS)}) "
                                      f"are supported")
        if not isinstance(part.get("text"), str):
            raise InvalidRequestError(f"{where}[{j}].text: required, a string")
        text += part["text"]
        mark = part.get("prompt_cache_breakpoint")
        if mark is not None:
            if not isinstance(mark, dict) or mark.get("mode", "explicit") != "explicit":
                raise InvalidRequestError(f"{where}[{j}].prompt_cache_breakpoint: must be {{\"mode\": \"explicit\", "
                                          f"\"ttl\"?: \"30m\" | \"12h\"}}")
            ttl = mark.get("ttl", default_ttl)
            cuts.append((text, Retention.named(ttl, f"{where}[{j}].prompt_cache_breakpoint.ttl")))
    return text, cuts
