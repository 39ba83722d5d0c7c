"""What a constrained request asks for (`sampling_params.regex` / `json_schema` / `ebnf`), and
the checks that need no tokenizer: its kind, its size, and its syntax (xgrammar parses it).

Compiling a grammar against the vocabulary, and everything after, is `radixkv.constrained`'s.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from radixkv.errors import InvalidRequestError
from radixkv.json_text import check_depth, loads_bounded

GRAMMAR_FIELDS = ("regex", "json_schema", "ebnf")
MAX_GRAMMAR_CHARS = 1 << 18
"""Longest grammar source accepted (256 KiB of text): parsing is checked on the request's path."""


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    kind: str  # one of GRAMMAR_FIELDS
    source: str  # the pattern, the schema as JSON text, or the grammar

    @classmethod
    def of(cls, params: Any) -> GrammarSpec | None:
        """The grammar a `SamplingParams` asks for, if any."""
        for kind in GRAMMAR_FIELDS:
            value = getattr(params, kind, None)
            if value is not None:
                return cls(kind, value)
        return None

    def check(self) -> None:
        """Parse the grammar (no tokenizer needed); `InvalidRequestError` naming the field."""
        import xgrammar as xgr

        if len(self.source) > MAX_GRAMMAR_CHARS:
            raise InvalidRequestError(f"sampling_params.{self.kind}: {len(self.source)} characters, more than "
                                      f"the {MAX_GRAMMAR_CHARS} accepted")
        try:
            if self.kind == "regex":
                xgr.Grammar.from_regex(self.source)
            elif self.kind == "json_schema":
                xgr.Grammar.from_json_schema(self.source, any_whitespace=False)
            else:
                xgr.Grammar.from_ebnf(self.source)
        except Exception as e:  # noqa: BLE001 - xgrammar raises several types for bad input
            raise InvalidRequestError(f"sampling_params.{self.kind}: invalid {self.kind}: {grammar_error_reason(e)}") from None


def grammar_error_reason(e: Exception) -> str:
    """xgrammar's message without its timestamp and C++ source location."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return re.sub(r"^\[[\d:]+\] [^ ]+:\d+: ", "", text)


UNHONOURED_KEYWORDS = ("not", "if", "then", "else", "uniqueItems", "contains", "minContains", "maxContains",
                       "dependentRequired", "dependentSchemas", "dependencies", "$dynamicRef", "$recursiveRef")
"""JSON schema keywords the grammar compiler (xgrammar) accepts but does not enforce: a schema
using one is refused, naming it, rather than served an output that breaks it (`allOf` too,
with more than one schema)."""
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")  # name -> schema
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMAS = ("items", "additionalProperties", "unevaluatedProperties", "propertyNames", "additionalItems")


def check_schema_keywords(schema: Any, where: str) -> None:
    """`InvalidRequestError` naming the path of the first keyword constrained decoding would not
    honour (`UNHONOURED_KEYWORDS`, a several-schema `allOf`) in `schema` and its subschemas."""
    stack = [(schema, where)]
    while stack:
        node, path = stack.pop()
        if not isinstance(node, dict):
            continue
        for key in UNHONOURED_KEYWORDS:
            if key in node:
                raise InvalidRequestError(f"{path}.{key}: the JSON schema keyword {key!r} is not supported here "
                                          f"(constrained decoding would not enforce it); remove it")
        if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
            raise InvalidRequestError(f"{path}.allOf: an allOf of {len(node['allOf'])} schemas is not supported "
                                      f"here (constrained decoding would not enforce it); merge them into one")
        for key in _SCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                stack.extend((v, f"{path}.{key}.{name}") for name, v in node[key].items())
        for key in _SCHEMA_LISTS:
            if isinstance(node.get(key), list):
                stack.extend((v, f"{path}.{key}[{i}]") for i, v in enumerate(node[key]))
        for key in _SCHEMAS:
            if isinstance(node.get(key), list):
                stack.extend((v, f"{path}.{key}[{i}]") for i, v in enumerate(node[key]))
            elif key in node:
                stack.append((node[key], f"{path}.{key}"))


def normalise_json_schema(value: Any) -> str:
    """A schema given as a dict or JSON text, as compact JSON text (the cache key)."""
    if isinstance(value, str):
        value = loads_bounded(value, "sampling_params.json_schema")
    else:
        check_depth(value, "sampling_params.json_schema")
    if not isinstance(value, (dict, bool)):
        raise InvalidRequestError("sampling_params.json_schema: must be a JSON object (a schema)")
    check_schema_keywords(value, "sampling_params.json_schema")
    return json.dumps(value, separators=(",", ":"))  # key order kept: it orders the output
