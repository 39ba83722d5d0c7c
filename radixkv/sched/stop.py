"""When a request stops: EOS, stop token ids, stop strings, max_new_tokens, context length.

Finish reasons follow SGLang: `{"type": "stop", "matched": <token id or string>}`,
`{"type": "length", "length": <tokens>}`, `{"type": "abort", "message": ...}`.
"""

from __future__ import annotations

from typing import Any, Protocol

from radixkv.sched.request import Req


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


def suppressed_ids(req: Req, eos_ids: frozenset[int]) -> tuple[int, ...]:
    """Tokens the sampler must not pick yet (EOS and stop ids before min_new_tokens)."""
    if len(req.output_ids) >= req.params.min_new_tokens:
        return ()
    ids = set(req.params.stop_token_ids)
    if not req.params.ignore_eos:
        ids |= eos_ids
    return tuple(sorted(ids))


def finish_reason(
    req: Req, eos_ids: frozenset[int], context_length: int, decoder: Decoder | None
) -> dict[str, Any] | None:
    """Why `req` stops after its newest token, or None if it goes on."""
    p = req.params
    out = req.output_ids
    if out and len(out) >= p.min_new_tokens:
        last = out[-1]
        if last in p.stop_token_ids or (not p.ignore_eos and last in eos_ids):
            return {"type": "stop", "matched": last}
        if p.stop and decoder is not None:
            longest = max(len(s) for s in p.stop)
            tail = decoder.decode(out[-(longest + 2):], skip_special_tokens=False)
            for s in p.stop:
                if s in tail:
                    return {"type": "stop", "matched": s}
    if len(out) >= p.max_new_tokens:
        return {"type": "length", "length": len(out)}
    if req.seq_len >= context_length:
        return {"type": "length", "length": len(out)}
    return None


def trim_stop_string(text: str, reason: dict[str, Any] | None) -> str:
    """Cut the output text before the stop string that ended it (SGLang's default)."""
    if reason and reason.get("type") == "stop" and isinstance(reason.get("matched"), str):
        cut = text.find(reason["matched"])
        if cut >= 0:
            return text[:cut]
    return text
