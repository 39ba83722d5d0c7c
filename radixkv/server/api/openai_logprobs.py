"""Log-probs in OpenAI's shapes: chat's `{"content": [{token, logprob, bytes, top_logprobs}]}`
and completions' `{tokens, token_logprobs, top_logprobs, text_offset}` (with `echo`, the
prompt's tokens first). `job` is the `openai.Job` of the prompt (its `logprob`, its `echo`)."""

from __future__ import annotations

from typing import Any

from radixkv.results import Collected
from radixkv.server.runtime.tokenizer_manager import TokenizerManager


def token_entry(manager: TokenizerManager, token_id: int, logprob: float) -> dict[str, Any]:
    text = manager.token_text(token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(manager: TokenizerManager, job, got: Collected) -> dict[str, Any] | None:
    """OpenAI chat `logprobs`: {"content": [{token, logprob, bytes, top_logprobs}, ...]}."""
    if not job.logprob.return_logprob:
        return None
    tops = got.output_top if job.logprob.top_n else [[] for _ in got.ids]
    return {"content": [token_entry(manager, t, lp) | {"top_logprobs": [token_entry(manager, i, v) for v, i in top]}
                        for t, lp, top in zip(got.ids, got.output_logprobs, tops)]}


def completion_logprobs(manager: TokenizerManager, job, got: Collected, offset: int = 0,
                        with_prompt: bool = True) -> dict[str, Any] | None:
    """OpenAI completions `logprobs`: tokens, token_logprobs, top_logprobs, text_offset. With
    `echo` (and `with_prompt`: the piece that carries the prompt), the prompt's tokens come first,
    the first with no log-prob (null), as OpenAI and vLLM report them."""
    if not job.logprob.return_logprob:
        return None
    ids, lps, tops = list(got.ids), list(got.output_logprobs), list(got.output_top)
    if job.echo is not None and with_prompt:
        prompt = got.input_logprobs or []
        prompt_top = got.input_top or [None] * len(prompt)
        ids, lps, tops = [t for _, t in prompt] + ids, [v for v, _ in prompt] + lps, list(prompt_top) + tops
    tokens = [manager.token_text(t) for t in ids]
    offsets = []
    for tok in tokens:
        offsets.append(offset)
        offset += len(tok)
    top = ([None if alts is None else {manager.token_text(i): v for v, i in alts} for alts in tops]
           if job.logprob.top_n else None)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": top, "text_offset": offsets}
