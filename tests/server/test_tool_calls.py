"""Tool calling on /v1/chat/completions, with the official `openai` client against the real server.

The default model's template has no tool support, so these run the documented fallback prompt.
Each distinct tool grammar is compiled once against the vocabulary (seconds on CPU): the tests
share two (`required` without parallel calls, and `add` by name).
"""

import json

import jsonschema
import openai
import pytest

from tests.server_helpers import API_KEY

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
                                            "unit": {"type": "string", "enum": ["c", "f"]}},
           "required": ["city", "unit"]}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city now",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, timeout=120, max_retries=0)


def valid(call) -> dict:
    """The call's arguments, checked against its tool's schema."""
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])
    return args


def test_required_generates_a_call_whose_arguments_match_the_schema(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=48, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name in SCHEMAS
    valid(call)


def test_a_named_function_is_the_one_called_and_streams_as_openai_deltas(client):
    choice = {"type": "function", "function": {"name": "add"}}
    full = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice,
                                          max_tokens=48, temperature=0)
    (call,) = full.choices[0].message.tool_calls
    assert call.function.name == "add" and full.choices[0].finish_reason == "tool_calls"
    args = valid(call)
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice,
                                                 max_tokens=48, temperature=0, stream=True))
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert {d.index for d in deltas} == {0} and deltas[0].function.name == "add" and deltas[0].id.startswith("call_")
    assert len(deltas) > 2 and not any(d.id for d in deltas[1:])  # the arguments come in pieces, as OpenAI's do
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == args
    assert not "".join(c.choices[0].delta.content or "" for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_auto_reads_hermes_calls_out_of_the_text_streamed_or_not(client):
    # the model is small: a regex (our extension) makes it write a call in the format the prompt teaches
    forced = r'I will check\. <tool_call>\n\{"name": "get_weather", "arguments": \{"city": "Tokyo", "unit": "f"\}\}\n</tool_call>'
    kw = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="auto", max_tokens=64, temperature=0,
              extra_body={"regex": forced})
    full = client.chat.completions.create(**kw)
    message = full.choices[0].message
    assert message.content == "I will check." and full.choices[0].finish_reason == "tool_calls"
    (call,) = message.tool_calls
    assert call.function.name == "get_weather" and valid(call) == {"city": "Tokyo", "unit": "f"}
    chunks = list(client.chat.completions.create(**kw, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "I will check. "
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert {d.index for d in deltas} == {0} and deltas[0].function.name == "get_weather"
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == {"city": "Tokyo", "unit": "f"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # tool_choice "none": the same text is content, not a call
    plain = client.chat.completions.create(**{**kw, "tool_choice": "none"})
    assert plain.choices[0].message.tool_calls is None and "<tool_call>" in plain.choices[0].message.content


def test_a_tool_round_trip_reuses_the_cached_conversation(client):
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=48, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"}]
    answer = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=12, temperature=0)
    assert answer.choices[0].message.content and answer.choices[0].message.tool_calls is None
    # the tools, the question and the call came back from the cache
    assert answer.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens


@pytest.mark.parametrize("tools, choice, needle", [
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "no-such-type"}}}}}], "auto", "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}], "auto",
     "tools[0].function.parameters.type"),
    ([{"type": "function", "function": {"name": "bad name!"}}], "auto", "tools[0].function.name"),
    ([{"type": "retrieval"}], "auto", "tools[0].type"),
    (TOOLS, {"type": "function", "function": {"name": "nope"}}, "tool_choice names 'nope'"),
    (TOOLS + TOOLS[:1], "auto", "given twice"),
    ([{"type": "function", "function": {"name": "loop", "parameters": {
        "type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}}}], "auto",
     "tools[0].function.parameters"),
])
def test_bad_tools_are_a_400_naming_the_field(client, tools, choice, needle):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=ASK, tools=tools, tool_choice=choice, max_tokens=4)
    assert needle in e.value.message


def test_bad_history_and_conflicting_constraints_are_400s(client):
    bad_args = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{not json"}}]}]
    with pytest.raises(openai.BadRequestError, match=r"messages\[1\]\.tool_calls\[0\]\.function\.arguments"):
        client.chat.completions.create(model=MODEL, messages=bad_args, tools=TOOLS, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match=r"messages\[1\]\.tool_call_id"):
        client.chat.completions.create(model=MODEL, messages=ASK + [{"role": "tool", "content": "3"}], max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="cannot be combined with regex"):
        client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=4,
                                       extra_body={"regex": "a+"})


def test_a_forced_call_with_a_response_format_is_accepted_and_calls(client):
    """Found from outside: `required` with a response_format was a 400; OpenAI accepts it (the
    format is for the final answer) and openai-agents sends it."""
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=48, temperature=0,
                                       response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "tool_calls"
    (call,) = r.choices[0].message.tool_calls
    valid(call)


def test_auto_with_a_response_format_calls_or_answers_in_the_format(client):
    """Found from outside: the format constrained the whole output, so no tool could be called.
    Now the output is a call or an answer in the format (the grammar allowing both is checked in
    test_tools.py); whichever this model writes parses as what it is."""
    answer = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
              "required": ["city"], "additionalProperties": False}
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="auto",
                                       parallel_tool_calls=False, max_tokens=48, temperature=0,
                                       response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": answer}})
    message = r.choices[0].message
    if message.tool_calls:
        assert r.choices[0].finish_reason == "tool_calls" and not (message.content or "").startswith("<tool_call>")
        valid(message.tool_calls[0])
    else:
        jsonschema.validate(json.loads(message.content), answer)


def test_a_forced_call_cut_by_max_tokens_leaks_no_markup(client):
    """Found from outside: a forced call cut by max_tokens came back as text holding the internal
    `<tool_call>` markup and no call. Now: finish_reason length, the call as far as it came."""
    choice = {"type": "function", "function": {"name": "get_weather"}}
    kw = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=14, temperature=0)
    r = client.chat.completions.create(**kw)
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "length"
    assert "<tool_call>" not in (message.content or "") and "{" not in (message.content or "")
    assert all(c.function.name == "get_weather" for c in message.tool_calls or [])
    chunks = list(client.chat.completions.create(**kw, stream=True))
    assert "<tool_call>" not in "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "length"
