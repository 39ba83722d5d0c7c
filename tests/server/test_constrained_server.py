"""Constrained decoding through the real server: /generate with a regex or schema, the OpenAI
client with `response_format`, and 400s for bad grammars."""

import json
import re

import jsonschema
import openai
import pytest

from tests.server_helpers import API_KEY

MODEL = "SmolLM2-135M-Instruct"
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                         "country": {"type": "string", "maxLength": 20}},
        "required": ["city", "country"]}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, timeout=120, max_retries=0)


def test_generate_with_a_regex_and_a_schema(server):
    with server.client() as c:
        r = c.post("/generate", json={"text": "My phone number is", "sampling_params": {
            "max_new_tokens": 16, "temperature": 0, "regex": r"\d{3}-\d{4}"}})
        assert r.status_code == 200 and re.fullmatch(r"\d{3}-\d{4}", r.json()["text"])
        r = c.post("/generate", json={"text": "Paris as JSON:", "sampling_params": {
            "max_new_tokens": 48, "temperature": 0, "json_schema": CITY}})
        jsonschema.validate(json.loads(r.json()["text"]), CITY)


@pytest.mark.parametrize("params, named", [({"regex": "(("}, "sampling_params.regex"),
                                           ({"json_schema": {"type": "objekt"}}, "sampling_params.json_schema"),
                                           ({"ebnf": "root ::="}, "sampling_params.ebnf")])
def test_bad_grammars_get_400_naming_the_field(server, params, named):
    with server.client() as c:
        r = c.post("/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 4, **params}})
        assert r.status_code == 400 and named in r.json()["error"]["message"]
        assert c.get("/health").status_code == 200


RECURSIVE_REQUIRED = {"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}},
                      "$ref": "#/$defs/n"}


@pytest.mark.parametrize("stream", [False, True])
def test_a_schema_no_output_can_satisfy_is_a_400_and_the_server_lives(server, client, stream):
    """The hostile-input probe's schema grew the scheduler to 15 GB until the kernel killed it."""
    with server.client() as c:
        r = c.post("/generate", json={"text": "Hi", "stream": stream, "sampling_params": {
            "max_new_tokens": 8, "json_schema": RECURSIVE_REQUIRED}})
        assert r.status_code == 400, r.text  # a stream too: its first output is awaited before the 200
        assert "sampling_params.json_schema: no output can satisfy it" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="no output can satisfy it"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                       stream=stream, response_format={"type": "json_schema", "json_schema": {
                                           "name": "loop", "schema": RECURSIVE_REQUIRED}})
    server.wait_idle()
    with server.client() as c:
        assert c.get("/health").status_code == 200


def test_openai_response_format_json_schema_and_json_object(client):
    full = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Where is the Eiffel Tower? Answer in JSON."}],
        max_tokens=64, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": CITY}})
    jsonschema.validate(json.loads(full.choices[0].message.content), CITY)
    obj = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Describe a cat as a JSON object."}],
        max_tokens=64, temperature=0, response_format={"type": "json_object"})
    assert isinstance(json.loads(obj.choices[0].message.content), dict)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Where is the Eiffel Tower? Answer in JSON."}],
        max_tokens=64, temperature=0, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": CITY}})
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == full.choices[0].message.content


def test_openai_bad_response_format_is_a_400(client):
    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                       response_format={"type": "json_schema", "json_schema": {"name": "x"}})
    with pytest.raises(openai.BadRequestError, match="response_format.type"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                       response_format={"type": "yaml"})
