"""Constrained decoding: regex, JSON schema and EBNF grammars (xgrammar), with jump-forward.

    service.py   GrammarService: compiles off the scheduler's loop, in its own process, under a
                 time and memory budget; cached by source
    worker.py    that process: parse, check, compile, send back serialized
    analysis.py  whether every output a grammar starts can end (refuses those that cannot)
    matcher.py   RequestGrammar: one request's mask, accept, jump-forward; mask helpers

What a request asks for, and its syntax check, is `radixkv.grammar_spec` (below this layer).
"""

from radixkv.constrained.matcher import RequestGrammar, allocate_mask, apply_mask
from radixkv.constrained.service import Compiled, GrammarBudget, GrammarService, Refused

__all__ = ["Compiled", "GrammarBudget", "GrammarService", "Refused", "RequestGrammar", "allocate_mask",
           "apply_mask"]
