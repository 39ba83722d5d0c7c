"""Writes `corpus.json`, the hostile-input corpus `test_hostile_corpus.py` sends: one request per
entry, each with the 4xx it must get and the client field its message must name.

The corpus is data, kept in the repository; this script is how it was made and how to grow
it (`python tests/server/hostile/make_corpus.py`). `$MODEL` stands for the served model's
name; `raw` bodies are sent as they are (not JSON-encoded).

Every endpoint that takes a body gets, for each of its fields, values of the wrong JSON type
(`true` where a number goes, a string for a number, an object for a string), out-of-range
values, and the shapes found from outside (issue 41): JSON nested thousands of levels inside
string fields, schemas the grammar compiler would not enforce or that nest 300 levels, tool
results answering no call, metadata past OpenAI's limits, a batch larger than the server holds.
"""

import json
from pathlib import Path

OUT = Path(__file__).with_name("corpus.json")
MODEL = "$MODEL"
USER = [{"role": "user", "content": "hi"}]
CHAT = {"model": MODEL, "messages": USER, "max_tokens": 2}
COMPLETION = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
RESPONSES = {"model": MODEL, "input": "hi", "max_output_tokens": 2}
MESSAGES = {"model": MODEL, "max_tokens": 2, "messages": USER}
GENERATE = {"text": "hi", "sampling_params": {"max_new_tokens": 2}}
DEEP_TEXT = "[" * 5000 + "]" * 5000  # JSON text nested 5,000 levels
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def deep_object(levels: int) -> dict:
    value: dict = {"type": "string"}
    for _ in range(levels):
        value = {"type": "object", "properties": {"a": value}, "required": ["a"]}
    return value


def nested(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels):
        value = {"x": value}
    return value


WRONG = [True, "3", 1.5, {"a": 1}, [1]]  # for an integer field
WRONG_NUMBER = [True, "0.5", {"a": 1}, [0.5]]
WRONG_STRING = [5, True, {"a": 1}, [1]]
WRONG_BOOL = ["yes", 1, {"a": 1}]

cases: list[dict] = []


def case(path: str, body, names: str, status: int = 400, method: str = "POST", why: str = "") -> None:
    entry = {"method": method, "path": path, "status": status, "names": names}
    if isinstance(body, str):
        entry["raw"] = body
    elif body is not None:
        entry["body"] = body
    if why:
        entry["why"] = why
    cases.append(entry)


def fields(path: str, base: dict, wrong: dict[str, list]) -> None:
    for name, values in wrong.items():
        for value in values:
            case(path, {**base, name: value}, name.split(".")[-1])


# -- type confusion on every field ----------------------------------------------------------------
fields("/v1/chat/completions", CHAT, {
    "max_tokens": WRONG, "max_completion_tokens": WRONG, "n": WRONG, "seed": WRONG + [-1], "top_logprobs": WRONG,
    "temperature": WRONG_NUMBER, "top_p": WRONG_NUMBER, "presence_penalty": WRONG_NUMBER,
    "frequency_penalty": WRONG_NUMBER, "stream": WRONG_BOOL, "logprobs": WRONG_BOOL, "user": WRONG_STRING,
    "stop": [5, {"a": 1}], "messages": ["hi", 5, {"role": "user"}], "tools": ["x", {"a": 1}],
    "response_format": ["json", 5]})
fields("/v1/completions", COMPLETION, {
    "max_tokens": WRONG, "n": WRONG, "seed": WRONG + [-1], "logprobs": WRONG, "echo": WRONG_BOOL,
    "temperature": WRONG_NUMBER, "prompt": [5.5, {"a": 1}, True]})
fields("/v1/responses", RESPONSES, {
    "max_output_tokens": WRONG, "temperature": WRONG_NUMBER, "top_p": WRONG_NUMBER, "store": WRONG_BOOL,
    "instructions": WRONG_STRING, "input": [5, True], "metadata": ["x", 5], "seed": [True, "3", -1]})
fields("/v1/messages", MESSAGES, {
    "max_tokens": WRONG + [0], "temperature": WRONG_NUMBER + [1.5], "top_k": WRONG + [-1], "top_p": WRONG_NUMBER,
    "stream": WRONG_BOOL, "system": [5, True], "stop_sequences": ["x", [5]], "messages": ["hi", [5]]})
fields("/v1/messages/count_tokens", {"model": MODEL, "messages": USER}, {"messages": ["hi", [5]], "system": [5]})
fields("/tokenize", {"text": "hi"}, {"text": WRONG_STRING, "add_generation_prompt": WRONG_BOOL})
fields("/detokenize", {"input_ids": [1, 2]}, {"input_ids": ["a", [True], [-1], [1.5]]})
fields("/abort_request", {"rid": "x"}, {"rid": WRONG_STRING})
for name, values in {"max_new_tokens": WRONG + [-1], "temperature": WRONG_NUMBER, "top_k": [True, -5],
                     "seed": [True, -1, 2**70], "min_new_tokens": [True, -2], "stop_token_ids": [[True], ["a"]],
                     "ignore_eos": ["yes", 1]}.items():
    for value in values:
        case("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2, name: value}}, name)
for value in (True, "3", -5, 1.5):
    case("/generate", {**GENERATE, "return_logprob": True, "logprob_start_len": value}, "logprob_start_len")
for value in (True, "3", -1, 1000):
    case("/generate", {**GENERATE, "return_logprob": True, "top_logprobs_num": value}, "top_logprobs_num")

# -- JSON nested deep inside string fields (each a 500 RecursionError before) ---------------------
case("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2, "json_schema": DEEP_TEXT}},
     "sampling_params.json_schema")
case("/v1/chat/completions", {**CHAT, "messages": [
    *USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": DEEP_TEXT}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]}, "messages[1].tool_calls[0].function.arguments")
case("/v1/responses", {**RESPONSES, "input": [
    {"role": "user", "content": "hi"},
    {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": DEEP_TEXT},
    {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]}, "input[1].arguments")
case("/v1/chat/completions", {**CHAT, "chat_template_kwargs": nested(900)}, "chat_template_kwargs")
case("/v1/chat/completions", {**CHAT, "chat_template_kwargs": nested(70)}, "chat_template_kwargs")
case("/generate", {"text": "hi", "custom_labels": nested(100)}, "custom_labels")
case("/v1/messages", {**MESSAGES, "tools": [{"name": "t", "input_schema": nested(80)}]}, "tools[0].input_schema")

# -- schemas: 300 levels deep (stalled the event loop), keywords not enforced -----------------------
DEEP_SCHEMA = deep_object(300)
case("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {
    "name": "deep", "parameters": DEEP_SCHEMA}}]}, "tools[0].function.parameters")
case("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
    "name": "deep", "schema": DEEP_SCHEMA}}}, "response_format")
case("/v1/messages/count_tokens", {"model": MODEL, "messages": USER, "tools": [
    {"name": "deep", "input_schema": DEEP_SCHEMA}]}, "tools[0].input_schema")
case("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2, "json_schema": json.dumps(DEEP_SCHEMA)}},
     "sampling_params.json_schema")
UNHONOURED = {"allOf": {"allOf": [{"type": "string"}, {"type": "integer"}]},
              "not": {"type": "integer", "not": {"const": 3}},
              "if": {"type": "integer", "if": {"minimum": 3}, "then": {"maximum": 5}},
              "uniqueItems": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
              "contains": {"type": "array", "items": {"type": "integer"}, "contains": {"const": 3}},
              "dependentRequired": {"type": "object", "dependentRequired": {"a": ["b"]}}}
for keyword, schema in UNHONOURED.items():
    case("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2, "json_schema": json.dumps(schema)}},
         f"json_schema.{keyword}")
    case("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "s", "schema": schema}}}, f"response_format.{keyword}")
    nested_in = {"type": "object", "properties": {"x": schema}}
    case("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": nested_in}}]}, f"tools[0].function.parameters.properties.x.{keyword}")
    case("/v1/responses", {**RESPONSES, "text": {"format": {"type": "json_schema", "name": "s", "schema": schema}}},
         f"text.format.{keyword}")

# -- what agents send that was accepted silently ------------------------------------------------------
case("/v1/chat/completions", {**CHAT, "max_tokens": True}, "max_tokens")
case("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": None}]}, "messages[0].content")
case("/v1/chat/completions", {**CHAT, "messages": [{"role": "system", "content": None}, *USER]},
     "messages[0].content")
case("/v1/chat/completions", {**CHAT, "seed": -1}, "seed")
case("/v1/messages", {**MESSAGES, "messages": [*USER, {"role": "user", "content": [
    {"type": "tool_result", "tool_use_id": "toolu_nobody", "content": "42"}]}]}, "tool_use_id")
case("/generate", {**GENERATE, "return_logprob": True, "logprob_start_len": -5}, "logprob_start_len")
case("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2, "seed": -1}}, "seed")
case("/v1/chat/completions", {**CHAT, "max_tokens": 10**6}, "max_tokens")
case("/v1/completions", {**COMPLETION, "max_tokens": -4}, "max_tokens")
case("/v1/responses", {**RESPONSES, "max_output_tokens": 10**6}, "max_output_tokens")

# -- metadata past OpenAI's limits (kept whole in the Responses store before) -----------------------
case("/v1/responses", {**RESPONSES, "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata")
case("/v1/responses", {**RESPONSES, "metadata": {"k" * 65: "v"}}, "metadata")
case("/v1/responses", {**RESPONSES, "metadata": {"k": "v" * 513}}, "metadata.k")
case("/v1/responses", {**RESPONSES, "metadata": {"k": 5}}, "metadata")

# -- sizes and batches ------------------------------------------------------------------------------------
case("/generate", {"text": ["one line"] * 5000, "sampling_params": {"max_new_tokens": 1}}, "--max-queued-requests")
case("/generate", {"input_ids": [[1, 2]] * 3000, "sampling_params": {"max_new_tokens": 1, "n": 2}},
     "--max-queued-requests")
case("/abort_request", {"rid": "r" * 100_000}, "100000 characters", status=404)
case("/generate", "[" * 100_000, "nested too deeply")
case("/generate", '{"text": "hi", "sampling_params": ' + "[" * 3000 + "]" * 3000 + "}", "nested")
case("/generate", '{"text": "a\\ud800"}', "text")

# -- routes and methods -----------------------------------------------------------------------------------
case("/v1/models/no-such-model", None, "no-such-model", status=404, method="GET")
case("/v1/responses/resp_nobody", None, "resp_nobody", status=404, method="GET")
case("/v1/responses/resp_nobody", None, "resp_nobody", status=404, method="DELETE")
case("/generate", None, "GET", status=405, method="GET")
case("/flush_cache", {}, "admin", status=403)

if __name__ == "__main__":
    OUT.write_text("[\n" + ",\n".join(json.dumps(c) for c in cases) + "\n]\n")  # one request a line
    print(f"{len(cases)} requests -> {OUT}")
