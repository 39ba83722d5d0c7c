"""When a request stops: EOS, stop token ids, stop strings, max_new_tokens, context length.

Finish reasons follow SGLang: `{"type": "stop", "matched": <token id or string>}`,
`{"type": "length", "length": <tokens>}`, `{"type": "abort", "message": ...}`.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from radixkv.sched.request import Req
from radixkv.tokenizer import trim_stop_string  # noqa: F401  (re-exported: the rule lives with the text)


REGEX_WINDOW_TOKENS = 64


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


def suppressed_ids(req: Req, eos_ids: frozenset[int], ahead: int = 0) -> tuple[int, ...]:
    """Tokens the sampler must not pick yet (EOS and stop ids before min_new_tokens), for the
    token `ahead` positions past the output so far (a draft's). A completed grammar allows only
    stop tokens, so min_new_tokens cannot hold it back."""
    if len(req.output_ids) + ahead >= req.params.min_new_tokens:
        return ()
    if req.grammar is not None and req.grammar.completed:
        return ()
    ids = set(req.params.stop_token_ids)
    if not req.params.ignore_eos:
        ids |= eos_ids
    return tuple(sorted(ids))


def finish_reason(
    req: Req, eos_ids: frozenset[int], context_length: int, decoder: Decoder | None
) -> dict[str, Any] | None:
    """Why `req` stops after its newest token, or None if it goes on.

    A stop string counts only if it ends in the newest token's text: an occurrence that ended
    earlier was either caught then or came before `min_new_tokens` and does not count.
    """
    p = req.params
    out = req.output_ids
    if out and len(out) >= p.min_new_tokens:
        last = out[-1]
        if last in p.stop_token_ids or (not p.ignore_eos and last in eos_ids):
            return {"type": "stop", "matched": last}
        if p.stop and decoder is not None:
            matched = _new_stop_string(out, p.stop, decoder)
            if matched is not None:
                return {"type": "stop", "matched": matched}
        if p.stop_regex and decoder is not None:
            matched = _new_regex_match(out, p.stop_regex, decoder)
            if matched is not None:
                return {"type": "stop", "matched": matched}
    if len(out) >= p.max_new_tokens:
        return {"type": "length", "length": len(out)}
    if req.seq_len >= context_length:
        return {"type": "length", "length": len(out)}
    return None


def _new_regex_match(out: list[int], patterns: tuple[str, ...], decoder: Decoder) -> str | None:
    """The text of the first `stop_regex` match that ends in the newest token's text, looked
    for in the last `REGEX_WINDOW_TOKENS` tokens' text (a longer match is not seen)."""
    before = decoder.decode(out[-REGEX_WINDOW_TOKENS:-1], skip_special_tokens=False)
    text = decoder.decode(out[-REGEX_WINDOW_TOKENS:], skip_special_tokens=False)
    new_from = len(before) if text.startswith(before) else 0
    for pattern in patterns:
        for m in re.compile(pattern).finditer(text):
            if m.end() > new_from and m.end() > m.start():
                return m.group(0)
    return None


def _new_stop_string(out: list[int], stops: tuple[str, ...], decoder: Decoder) -> str | None:
    window = max(len(s) for s in stops) + 2  # tokens: each decodes to at least one character
    before = decoder.decode(out[-window:-1], skip_special_tokens=False)
    text = decoder.decode(out[-window:], skip_special_tokens=False)
    if not text.startswith(before):  # the newest token changed earlier characters: re-check all
        before = ""
    for s in stops:
        if s in text[max(0, len(before) - len(s) + 1):]:
            return s
    return None
