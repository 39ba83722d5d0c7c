"""Reasoning and tool-call parsers on text as real models write it, split at every point a stream
could split it (unit level), and end to end through the OpenAI client: the server's output is
forced into each format with a regex, then read back as reasoning_content and tool_calls."""

import json

import pytest

from radixkv.errors import InvalidRequestError
from radixkv.server.api.reasoning import ReasoningParser
from radixkv.server.api.tool_parsers import FormatStream, read_calls
from radixkv.server.api.tools import Tool, ToolCall, ToolChoice, ToolSet
from tests.server_helpers import API_KEY, start_server, stop_server

WEATHER = Tool("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}}})
TIME = Tool("get_time", "", {"type": "object", "properties": {"zone": {"type": "string"}}})

QWEN3 = ("<think>\nThe user asks for 2+2. That is 4.\n</think>\n\nThe answer is **4**.",
         "The user asks for 2+2. That is 4.", "The answer is **4**.")
R1 = ("Okay, so the user wants a haiku. Let me count syllables.\n</think>\n\nSnow on the old pine",
      "Okay, so the user wants a haiku. Let me count syllables.", "Snow on the old pine")
MISTRAL = ('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
           '{"name": "get_time", "arguments": {"zone": "CET"}}]')
LLAMA3 = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {"zone": "CET"}}'


def streamed(parser, text, cut):
    s = parser.stream()
    r1, a1 = s.push(text[:cut])
    r2, a2 = s.push(text[cut:])
    r3, a3 = s.finish()
    return r1 + r2 + r3, a1 + a2 + a3


@pytest.mark.parametrize("name,sample", [("qwen3", QWEN3), ("deepseek-r1", R1)])
def test_reasoning_is_split_whole_and_at_every_stream_cut(name, sample):
    parser = ReasoningParser(name)
    text, reasoning, answer = sample
    assert parser.split(text) == (reasoning, answer)
    for cut in range(len(text) + 1):
        got_reasoning, got_answer = streamed(parser, text, cut)
        assert got_reasoning.strip() == reasoning and got_answer == answer, cut


def test_reasoning_edge_cases():
    qwen3, r1 = ReasoningParser("qwen3"), ReasoningParser("deepseek-r1")
    assert qwen3.split("No thinking here.") == (None, "No thinking here.")  # enable_thinking: false
    assert qwen3.split("<think>\n\n</think>\n\nHi") == (None, "Hi")  # an empty block
    assert qwen3.split("<think>cut off by max_tokens") == ("cut off by max_tokens", "")
    assert qwen3.split("Say <think> inline") == (None, "Say <think> inline")  # only at the start
    assert r1.split("all thinking, never closed") == ("all thinking, never closed", "")
    with pytest.raises(InvalidRequestError, match="one of"):
        ReasoningParser("nope")


@pytest.mark.parametrize("fmt,text", [("mistral", MISTRAL), ("llama3", LLAMA3), ("llama3", LLAMA3.split(">", 1)[1])])
def test_model_native_calls_are_read_whole_and_streamed(fmt, text):
    tools = ToolSet((WEATHER, TIME), ToolChoice(), format=fmt)
    want = [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})]
    content, calls = tools.parse(text)
    assert content is None and [(c.name, c.arguments_dict) for c in calls] == want
    for cut in range(0, len(text) + 1, 3):
        s = tools.reader(pieces=True)
        events = s.push(text[:cut]) + s.push(text[cut:]) + s.finish()
        assert [(e.name, e.arguments_dict) for e in events if isinstance(e, ToolCall)] == want, cut
        assert not [e for e in events if isinstance(e, str) and e.strip()], cut


def test_text_around_native_calls_is_kept_and_non_calls_stay_text():
    tools = ToolSet((WEATHER,), ToolChoice(), format="mistral")
    content, calls = tools.parse('Let me check. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Oslo"}}]')
    assert content == "Let me check." and calls[0].arguments_dict == {"city": "Oslo"}
    assert tools.parse("[TOOL_CALLS] not json") == ("[TOOL_CALLS] not json", [])
    assert tools.parse('[TOOL_CALLS] [{"name": "unknown_tool", "arguments": {}}]')[1] == []
    llama = ToolSet((WEATHER,), ToolChoice(), format="llama3")
    assert llama.parse("Paris is sunny today.") == ("Paris is sunny today.", [])
    assert read_calls('{"name": "get_weather", "parameters": "{\\"city\\": \\"Rome\\"}"}', "llama3", llama)[0].name == "get_weather"
    with pytest.raises(ValueError):
        FormatStream(llama, "hermes")


# -- end to end ------------------------------------------------------------------------------
MODEL = "SmolLM2-135M-Instruct"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def parsing_server():
    server = start_server("--reasoning-parser", "qwen3", "--tool-call-parser", "mistral")
    yield server
    stop_server(server)


def forced(client, regex, stream=False, **extra):
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}],
                                          max_tokens=60, temperature=0, stream=stream,
                                          extra_body={"regex": regex}, **extra)


def test_the_openai_client_reads_reasoning_and_native_calls(parsing_server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{parsing_server.url}/v1", api_key=API_KEY)
    out = forced(client, r"<think>I will look it up\.</think>\n\nSunny")
    message = out.choices[0].message
    assert message.reasoning_content == "I will look it up." and message.content == "Sunny"
    pieces = list(forced(client, r"<think>I will look it up\.</think>\n\nSunny", stream=True))
    reasoning = "".join(getattr(p.choices[0].delta, "reasoning_content", None) or "" for p in pieces if p.choices)
    content = "".join(p.choices[0].delta.content or "" for p in pieces if p.choices)
    assert reasoning == "I will look it up." and content == "Sunny"
    call = r'\[TOOL_CALLS\] \[\{"name": "get_weather", "arguments": \{"city": "Paris"\}\}\]'
    out = forced(client, call, tools=TOOLS)
    assert out.choices[0].finish_reason == "tool_calls"
    assert json.loads(out.choices[0].message.tool_calls[0].function.arguments) == {"city": "Paris"}
    pieces = list(forced(client, call, stream=True, tools=TOOLS))
    deltas = [tc for p in pieces if p.choices for tc in (p.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == "get_weather" and json.loads(
        "".join(d.function.arguments or "" for d in deltas)) == {"city": "Paris"}
    plain = forced(client, r"<think>x</think>Sunny", extra_headers=None, timeout=60)
    assert plain.choices[0].message.content == "Sunny"
    kept = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=20,
                                          temperature=0, extra_body={"regex": r"<think>a</think>b",
                                                                     "separate_reasoning": False})
    assert kept.choices[0].message.content == "<think>a</think>b"


def chunks_of(pieces):
    from radixkv.outputs import TextOutput

    async def gen():
        for i, text in enumerate(pieces):
            done = i == len(pieces) - 1
            yield TextOutput("r", [1], done, {"type": "stop"} if done else None, 5, 0, i + 1, text=text)
    return gen()


def test_the_messages_stream_opens_with_a_thinking_block():
    import asyncio

    from radixkv.server.api.anthropic import message_events

    class Prompt:  # what message_events reads of a prompt
        tools, ids = None, [1, 2, 3, 4, 5]

        def usage_of(self, usage):
            return {"input_tokens": 5}

    async def run():
        return [e async for e in message_events(Prompt(), chunks_of(["<thi", "nk>Let me", " see.</think>", "\n\nHi", " there"]),
                                                {"id": "m"}, None, ReasoningParser("qwen3"))]

    events = [body for _, body in asyncio.run(run())]
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas) == "Let me see."
    assert "".join(d.get("text", "") for d in deltas) == "Hi there"
