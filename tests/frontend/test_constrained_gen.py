"""`gen(regex=..., json_schema=...)` in frontend programs, on both backends."""

import json
import re

import jsonschema
import pytest

import radixkv.frontend as rk
from radixkv.errors import InvalidRequestError

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"]}


@rk.function
def profile(s, who):
    s += rk.user(f"Describe {who} in JSON with name and age.")
    s += rk.assistant(rk.gen("person", max_tokens=48, json_schema=PERSON))
    s += rk.user("And their phone number?")
    s += rk.assistant(rk.gen("phone", max_tokens=12, regex=r"\d{3}-\d{4}"))


def test_gen_with_a_schema_and_a_regex(backend):
    state = profile.run(who="a retired sea captain", backend=backend)
    jsonschema.validate(json.loads(state["person"]), PERSON)
    assert re.fullmatch(r"\d{3}-\d{4}", state["phone"])


def test_a_bad_pattern_fails_where_the_program_says_it():
    with pytest.raises(InvalidRequestError, match="sampling_params.regex"):
        rk.gen("x", regex="([a-z")
