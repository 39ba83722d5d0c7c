"""OpenAI's Responses API with the official `openai` client against the real server: stored
conversations continued from their exact token ids, streaming events, tools, and the store's bounds."""

import json

import jsonschema
import openai
import pytest

from tests.server.test_tool_calls import TOOLS, WEATHER
from tests.server_helpers import API_KEY

MODEL = "SmolLM2-135M-Instruct"
FLAT_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, timeout=120, max_retries=0)


def test_previous_response_id_continues_from_the_exact_tokens_of_each_turn(client):
    kw = dict(model=MODEL, instructions="Answer in a few words.", max_output_tokens=10, temperature=0)
    turn = client.responses.create(input="Name a colour.", **kw)
    assert turn.status in ("completed", "incomplete") and turn.output_text
    assert turn.usage.input_tokens_details.cached_tokens < turn.usage.input_tokens
    for question in ("Name another one.", [{"role": "user", "content": [{"type": "input_text", "text": "And a third?"}]}]):
        nxt = client.responses.create(input=question, previous_response_id=turn.id, **kw)
        assert nxt.previous_response_id == turn.id
        # the previous prompt and everything it generated (but the last token, never run through
        # the model) were cached: the new prompt starts with exactly those ids
        assert nxt.usage.input_tokens_details.cached_tokens == turn.usage.input_tokens + turn.usage.output_tokens - 1
        causes = nxt.usage.input_tokens_details.model_extra["cache"]  # the usage extension: why each token hit or missed
        assert causes["device"] == nxt.usage.input_tokens_details.cached_tokens
        assert sum(causes.values()) == nxt.usage.input_tokens
        assert nxt.usage.input_tokens > turn.usage.input_tokens + turn.usage.output_tokens
        turn = nxt
    stored = client.responses.retrieve(turn.id)
    assert stored.id == turn.id and stored.output_text == turn.output_text


def test_a_streamed_response_sends_openai_events_and_says_what_the_plain_one_says(client):
    kw = dict(model=MODEL, input="Say hello.", max_output_tokens=8, temperature=0)
    plain = client.responses.create(**kw)
    events = list(client.responses.create(**kw, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == plain.output_text
    assert events[-1].response.output_text == plain.output_text
    assert events[-1].response.usage.output_tokens == plain.usage.output_tokens


def test_function_calls_and_their_outputs_continue_the_conversation(client):
    r = client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=FLAT_TOOLS,
                                tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=48,
                                temperature=0)
    (call,) = [item for item in r.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    answer = client.responses.create(model=MODEL, previous_response_id=r.id, tools=FLAT_TOOLS, max_output_tokens=8,
                                     temperature=0, input=[{"type": "function_call_output", "call_id": call.call_id,
                                                            "output": "18 degrees"}])
    assert answer.output_text
    assert answer.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens + r.usage.output_tokens - 1


def test_text_format_json_schema_constrains_the_output(client):
    schema = {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "blue"]}},
              "required": ["colour"]}
    r = client.responses.create(model=MODEL, input="Pick a colour.", max_output_tokens=16, temperature=0,
                                text={"format": {"type": "json_schema", "name": "pick", "schema": schema}})
    jsonschema.validate(json.loads(r.output_text), schema)


def test_store_false_is_not_kept_and_delete_forgets(client):
    kept = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, temperature=0)
    gone = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, temperature=0, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(gone.id)
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(model=MODEL, input="x", previous_response_id=gone.id, max_output_tokens=2)
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)


@pytest.mark.parametrize("body, needle", [
    ({"input": "x", "previous_response_id": "resp_missing"}, "previous_response_id='resp_missing'"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0].type"),
    ({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": {"type": "string"}}]},
     "tools[0].parameters.type"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "truncation": "auto"}, "truncation"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}, "input[0].arguments"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "x",
                                              "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "3d"}}]}]},
     "prompt_cache_breakpoint.ttl"),
])
def test_bad_requests_are_a_400_naming_the_field(server, body, needle):
    with server.client() as c:
        r = c.post("/v1/responses", json={"model": MODEL, "max_output_tokens": 2, **body})
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]
