"""Tool calling, written once for the three APIs that offer it (OpenAI chat completions, OpenAI
Responses, Anthropic Messages): the tools a request offers, how they reach the prompt, the
grammar that forces a call, and reading calls back out of the generated text.

Each API converts its own shapes into `Tool`, `ToolChoice` and `ToolSet`; messages in the
history are the dicts Hugging Face chat templates take (`{"role": "assistant", "content": ...,
"tool_calls": [{"id", "type": "function", "function": {"name", "arguments": {...}}}]}`,
`{"role": "tool", "content": ..., "tool_call_id": ..., "name": ...}`).

Call format: Hermes-style, the format of Qwen's, Hermes' and many other templates:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Prompt. A chat template that takes `tools` (`Tokenizer.takes_tools`) renders them and the
tool messages itself. For one that does not (SmolLM2's, Gemma's), `fallback_messages` writes a
documented fallback: a system message listing the tools as JSON with the call format above
(the conversation's own system text follows it), assistant calls rendered as `<tool_call>`
blocks, and each run of tool results as one user message of `<tool_response>` blocks. The tools
come first, so every request offering the same tools shares that prefix in the cache.

Choice. `auto`: the model may call; its text is parsed for calls (`parse_calls`, or
`CallStream` while streaming). `none`: the tools are still in the prompt (the same cached prefix
as `auto`) and the text is not parsed. `required` and a named function: the output is generated
under `ToolSet.grammar()` (EBNF built with xgrammar from the tools' JSON schemas: one
`<tool_call>` block, or several with `parallel`), so the arguments always parse and match their
schema.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from radixkv.errors import InvalidRequestError

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_TOOLS = 128

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


@dataclass(frozen=True)
class Tool:
    """A function the model may call: `parameters` is the JSON schema of its arguments (an object)."""

    name: str
    description: str
    parameters: dict[str, Any]

    def to_template(self) -> dict[str, Any]:
        """As chat templates (and OpenAI) describe it."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolChoice:
    mode: Literal["auto", "none", "required", "function"] = "auto"
    name: str | None = None  # the function `mode="function"` forces


@dataclass(frozen=True)
class ToolCall:
    """A call the model made: `arguments` is JSON text (an object), as the APIs return it."""

    id: str
    name: str
    arguments: str

    @property
    def arguments_dict(self) -> dict[str, Any]:
        return json.loads(self.arguments)

    def to_message(self) -> dict[str, Any]:
        """As an assistant message's `tool_calls` entry for a chat template."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments_dict}}


def new_call_id(prefix: str = "call_") -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def check_tool(name: Any, description: Any, parameters: Any, where: str, schema_field: str = "parameters") -> Tool:
    """A `Tool` from an API's fields; `InvalidRequestError` naming `where` (e.g. `tools[0]`)
    when the name, description or schema is not usable (the schema is parsed into a grammar
    and checked to have finite outputs, as a request's json_schema is). `schema_field` is the
    schema's name in the API at hand (OpenAI `parameters`, Anthropic `input_schema`)."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise InvalidRequestError(f"{where}.name={name!r}: must be 1-64 letters, digits, '_' or '-'")
    if description is not None and not isinstance(description, str):
        raise InvalidRequestError(f"{where}.description: must be a string")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    field = f"{where}.{schema_field}"
    if not isinstance(parameters, dict):
        raise InvalidRequestError(f"{field}: must be a JSON schema object, got {type(parameters).__name__}")
    if parameters.get("type", "object") != "object":
        raise InvalidRequestError(f"{field}.type={parameters.get('type')!r}: a function's arguments "
                                  f"are a JSON object (type 'object')")
    _schema_grammar(parameters, field)
    return Tool(name, description or "", parameters)


def _schema_grammar(schema: dict[str, Any], where: str):
    """xgrammar's grammar of `schema`; 400 naming `where` if it is not a usable JSON schema."""
    import xgrammar as xgr

    from radixkv.constrained.analysis import check_grammar
    from radixkv.grammar_spec import MAX_GRAMMAR_CHARS, grammar_error_reason

    try:
        text = json.dumps(schema)
    except (TypeError, ValueError, RecursionError) as e:
        raise InvalidRequestError(f"{where}: not JSON: {e}") from None
    if len(text) > MAX_GRAMMAR_CHARS:
        raise InvalidRequestError(f"{where}: {len(text)} characters, more than the {MAX_GRAMMAR_CHARS} accepted")
    try:
        grammar = xgr.Grammar.from_json_schema(text, any_whitespace=False)
    except Exception as e:  # noqa: BLE001 - xgrammar raises several types for bad input
        raise InvalidRequestError(f"{where}: invalid JSON schema: {grammar_error_reason(e)}") from None
    verdict = check_grammar(grammar.serialize_json())
    if verdict.problem is not None:
        raise InvalidRequestError(f"{where}: {verdict.problem}")
    return grammar


@dataclass(frozen=True)
class ToolSet:
    """The tools one request offers, how it lets the model use them, and whether calls may be parallel."""

    tools: tuple[Tool, ...]
    choice: ToolChoice = ToolChoice()
    parallel: bool = True

    def __post_init__(self) -> None:
        names = [t.name for t in self.tools]
        if len(names) > MAX_TOOLS:
            raise InvalidRequestError(f"tools: at most {MAX_TOOLS} tools, got {len(names)}")
        duplicate = next((n for n in names if names.count(n) > 1), None)
        if duplicate is not None:
            raise InvalidRequestError(f"tools: the name {duplicate!r} is given twice")
        if self.choice.mode == "function" and self.choice.name not in names:
            raise InvalidRequestError(f"tool_choice names {self.choice.name!r}, which is not one of the tools "
                                      f"{names}")
        if self.choice.mode in ("required", "function") and not self.tools:
            raise InvalidRequestError(f"tool_choice={self.choice.mode!r} needs at least one tool")

    @property
    def parses_calls(self) -> bool:
        """Whether the output is read for calls (every choice but `none`)."""
        return self.choice.mode != "none" and bool(self.tools)

    @property
    def forced(self) -> bool:
        """Whether the output must be a call (generated under `grammar`)."""
        return self.choice.mode in ("required", "function")

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def grammar(self) -> str:
        """EBNF of the output `required` / a named function allows: `<tool_call>` blocks (one, or
        one or more separated by newlines when `parallel` and not named), each a JSON object
        {"name": <a tool's name>, "arguments": <its schema>}."""
        import xgrammar as xgr

        chosen = [self.tool(self.choice.name)] if self.choice.mode == "function" else list(self.tools)
        calls = [_schema_grammar({"type": "object", "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                                  "required": ["name", "arguments"], "additionalProperties": False},
                                 f"tools[{self.tools.index(t)}].parameters") for t in chosen]
        body = calls[0] if len(calls) == 1 else xgr.Grammar.union(*calls)
        one = xgr.Grammar.concat(xgr.Grammar.from_ebnf(f"root ::= {json.dumps(CALL_OPEN + chr(10))}"), body,
                                 xgr.Grammar.from_ebnf(f"root ::= {json.dumps(chr(10) + CALL_CLOSE)}"))
        text = str(one)
        if not self.parallel or self.choice.mode == "function":
            return text
        renamed, n = re.subn(r"^root ::= ", "tool_call ::= ", text, count=1, flags=re.MULTILINE)
        assert n == 1, "xgrammar's grammar text starts with its root rule"
        return renamed + '\nroot ::= tool_call ("\\n" tool_call)*\n'

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content, calls) of a finished output; content is None when only calls remain."""
        if not self.parses_calls:
            return text, []
        stream = CallStream(self)
        events = stream.push(text) + stream.finish()
        content = "".join(e for e in events if isinstance(e, str)).strip()
        calls = [e for e in events if isinstance(e, ToolCall)]
        return (content or None) if calls else text, calls


def parse_call(block: str, tools: ToolSet) -> ToolCall | None:
    """The call a `<tool_call>` block's body holds, or None if it is not a call of one of the tools."""
    try:
        obj = json.loads(block)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or tools.tool(obj.get("name")) is None:
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(new_call_id(), obj["name"], json.dumps(arguments, ensure_ascii=False))


class CallStream:
    """Reads calls out of text as it streams: `push(text)` and `finish()` return what can be
    shown, in order: text (str, content) and `ToolCall`s. Text that may start a `<tool_call>`
    is held back until it is known not to; a block's text is held until it closes (a block that
    does not hold a call of one of the tools is shown as text). Whitespace after a call is held
    too, and dropped if only calls and whitespace follow (the separator between calls)."""

    def __init__(self, tools: ToolSet):
        self.tools, self.buffer, self.inside, self.called = tools, "", False, False

    def push(self, text: str) -> list[str | ToolCall]:
        self.buffer += text
        out: list[str | ToolCall] = []
        while True:
            if not self.inside:
                at = self.buffer.find(CALL_OPEN)
                if at < 0:
                    keep = _partial_suffix(self.buffer, CALL_OPEN)
                    shown = self.buffer[: len(self.buffer) - keep]
                    if self.called and not shown.strip():
                        return out  # maybe the separator before another call: hold it
                    if shown:
                        out.append(shown)
                        self.buffer, self.called = self.buffer[len(shown):], False
                    return out
                before = self.buffer[:at]
                if before and not (self.called and not before.strip()):
                    out.append(before)
                self.buffer, self.inside = self.buffer[at:], True
            end = self.buffer.find(CALL_CLOSE)
            if end < 0:
                return out
            block = self.buffer[: end + len(CALL_CLOSE)]
            self.buffer, self.inside = self.buffer[end + len(CALL_CLOSE):], False
            call = parse_call(block[len(CALL_OPEN): -len(CALL_CLOSE)].strip(), self.tools)
            out.append(call or block)
            self.called = call is not None

    def finish(self) -> list[str | ToolCall]:
        """What is left once the output ended (an unclosed block is parsed if it holds a whole call)."""
        rest, self.buffer = self.buffer, ""
        if self.inside:
            self.inside = False
            call = parse_call(rest[len(CALL_OPEN):].strip(), self.tools)
            if call is not None:
                return [call]
        if not rest or (self.called and not rest.strip()):
            return []
        return [rest]


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper start of `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


# -- the prompt ----------------------------------------------------------------------------------
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


# -- each API's shapes -----------------------------------------------------------------------------
def _choice(value: Any, named: str | None, where: str) -> ToolChoice:
    if value is None or value == "auto":
        return ToolChoice("auto")
    if value in ("none", "required"):
        return ToolChoice(value)
    if named is not None:
        return ToolChoice("function", named)
    raise InvalidRequestError(f"{where}={value!r}: must be 'auto', 'none', 'required' or a named function")


def openai_tool_set(tools: Any, tool_choice: Any, parallel: bool | None, flat: bool = False) -> ToolSet | None:
    """OpenAI's `tools` / `tool_choice` / `parallel_tool_calls`: chat completions nest each
    function (`{"type": "function", "function": {...}}`); the Responses API (`flat`) does not
    (`{"type": "function", "name": ...}`). None when no tools are offered."""
    if tools is None or tools == []:
        if tool_choice not in (None, "none", "auto"):
            raise InvalidRequestError(f"tool_choice={tool_choice!r} needs tools")
        return None
    if not isinstance(tools, list):
        raise InvalidRequestError("tools: must be a list of function tools")
    parsed = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise InvalidRequestError(f"{where}.type={kind!r}: only function tools are supported")
        spec = tool if flat else tool.get("function")
        if not isinstance(spec, dict):
            raise InvalidRequestError(f"{where}.function: required, an object with the function's name")
        if not flat:
            where += ".function"
        unknown = set(spec) - {"name", "description", "parameters", "strict", *(("type",) if flat else ())}
        if unknown:
            raise InvalidRequestError(f"{where}: unknown field(s) {sorted(unknown)}")
        parsed.append(check_tool(spec.get("name"), spec.get("description"), spec.get("parameters"), where))
    named = None
    if isinstance(tool_choice, dict):
        if tool_choice.get("type") != "function":
            raise InvalidRequestError(f"tool_choice.type={tool_choice.get('type')!r}: must be 'function'")
        named = tool_choice.get("name") if flat else (tool_choice.get("function") or {}).get("name")
        if not isinstance(named, str):
            raise InvalidRequestError("tool_choice: a named choice needs the function's name "
                                      + ("(tool_choice.name)" if flat else "(tool_choice.function.name)"))
    return ToolSet(tuple(parsed), _choice(tool_choice, named, "tool_choice"), True if parallel is None else parallel)


def anthropic_tool_set(tools: Any, tool_choice: Any) -> ToolSet | None:
    """Anthropic's `tools` (`{"name", "description", "input_schema"}`) and `tool_choice`
    (`{"type": "auto" | "any" | "tool" | "none", "name", "disable_parallel_tool_use"}`)."""
    if not tools:
        return None
    if not isinstance(tools, list):
        raise InvalidRequestError("tools: must be a list of tools")
    parsed = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise InvalidRequestError(f"tools[{i}]: must be an object")
        if tool.get("type") not in (None, "custom"):
            raise InvalidRequestError(f"tools[{i}].type={tool.get('type')!r}: only client tools (name, description, "
                                      f"input_schema) are supported, not server tools")
        unknown = set(tool) - {"name", "description", "input_schema", "cache_control", "type"}
        if unknown:
            raise InvalidRequestError(f"tools[{i}]: unknown field(s) {sorted(unknown)}")
        if "input_schema" not in tool:
            raise InvalidRequestError(f"tools[{i}].input_schema: required, the JSON schema of the tool's input")
        parsed.append(check_tool(tool.get("name"), tool.get("description"), tool["input_schema"], f"tools[{i}]",
                                 "input_schema"))
    choice = tool_choice or {"type": "auto"}
    if not isinstance(choice, dict):
        raise InvalidRequestError("tool_choice: must be an object with a type")
    kind = choice.get("type")
    modes = {"auto": "auto", "any": "required", "none": "none", "tool": "function"}
    if kind not in modes:
        raise InvalidRequestError(f"tool_choice.type={kind!r}: must be one of {sorted(modes)}")
    if kind == "tool" and not isinstance(choice.get("name"), str):
        raise InvalidRequestError("tool_choice.name: required with type 'tool'")
    parallel = not choice.get("disable_parallel_tool_use", False)
    return ToolSet(tuple(parsed), ToolChoice(modes[kind], choice.get("name") if kind == "tool" else None), parallel)
