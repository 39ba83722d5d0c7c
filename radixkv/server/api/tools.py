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
tool messages itself. For one that does not (SmolLM2's, Gemma's), `conversation.fallback_messages` writes a
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

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from radixkv.errors import InvalidRequestError
from radixkv.server.api.markers import partial_suffix as _partial_suffix
from radixkv.server.api.tool_call import ToolCall, new_call_id

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_TOOLS = 128

@dataclass(frozen=True)
class Tool:
    """A function the model may call: `parameters` is the JSON schema of its arguments (an object)."""

    name: str
    description: str
    parameters: dict[str, Any]
    where: str = dataclasses.field(default="parameters", compare=False)  # its schema's field in the request

    def to_template(self) -> dict[str, Any]:
        """As chat templates (and OpenAI) describe it."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolChoice:
    mode: Literal["auto", "none", "required", "function"] = "auto"
    name: str | None = None  # the function `mode="function"` forces


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
    return Tool(name, description or "", parameters, field)  # (field: e.g. tools[0].function.parameters)


def _schema_grammar(schema: dict[str, Any], where: str):
    """xgrammar's grammar of `schema`; 400 naming `where` if it is not a usable JSON schema."""
    import xgrammar as xgr

    from radixkv.constrained.analysis import check_grammar
    from radixkv.grammar_spec import MAX_GRAMMAR_CHARS, check_schema_keywords, grammar_error_reason

    check_schema_keywords(schema, where)
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
    format: str = "hermes"  # the format calls are read in when the model writes them (`--tool-call-parser`)

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

    def grammar(self, answer: str | None = None) -> str:
        """EBNF of the output `required` / a named function allows: `<tool_call>` blocks (one, or
        one or more separated by newlines when `parallel` and not named), each a JSON object
        {"name": <a tool's name>, "arguments": <its schema>}; or, given the JSON schema of an
        `answer` (`auto` with a response format), those calls or an answer in that schema."""
        import xgrammar as xgr

        from radixkv.grammar_spec import MAX_GRAMMAR_CHARS

        chosen = [self.tool(self.choice.name)] if self.choice.mode == "function" else list(self.tools)
        calls = [_schema_grammar({"type": "object", "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                                  "required": ["name", "arguments"], "additionalProperties": False},
                                 t.where) for t in chosen]
        body = calls[0] if len(calls) == 1 else xgr.Grammar.union(*calls)
        one = xgr.Grammar.concat(xgr.Grammar.from_ebnf(f"root ::= {json.dumps(CALL_OPEN + chr(10))}"), body,
                                 xgr.Grammar.from_ebnf(f"root ::= {json.dumps(chr(10) + CALL_CLOSE)}"))
        text = str(one)
        if len(text) > MAX_GRAMMAR_CHARS:
            big = max(chosen, key=lambda t: len(json.dumps(t.parameters)))
            raise InvalidRequestError(f"{big.where}: the grammar that forces a call of the tools is {len(text)} "
                                      f"characters, more than the {MAX_GRAMMAR_CHARS} accepted; simplify the schema")
        if self.parallel and self.choice.mode != "function":
            renamed, n = re.subn(r"^root ::= ", "tool_call ::= ", text, count=1, flags=re.MULTILINE)
            assert n == 1, "xgrammar's grammar text starts with its root rule"
            text = renamed + '\nroot ::= tool_call ("\\n" tool_call)*\n'
        if answer is None:
            return text
        return str(xgr.Grammar.union(xgr.Grammar.from_ebnf(text), xgr.Grammar.from_json_schema(answer, any_whitespace=False)))

    def reader(self, pieces: bool = False):
        """What reads calls out of the output as it streams: Hermes' `CallStream` for a forced call
        (the grammar writes that format) or a Hermes-format model, else the format's own
        (`tool_parsers.FormatStream`)."""
        if self.forced or self.format in ("hermes", "qwen25", "qwen3"):
            return CallStream(self, pieces)
        from radixkv.server.api.tool_parsers import FormatStream

        return FormatStream(self, self.format)

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content, calls) of a finished output; content is None when only calls remain."""
        if not self.parses_calls:
            return text, []
        stream = self.reader()
        events = stream.push(text) + stream.finish()
        content = "".join(e for e in events if isinstance(e, str))  # (a block cut short is not content)
        calls = [e for e in events if isinstance(e, ToolCall)]
        return (content.strip() or None) if calls else content, calls


@dataclass(frozen=True)
class CallStart:
    """A call begins (its tool named): a stream announces it before its arguments."""

    id: str
    name: str


@dataclass(frozen=True)
class CallArgs:
    """More of the arguments of the call `id` (a piece of its JSON text, in order)."""

    id: str
    text: str


HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]+)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')
TAIL = re.compile(r"\}\s*(?:<(?:/(?:t(?:o(?:o(?:l(?:_(?:c(?:a(?:l(?:l(?:>)?)?)?)?)?)?)?)?)?)?)?)?\s*\Z")


def parse_call(block: str, tools: ToolSet, raw: bool = False) -> ToolCall | None:
    """The call a `<tool_call>` block's body holds, or None if it is not a call of one of the
    tools. `raw`: its arguments as the model wrote them (what a stream sent in pieces), not
    re-encoded."""
    head = HEADER.match(block) if raw else None
    if head is not None:
        args = block[head.end():].rstrip()
        args = args[:args.rfind("}")].rstrip() if args.endswith("}") else args
        try:
            if isinstance(json.loads(args), dict) and tools.tool(head.group(1)) is not None:
                return ToolCall(new_call_id(), head.group(1), args)
        except (ValueError, RecursionError):
            pass
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


CUT_CALL = re.compile(r'\{\s*"name"\s*:\s*"([^"\\]+)"\s*(?:,\s*"(?:arguments|parameters)"\s*:\s*(.*))?', re.S)


def cut_call(block: str, tools: ToolSet) -> ToolCall | None:
    """The call a block cut short holds (its name and the arguments as far as they came), or
    None when it does not name one of the tools."""
    m = CUT_CALL.match(block)
    if m is None or tools.tool(m.group(1)) is None:
        return None
    return ToolCall(new_call_id(), m.group(1), (m.group(2) or "").rstrip(), complete=False)


class CallStream:
    """Reads calls out of text as it streams: `push(text)` and `finish()` return what can be
    shown, in order: text (str, content) and `ToolCall`s. Text that may start a `<tool_call>`
    is held back until it is known not to; a block's text is held until it closes (a block that
    does not hold a call of one of the tools is shown as text). Whitespace after a call is held
    too, and dropped if only calls and whitespace follow (the separator between calls).

    With `pieces`, a call streams: its `CallStart` once the tool is named, `CallArgs` pieces
    that add up to its arguments, then its `ToolCall` under the same id (nothing left to send)."""

    def __init__(self, tools: ToolSet, pieces: bool = False):
        self.tools, self.buffer, self.inside, self.called = tools, "", False, False
        self.pieces = pieces  # stream a call's arguments as they come (`CallStart`, `CallArgs`)
        self.started: CallStart | None = None  # the call whose arguments are streaming
        self.streamed = ""  # its arguments sent so far

    def _stream_arguments(self) -> list[CallStart | CallArgs]:
        """Inside a block: the call's start once its tool is named, then its arguments as far as
        they can be known not to be the block's end (a `}` that may close the call is held)."""
        head = HEADER.match(self.buffer, len(CALL_OPEN))
        if head is None or self.tools.tool(head.group(1)) is None:
            return []
        out: list[CallStart | CallArgs] = []
        if self.started is None:
            self.started, self.streamed = CallStart(new_call_id(), head.group(1)), ""
            out.append(self.started)
        args = self.buffer[head.end():]
        last = args.rfind("}")
        tail = TAIL.match(args, last) if last >= 0 else None
        safe = (last if tail is not None else len(args.rstrip())) if args else 0
        if safe > len(self.streamed):
            out.append(CallArgs(self.started.id, args[len(self.streamed):safe]))
            self.streamed = args[:safe]
        return out

    def _close(self, call: ToolCall | None) -> list[CallArgs | ToolCall]:
        """The call a block made (none: []); one whose start went out comes under its id, after
        the rest of its arguments."""
        started, self.started = self.started, None
        if started is None:
            return [] if call is None else [call]
        if call is None:
            return [ToolCall(started.id, started.name, "", complete=False)]
        sent = self.streamed
        rest = call.arguments[len(sent):] if call.arguments.startswith(sent) else ""
        return ([CallArgs(started.id, rest)] if rest else []) + [ToolCall(started.id, call.name, call.arguments,
                                                                          call.complete)]

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
                return out + (self._stream_arguments() if self.pieces else [])
            block = self.buffer[: end + len(CALL_CLOSE)]
            self.buffer, self.inside = self.buffer[end + len(CALL_CLOSE):], False
            closed = self._close(parse_call(block[len(CALL_OPEN): -len(CALL_CLOSE)].strip(), self.tools,
                                            raw=self.started is not None))
            out += closed or [block]
            self.called = bool(closed)

    def finish(self) -> list[str | ToolCall]:
        """What is left once the output ended: an unclosed block is a call if it holds a whole
        one, an incomplete call if it names a tool, else nothing (never the call markup)."""
        rest, self.buffer = self.buffer, ""
        if self.inside:
            self.inside = False
            body = rest[len(CALL_OPEN):].strip()
            return self._close(parse_call(body, self.tools, raw=self.started is not None) or cut_call(body, self.tools))
        if not rest or (self.called and not rest.strip()):
            return []
        return [rest]



def in_format(tools: ToolSet | None, fmt: str | None) -> ToolSet | None:
    """`tools` read in the server's `--tool-call-parser` format `fmt` (None: Hermes')."""
    if tools is None or fmt is None:
        return tools
    return dataclasses.replace(tools, format=fmt)
