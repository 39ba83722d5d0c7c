"""The native API (SGLang's shape): POST /generate, /tokenize, /detokenize, /abort_request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import astuple
from typing import Any

from fastapi import APIRouter, Request

from radixkv.errors import InvalidRequestError
from radixkv.results import Collected
from radixkv.sampling_params import LogprobParams, SamplingParams
from radixkv.server.http_common import (
    all_or_none,
    HTTPError,
    first_then_rest,
    parse,
    principal,
    request_body,
    streaming_response,
    until_disconnected,
)
from radixkv.server.protocol import AbortBody, DetokenizeBody, GenerateBody, TokenizeBody
from radixkv.server.tokenizer_manager import Chunk, TokenizerManager

router = APIRouter()


@router.post("/generate", openapi_extra=request_body(GenerateBody))
async def generate(request: Request):
    """Text or input_ids (one prompt or a batch), sampling_params, stream, rid, log-probs."""
    manager: TokenizerManager = request.app.state.manager
    body = await parse(request, GenerateBody)
    prompts, single = native_prompts(manager, body)
    n = len(prompts)
    params = [SamplingParams.from_dict(body.sampling_params or {})] * n
    rids = per_prompt("rid", body.rid, n)
    logprobs = [LogprobParams(*args) for args in zip(per_prompt("return_logprob", body.return_logprob, n),
                                                      per_prompt("logprob_start_len", body.logprob_start_len, n),
                                                      per_prompt("top_logprobs_num", body.top_logprobs_num, n))]
    for i, (ids, p, lp) in enumerate(zip(prompts, params, logprobs)):
        try:
            manager.check(ids, p, lp)
        except InvalidRequestError as e:
            raise InvalidRequestError(str(e) if single else f"request [{i}]: {e}") from None
    who = principal(request)
    if body.stream:
        if not single:
            raise InvalidRequestError("stream takes a single prompt")
        source = manager.stream(prompts[0], params[0], rids[0], logprob=logprobs[0], principal=who)
        first, chunks = await first_then_rest(request, source)
        if first is not None and first.error is not None:
            await source.aclose()
            first.raise_if_error()
        return streaming_response(native_events(chunks, logprobs[0]))
    results = await until_disconnected(request, all_or_none(
        *(manager.generate(ids, p, rid, logprob=lp, principal=who) for ids, p, rid, lp in
          zip(prompts, params, rids, logprobs))))
    outs = [{"text": text, "output_ids": got.ids, "meta_info": last.meta_info() | got.logprob_meta(*astuple(lp))}
            for (text, got, last), lp in zip(results, logprobs)]
    return outs[0] if single else outs


async def native_events(chunks: AsyncIterator[Chunk], logprob: LogprobParams) -> AsyncIterator[dict[str, Any]]:
    """Engine.generate_stream's chunks, one event each; an error chunk raises (the stream's tail)."""
    async for chunk in chunks:
        chunk.raise_if_error()
        piece = Collected()
        piece.add(chunk)
        yield {"text": chunk.text, "output_ids": chunk.new_ids, "finished": chunk.finished,
               "meta_info": chunk.meta_info() | piece.logprob_meta(*astuple(logprob))}


@router.post("/tokenize", openapi_extra=request_body(TokenizeBody))
async def tokenize(request: Request):
    """`text` alone (no BOS added), or chat `messages` through the template -> input_ids."""
    manager: TokenizerManager = request.app.state.manager
    body = await parse(request, TokenizeBody)
    given = [name for name in ("text", "prompt", "messages") if getattr(body, name) is not None]
    if len(given) != 1:
        raise InvalidRequestError("give exactly one of text, prompt (vLLM's name for it) or messages")
    if body.messages is not None:
        ids = manager.tokenizer.apply_chat_template([m.template_message() for m in body.messages],
                                                    body.add_generation_prompt)
    elif body.text is not None and not body.add_special_tokens:
        ids = manager.tokenizer.encode_segment(body.text)
    else:  # vLLM's prompt: special tokens added unless add_special_tokens is false
        text = body.text if body.text is not None else body.prompt
        ids = (manager.tokenizer.encode_segment(text) if body.add_special_tokens is False
               else manager.tokenizer.hf(text, add_special_tokens=True).input_ids)
    # ours, and vLLM's keys beside it
    return {"input_ids": ids, "tokens": ids, "count": len(ids), "max_model_len": manager.limits.context_length}


@router.post("/detokenize", openapi_extra=request_body(DetokenizeBody))
async def detokenize(request: Request):
    manager: TokenizerManager = request.app.state.manager
    body = await parse(request, DetokenizeBody)
    if (body.input_ids is None) == (body.tokens is None):
        raise InvalidRequestError("give exactly one of input_ids or tokens (vLLM's name for it)")
    ids = body.input_ids if body.input_ids is not None else body.tokens
    field = "input_ids" if body.input_ids is not None else "tokens"
    vocab = manager.limits.vocab_size
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise InvalidRequestError(f"{field} holds {bad[:3]}: not token ids in [0, {vocab})")
    text = manager.tokenizer.decode(ids, body.skip_special_tokens)
    return {"text": text, "prompt": text}  # ours, and vLLM's key


@router.post("/abort_request", openapi_extra=request_body(AbortBody))
async def abort_request(request: Request):
    """Stop a request this client named `rid` (its stream ends with finish_reason `abort`)."""
    manager: TokenizerManager = request.app.state.manager
    body = await parse(request, AbortBody)
    if not manager.abort(body.rid, principal(request)):
        raise HTTPError(404, f"no request {body.rid!r} in flight", "not_found")
    return {"aborted": body.rid}


def native_prompts(manager: TokenizerManager, body: GenerateBody) -> tuple[list[list[int]], bool]:
    if (body.text is None) == (body.input_ids is None):
        raise InvalidRequestError("give exactly one of text or input_ids")
    if body.text is not None:
        single = isinstance(body.text, str)
        texts = [body.text] if single else body.text
        prompts = [manager.encode_text(t) for t in texts]
    else:
        single = not body.input_ids or not isinstance(body.input_ids[0], list)
        prompts = [list(body.input_ids)] if single else [list(x) for x in body.input_ids]
    if not prompts:
        raise InvalidRequestError("the batch is empty")
    return prompts, single


def per_prompt(name: str, value, n: int) -> list:
    """One value per prompt: a list of n, or one value for all."""
    values = value if isinstance(value, list) else [value] * n
    if len(values) != n:
        raise InvalidRequestError(f"{len(values)} values of {name} for {n} prompts")
    return values
