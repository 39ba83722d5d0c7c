"""Does every output a grammar starts have an end? Checked on xgrammar's own parse of it.

A grammar in which some reachable rule derives no finite string (a JSON schema whose required
property is the schema itself, an EBNF rule that always recurses) has states from which the
only way on is forever: no output can satisfy it, and the text it forces from such a state is
infinite (asking xgrammar for it grows memory until the process dies). The same holds, short of
forever, for rules whose shortest text is enormous. `check_grammar` finds both before anything
is compiled, by the shortest text each rule derives: a fixed point over the rules, read from
`Grammar.serialize_json()` (expression types as in xgrammar's `GrammarExprType`).

A grammar in a format this module does not know (another xgrammar) is `UNVERIFIED`: it is
served, but without jump-forward, which is the one step that would run away.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

KNOWN_FORMATS = ("v18",)  # xgrammar 0.2.x's serialized grammar
MAX_SHORTEST_CHARS = 100_000
"""A rule whose shortest text is longer than this is refused: it forces that much text."""

# GrammarExprType, in xgrammar's order; each expression is [type, n, data...] in the CSR arrays
BYTE_STRING, CHAR_CLASS, CHAR_CLASS_STAR, EMPTY, RULE_REF, SEQUENCE, CHOICES, TAG_DISPATCH, REPEAT, TOKEN, \
    EXCLUDE_TOKEN, TOKEN_TAG_DISPATCH, REGEX = range(13)


@dataclass(frozen=True, slots=True)
class Verdict:
    """`problem`: why no output can satisfy the grammar (None: every output can end);
    `verified`: whether the grammar could be analysed at all."""

    problem: str | None = None
    verified: bool = True


UNVERIFIED = Verdict(None, False)


class _Unknown(Exception):
    pass


class _Grammar:
    def __init__(self, data: dict):
        self.rules = data["rules"]
        self.values = data["grammar_expr_data"]
        self.starts = data["grammar_expr_indptr"]
        self.root = data["root_rule_id"]

    def expr(self, i: int) -> tuple[int, list[int]]:
        start = self.starts[i]
        kind, n = self.values[start], self.values[start + 1]
        return kind, self.values[start + 2: start + 2 + n]

    def body(self, rule: int) -> int:
        return self.rules[rule][1]

    def name(self, rule: int) -> str:
        return self.rules[rule][0]

    def referenced_rules(self, i: int) -> list[int]:
        """Rules the expression `i` may enter."""
        kind, data = self.expr(i)
        if kind == RULE_REF:
            return [data[0]]
        if kind == REPEAT:
            return [data[0]]
        if kind in (SEQUENCE, CHOICES):
            return [r for e in data for r in self.referenced_rules(e)]
        if kind == TAG_DISPATCH:
            return list(data[1:-2:2])
        if kind == TOKEN_TAG_DISPATCH:
            count = data[0]
            return [data[2 + 2 * k] for k in range(count)]
        if kind in (BYTE_STRING, CHAR_CLASS, CHAR_CLASS_STAR, EMPTY, TOKEN, EXCLUDE_TOKEN, REGEX):
            return []
        raise _Unknown(kind)

    def shortest(self, i: int, rule_len: list[float], memo: dict[int, float]) -> float:
        """Characters in the shortest text expression `i` derives, given each rule's so far."""
        if i in memo:
            return memo[i]
        kind, data = self.expr(i)
        if kind == BYTE_STRING:
            value = float(len(data))
        elif kind in (CHAR_CLASS, TOKEN, EXCLUDE_TOKEN, REGEX):
            value = 1.0
        elif kind in (CHAR_CLASS_STAR, EMPTY, TAG_DISPATCH, TOKEN_TAG_DISPATCH):
            value = 0.0  # each may end at once
        elif kind == RULE_REF:
            value = rule_len[data[0]]
        elif kind == SEQUENCE:
            value = sum(self.shortest(e, rule_len, memo) for e in data)
        elif kind == CHOICES:
            value = min((self.shortest(e, rule_len, memo) for e in data), default=math.inf)
        elif kind == REPEAT:
            rule, low = data[0], data[1]
            value = 0.0 if low == 0 else low * rule_len[rule]
        else:
            raise _Unknown(kind)
        memo[i] = value
        return value


def check_grammar(serialized: str) -> Verdict:
    """The verdict on a grammar given as `xgrammar.Grammar.serialize_json()`."""
    try:
        data = json.loads(serialized)
        if data.get("__VERSION__") not in KNOWN_FORMATS:
            return UNVERIFIED
        g = _Grammar(data)
        edges = [g.referenced_rules(g.body(r)) for r in range(len(g.rules))]
        reachable, todo = {g.root}, [g.root]
        while todo:
            for r in edges[todo.pop()]:
                if r not in reachable:
                    reachable.add(r)
                    todo.append(r)
        rule_len = [math.inf] * len(g.rules)
        for group in strongly_connected(edges):  # the rules a group refers to are done before it
            for _ in range(len(group) + 1):  # lengths only fall; each pass settles one more rule
                memo: dict[int, float] = {}
                changed = False
                for r in group:
                    value = g.shortest(g.body(r), rule_len, memo)
                    if value < rule_len[r]:
                        rule_len[r], changed = value, True
                if not changed:
                    break
    except (_Unknown, KeyError, IndexError, TypeError, ValueError):
        return UNVERIFIED
    endless = sorted(g.name(r) for r in reachable if rule_len[r] == math.inf)
    if endless:
        return Verdict(f"no output can satisfy it: {_names(endless)} never end, every way through them leads "
                       f"back into them (a required property, or a rule, that contains itself?)")
    longest = max(reachable, key=lambda r: rule_len[r])
    if rule_len[longest] > MAX_SHORTEST_CHARS:
        return Verdict(f"rule {g.name(longest)!r} forces at least {int(rule_len[longest])} characters of output, "
                       f"more than the {MAX_SHORTEST_CHARS} accepted")
    return Verdict()


def strongly_connected(edges: list[list[int]]) -> list[list[int]]:
    """The strongly connected groups of the graph `edges` (node -> the nodes it refers to), each
    listed after every group it refers to (Tarjan's algorithm, without recursion)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    groups: list[list[int]] = []
    for start in range(len(edges)):
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(edges[node]):
                work.append((node, i + 1))
                nxt = edges[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                groups.append(group)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return groups


def _names(rules: list[str]) -> str:
    shown = ", ".join(repr(r) for r in rules[:3])
    return f"rule {shown}" if len(rules) == 1 else f"rules {shown}" + (" ..." if len(rules) > 3 else "")
