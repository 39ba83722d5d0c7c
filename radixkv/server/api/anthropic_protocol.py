"""Anthropic's Messages API requests: the bodies, and how their content blocks become the
chat-template messages of `radixkv.server.api.conversation`, with their cache breakpoints.

Blocks -> messages:
- `text` blocks of one message join with `BLOCK_JOIN` (a blank line) into its content; a
  string content is one text block. `system` (a string or text blocks) is a system message.
- `tool_use` blocks of an assistant message are its `tool_calls` (`{"id", "type": "function",
  "function": {"name", "arguments": <the input dict>}}`).
- each `tool_result` block of a user message is a `{"role": "tool", "content", "tool_call_id"}`
  message (an `is_error` result's content starts with `ERROR_PREFIX`); the text blocks around
  them are user messages, in order.
- any other block (`image`, `document`, `thinking`, ...) is refused by name.

Cache breakpoints. `cache_control: {"type": "ephemeral", "ttl": "5m" | "1h"}` on a tool, a system
block or a message block asks for the prompt up to the end of that block to stay cached `ttl`
(default 5m); a top-level `cache_control` (automatic caching) marks the last block of the last
message. At most `MAX_BREAKPOINTS`, as Anthropic allows. Each becomes a mark `(partial
conversation, seconds)` for `conversation.breakpoint_retention`: the conversation cut right
after the block (`[]` for a tool: through the tool listing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from radixkv.errors import InvalidRequestError
from radixkv.retention import Retention
from radixkv.server.api.protocol import Strict

BLOCK_JOIN = "\n\n"
ERROR_PREFIX = "Error: "
MAX_BREAKPOINTS = 4
TTLS = ("5m", "1h")
TEXT_FIELDS = {"type", "text", "cache_control", "citations"}
BLOCK_FIELDS = {"text": TEXT_FIELDS, "tool_use": {"type", "id", "name", "input", "cache_control"},
                "tool_result": {"type", "tool_use_id", "content", "is_error", "cache_control"}}
BLOCK_ROLE = {"tool_use": "assistant", "tool_result": "user"}

Message = dict[str, Any]
Mark = tuple[list[Message], float]


class Metadata(Strict):
    user_id: str | None = None  # the end user's id: accepted, informational


class MessageParam(Strict):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class PromptFields(Strict):
    """What makes the prompt: the fields POST /v1/messages and /v1/messages/count_tokens share."""

    model: str
    messages: list[MessageParam]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None  # extended thinking: only {"type": "disabled"}
    cache_control: dict[str, Any] | None = None  # automatic caching: a breakpoint after the last block

    def refuse_features_it_lacks(self) -> None:
        if self.thinking is not None and self.thinking != {"type": "disabled"}:
            raise InvalidRequestError(f"thinking={self.thinking!r}: extended thinking is not supported by this "
                                      f"server (omit it or send {{'type': 'disabled'}})")


class CountTokensBody(PromptFields):
    """POST /v1/messages/count_tokens."""


class MessagesBody(PromptFields):
    """POST /v1/messages (Anthropic's Messages API)."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    stream: bool = False
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None  # one tier here: accepted

    def sampling_dict(self) -> dict[str, Any]:
        """Our `sampling_params` for this body."""
        params: dict[str, Any] = {"max_new_tokens": self.max_tokens}
        for name in ("temperature", "top_p", "top_k"):
            if getattr(self, name) is not None:
                params[name] = getattr(self, name)
        for i, stop in enumerate(self.stop_sequences or []):
            if not stop:
                raise InvalidRequestError(f"stop_sequences[{i}]: must be a non-empty string")
        if self.stop_sequences:
            params["stop"] = list(self.stop_sequences)
        return params


@dataclass(frozen=True)
class Conversation:
    """A request's prompt as chat-template messages, its cache breakpoints as marks for
    `conversation.breakpoint_retention`, and whether the last message (an assistant's) is
    continued rather than answered (Anthropic's prefill)."""

    messages: list[Message]
    marks: list[Mark]
    prefill: bool


def cache_seconds(cache_control: Any, where: str) -> float:
    """Seconds a `cache_control` asks for; 400 naming `where` when it is not Anthropic's shape."""
    if not isinstance(cache_control, dict):
        raise InvalidRequestError(f"{where}: must be an object {{'type': 'ephemeral', 'ttl'?: '5m' | '1h'}}")
    unknown = sorted(set(cache_control) - {"type", "ttl"})
    if unknown:
        raise InvalidRequestError(f"{where}: unknown field(s) {unknown}")
    if cache_control.get("type") != "ephemeral":
        raise InvalidRequestError(f"{where}.type={cache_control.get('type')!r}: must be 'ephemeral'")
    ttl = cache_control.get("ttl", "5m")
    if ttl not in TTLS:
        raise InvalidRequestError(f"{where}.ttl={ttl!r}: must be one of {list(TTLS)}")
    return Retention.named(ttl, f"{where}.ttl")


def text_of(block: Any, where: str) -> str:
    """The text of a `text` block, checked."""
    if not isinstance(block, dict) or block.get("type") != "text":
        kind = block.get("type") if isinstance(block, dict) else type(block).__name__
        raise InvalidRequestError(f"{where}.type={kind!r}: only text blocks are supported here")
    unknown = sorted(set(block) - TEXT_FIELDS)
    if unknown:
        raise InvalidRequestError(f"{where}: unknown field(s) {unknown}")
    if not isinstance(block.get("text"), str):
        raise InvalidRequestError(f"{where}.text: required, a string")
    if block.get("citations"):
        raise InvalidRequestError(f"{where}.citations: not supported by this server (send null)")
    return block["text"]


def check_block(block: Any, role: str, where: str) -> dict[str, Any]:
    """A message's content block, checked for `role`; 400 naming `where` otherwise."""
    kind = block.get("type") if isinstance(block, dict) else None
    if kind not in BLOCK_FIELDS:
        shown = kind if isinstance(block, dict) else type(block).__name__
        raise InvalidRequestError(f"{where}.type={shown!r}: not supported by this server (it takes text, "
                                  f"tool_use and tool_result blocks)")
    if BLOCK_ROLE.get(kind, role) != role:
        raise InvalidRequestError(f"{where}: a {kind} block belongs in a message of role {BLOCK_ROLE[kind]!r}")
    unknown = sorted(set(block) - BLOCK_FIELDS[kind])
    if unknown:
        raise InvalidRequestError(f"{where}: unknown field(s) {unknown}")
    if kind == "text":
        text_of(block, where)
    elif kind == "tool_use":
        for name, typ in (("id", str), ("name", str), ("input", dict)):
            if not isinstance(block.get(name), typ):
                raise InvalidRequestError(f"{where}.{name}: required, {'an object' if typ is dict else 'a string'}")
    else:
        if not isinstance(block.get("tool_use_id"), str):
            raise InvalidRequestError(f"{where}.tool_use_id: required, the id of the tool_use it answers")
        if not isinstance(block.get("is_error", False), bool):
            raise InvalidRequestError(f"{where}.is_error: must be a boolean")
        tool_result_text(block, where)
    return block


def tool_result_text(block: dict[str, Any], where: str) -> str:
    content = block.get("content", "")
    if isinstance(content, list):
        content = BLOCK_JOIN.join(text_of(b, f"{where}.content[{i}]") for i, b in enumerate(content))
    elif not isinstance(content, str):
        raise InvalidRequestError(f"{where}.content: must be a string or a list of text blocks")
    return ERROR_PREFIX + content if block.get("is_error") else content


def block_messages(role: str, blocks: list[dict[str, Any]]) -> list[Message]:
    """The chat-template messages of one message's (checked) blocks (see the module docstring)."""
    if role == "assistant":
        texts = [b["text"] for b in blocks if b["type"] == "text"]
        calls = [{"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": b["input"]}}
                 for b in blocks if b["type"] == "tool_use"]
        return [{"role": "assistant", "content": BLOCK_JOIN.join(texts), **({"tool_calls": calls} if calls else {})}]
    out: list[Message] = []
    texts: list[str] = []
    for b in blocks:
        if b["type"] == "text":
            texts.append(b["text"])
            continue
        if texts:
            out.append({"role": "user", "content": BLOCK_JOIN.join(texts)})
            texts = []
        out.append({"role": "tool", "content": tool_result_text(b, ""), "tool_call_id": b["tool_use_id"]})
    if texts:
        out.append({"role": "user", "content": BLOCK_JOIN.join(texts)})
    return out


def conversation_of(body: PromptFields) -> Conversation:
    """The body's system, messages and breakpoints as a `Conversation`; 400 naming the field at
    fault (a block this server does not take, a bad `cache_control`, too many breakpoints)."""
    if not body.messages:
        raise InvalidRequestError("messages: must hold at least one message")
    marks: list[Mark] = []
    for i, tool in enumerate(body.tools or []):
        if isinstance(tool, dict) and "cache_control" in tool:
            marks.append(([], cache_seconds(tool["cache_control"], f"tools[{i}].cache_control")))
    messages: list[Message] = []
    if isinstance(body.system, str):
        messages = [{"role": "system", "content": body.system}] if body.system else []
    elif body.system:
        texts = []
        for j, block in enumerate(body.system):
            texts.append(text_of(block, f"system[{j}]"))
            if "cache_control" in block:
                seconds = cache_seconds(block["cache_control"], f"system[{j}].cache_control")
                marks.append(([{"role": "system", "content": BLOCK_JOIN.join(texts)}], seconds))
        messages = [{"role": "system", "content": BLOCK_JOIN.join(texts)}]
    call_ids: set[str] = set()  # the tool_use ids so far: a tool_result answers one of them
    for i, message in enumerate(body.messages):
        where = f"messages[{i}].content"
        if isinstance(message.content, str):
            messages.append({"role": message.role, "content": message.content})
            continue
        if not message.content:
            raise InvalidRequestError(f"{where}: must hold at least one block")
        blocks = [check_block(b, message.role, f"{where}[{j}]") for j, b in enumerate(message.content)]
        for j, block in enumerate(blocks):
            if block["type"] == "tool_result" and block["tool_use_id"] not in call_ids:
                raise InvalidRequestError(f"{where}[{j}].tool_use_id={block['tool_use_id'][:80]!r}: no tool_use "
                                          f"block before it has this id (a tool_result answers a tool_use)")
        call_ids.update(b["id"] for b in blocks if b["type"] == "tool_use")
        for j, block in enumerate(blocks):
            if "cache_control" in block:
                seconds = cache_seconds(block["cache_control"], f"{where}[{j}].cache_control")
                marks.append(([*messages, *block_messages(message.role, blocks[: j + 1])], seconds))
        messages += block_messages(message.role, blocks)
    if body.cache_control is not None:
        marks.append((list(messages), cache_seconds(body.cache_control, "cache_control")))
    if len(marks) > MAX_BREAKPOINTS:
        raise InvalidRequestError(f"cache_control: at most {MAX_BREAKPOINTS} blocks may carry it (cache "
                                  f"breakpoints), this request has {len(marks)}")
    prefill = body.messages[-1].role == "assistant"
    if prefill and messages[-1].get("tool_calls"):
        raise InvalidRequestError(f"messages[{len(body.messages) - 1}]: the last message is the assistant's, whose "
                                  f"text is continued; it cannot hold tool_use blocks")
    return Conversation(messages, marks, prefill)
