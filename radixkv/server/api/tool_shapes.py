"""Each API's tool shapes as a `ToolSet` (`radixkv.server.api.tools`): OpenAI's `tools` and
`tool_choice` (chat completions nest the function, the Responses API flattens it) and
Anthropic's (`input_schema`, `any`, `tool`, `disable_parallel_tool_use`). Every bad shape is a
400 naming the client's field."""

from __future__ import annotations

from typing import Any

from radixkv.errors import InvalidRequestError
from radixkv.server.api.tools import ToolChoice, ToolSet, check_tool


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
