"""Whether every output a grammar starts can end: checked on xgrammar's own parse of it."""

import json

import pytest
import xgrammar as xgr

from radixkv.constrained.analysis import MAX_SHORTEST_CHARS, UNVERIFIED, check_grammar, strongly_connected

RECURSIVE_REQUIRED = {"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}},
                      "$ref": "#/$defs/n"}


def schema(s):
    return check_grammar(xgr.Grammar.from_json_schema(json.dumps(s), any_whitespace=False).serialize_json())


def ebnf(text):
    return check_grammar(xgr.Grammar.from_ebnf(text).serialize_json())


def test_a_schema_whose_required_property_is_itself_has_no_output():
    """The probe's schema: it took the server down (the forced text was infinite)."""
    verdict = schema(RECURSIVE_REQUIRED)
    assert verdict.verified and "no output can satisfy it" in verdict.problem and "defs_n" in verdict.problem


@pytest.mark.parametrize("s", [
    {"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"},
    {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string"}}}, "required": ["a"]},
    {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(2000)}},
])
def test_schemas_with_finite_outputs_pass(s):
    assert schema(s).problem is None and schema(s).verified


@pytest.mark.parametrize("text, problem", [
    ('root ::= "a" root', "rule 'root'"),
    ('root ::= "a" | "b" x\nx ::= "c" x', "rule 'x'"),  # reachable after one choice only
    (f'root ::= "a"{{{MAX_SHORTEST_CHARS + 1}}}', "forces at least"),
])
def test_ebnf_that_cannot_end_soon_enough_is_refused(text, problem):
    assert problem in ebnf(text).problem


@pytest.mark.parametrize("text", ['root ::= x\nx ::= "(" x ")" | "a"', 'root ::= ("a" "b")+', 'root ::= [a-z]*'])
def test_ebnf_that_can_end_passes(text):
    assert ebnf(text).problem is None


def test_a_format_it_does_not_know_is_unverified_not_refused():
    doc = json.loads(xgr.Grammar.from_ebnf('root ::= "a"').serialize_json())
    assert check_grammar(json.dumps({**doc, "__VERSION__": "v999"})) == UNVERIFIED
    doc["grammar_expr_data"][0] = 99  # an expression type from the future
    assert check_grammar(json.dumps(doc)) == UNVERIFIED


def test_strongly_connected_groups_come_after_what_they_refer_to():
    groups = strongly_connected([[1], [0, 2], [], [3, 0]])
    assert sorted(map(sorted, groups)) == [[0, 1], [2], [3]]
    order = {node: i for i, group in enumerate(groups) for node in group}
    assert order[2] < order[0] < order[3]
