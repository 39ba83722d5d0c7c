"""A conversation as token ids, for the agent-facing APIs: rendering it with its tools, where in
its tokens a cache breakpoint falls, and continuing a stored conversation from the exact tokens
the server produced.

Messages are the dicts chat templates take (see `radixkv.server.api.tools`). Every function here
renders through the model's chat template (`Tokenizer.render_chat`), so what it says about
positions holds for the ids `render_ids` returns.
"""

from __future__ import annotations

import json
from typing import Any

from radixkv.server.api.tools import CALL_CLOSE, CALL_OPEN, ToolSet
from radixkv.tokenizer import Tokenizer


def _template_args(tokenizer: Tokenizer, messages: list[dict[str, Any]], tools: ToolSet | None
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) as the template takes them: a template that renders tools gets them
    as they are; any other gets `fallback_messages` (tools in a system message, calls as text)."""
    if tokenizer.takes_tools:
        listed = [t.to_template() for t in tools.tools] if tools is not None and tools.tools else None
        return [_content_str(m) for m in messages], listed
    return [_content_str(m) for m in fallback_messages(messages, tools)], None


def _content_str(message: dict[str, Any]) -> dict[str, Any]:
    return message if message.get("content") is not None else {**message, "content": ""}


def render_ids(tokenizer: Tokenizer, messages: list[dict[str, Any]], tools: ToolSet | None = None, *,
               add_generation_prompt: bool = True, continue_final_message: bool = False,
               template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """Token ids of `messages` (and the tools offered) through the chat template."""
    msgs, listed = _template_args(tokenizer, messages, tools)
    return tokenizer.apply_chat_template(msgs, add_generation_prompt, continue_final_message, template_kwargs,
                                         listed)


def render_text(tokenizer: Tokenizer, messages: list[dict[str, Any]], tools: ToolSet | None = None, *,
                add_generation_prompt: bool = True, template_kwargs: dict[str, Any] | None = None) -> str:
    msgs, listed = _template_args(tokenizer, messages, tools)
    return tokenizer.render_chat(msgs, add_generation_prompt, False, template_kwargs, listed)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def breakpoint_tokens(tokenizer: Tokenizer, full_ids: list[int], partial: list[dict[str, Any]],
                      tools: ToolSet | None, template_kwargs: dict[str, Any] | None = None) -> int:
    """How many of `full_ids` (a rendered conversation) hold a part of it: `partial` is the
    conversation cut right after the part (a cache breakpoint: the messages before it and the
    breakpoint's message with its content up to the marked block). The part ends where the two
    renderings stop agreeing, so a boundary the tokenizer merges across is never counted in."""
    if not partial:  # a breakpoint on the tools alone: the prompt up to the first message's text
        partial = [{"role": "user", "content": "\x00"}]
    cut = render_ids(tokenizer, partial, tools, add_generation_prompt=False, template_kwargs=template_kwargs)
    return common_prefix(cut, full_ids)


def continue_ids(tokenizer: Tokenizer, history: list[dict[str, Any]], turn_ids: list[int], output_ids: list[int],
                 reply: dict[str, Any], new_messages: list[dict[str, Any]], tools: ToolSet | None,
                 template_kwargs: dict[str, Any] | None = None) -> list[int] | None:
    """The next prompt of a stored conversation, as `turn_ids + output_ids + the rest`: the
    exact tokens the server ran for the previous turn (its prompt, `turn_ids`, then what it
    generated, `output_ids`), so the new turn's prompt is a token prefix hit by construction.

    `history` rendered is `turn_ids`; `reply` is the assistant message the output became;
    `new_messages` follow it. The rest is the text the template puts after the generated
    tokens (the end of the assistant's turn, unless the model already wrote it) and before the
    next generation. None when the template does not render the conversation as a continuation
    of what was generated (it rewrites earlier turns, or the output is not what it would render
    for `reply`): the caller renders the whole conversation instead."""
    before = render_text(tokenizer, history, tools, template_kwargs=template_kwargs)
    closed = render_text(tokenizer, [*history, reply], tools, add_generation_prompt=False,
                         template_kwargs=template_kwargs)
    after = render_text(tokenizer, [*history, reply, *new_messages], tools, template_kwargs=template_kwargs)
    generated = tokenizer.decode(output_ids, skip_special_tokens=False)
    if not (closed.startswith(before) and after.startswith(closed)):
        return None
    turn = closed[len(before):]  # the assistant's turn as the template writes it
    if not turn.startswith(generated):
        return None
    rest = turn[len(generated):] + after[len(closed):]
    return [*turn_ids, *output_ids, *tokenizer.encode_segment(rest)]


def breakpoint_retention(tokenizer: Tokenizer, full_ids: list[int],
                         marks: list[tuple[list[dict[str, Any]], float]], tools: ToolSet | None,
                         template_kwargs: dict[str, Any] | None = None):
    """A `Retention` keeping, for each cache breakpoint `(partial conversation, seconds)` (see
    `breakpoint_tokens`), the prompt up to it that long. None without breakpoints."""
    from radixkv.retention import Retention

    if not marks:
        return None
    spans = tuple((breakpoint_tokens(tokenizer, full_ids, partial, tools, template_kwargs), seconds)
                  for partial, seconds in marks)
    return Retention(spans)


FALLBACK_HEADER = (
    "# Tools\n\n"
    "You can call the functions below to help with the user's request. Each is described by a "
    "JSON object with its name, what it does and the JSON schema of its arguments:\n"
)
FALLBACK_FOOTER = (
    "\nTo call a function, answer with one block per call, each holding a JSON object with the "
    "function's name and its arguments:\n"
    f"{CALL_OPEN}\n{{\"name\": \"<function name>\", \"arguments\": {{<arguments as JSON>}}}}\n{CALL_CLOSE}"
)


# -- the prompt of a template without tools ----------------------------------------------------------------------------------
def fallback_messages(messages: list[dict[str, Any]], tools: ToolSet | None) -> list[dict[str, Any]]:
    """`messages` as a template without tool support can render them (see the module docstring)."""
    out: list[dict[str, Any]] = []
    if tools is not None and tools.tools:
        listing = "\n".join(json.dumps(t.to_template()["function"], ensure_ascii=False) for t in tools.tools)
        block = FALLBACK_HEADER + listing + "\n" + FALLBACK_FOOTER
        if messages and messages[0]["role"] == "system":
            block += "\n\n" + messages[0]["content"]
            messages = messages[1:]
        out.append({"role": "system", "content": block})
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            parts = [m["content"]] if m.get("content") else []
            parts += [f"{CALL_OPEN}\n{json.dumps({'name': c['function']['name'], 'arguments': c['function']['arguments']}, ensure_ascii=False)}\n{CALL_CLOSE}"
                      for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join(parts)})
        elif m["role"] == "tool":
            response = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + response
            else:
                out.append({"role": "user", "content": response, "_tool_results": True})
        else:
            out.append({k: v for k, v in m.items() if k in ("role", "content", "name")})
    for m in out:
        m.pop("_tool_results", None)
    return out
