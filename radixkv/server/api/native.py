"""The native API (SGLang's shape): POST /generate, /tokenize, /detokenize, /abort_request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import astuple
from typing import Any

from fastapi import APIRouter, Request

from radixkv.bootstrap import bootstraps
from radixkv.errors import InvalidRequestError
from radixkv.results import Collected
from radixkv.sampling_params import LogprobParams, SamplingParams
from radixkv.server.api.pipeline import Generation, Result, Serving, only
from radixkv.server.api.protocol import (
    MAX_N,
    AbortBody,
    DetokenizeBody,
    GenerateBody,
    TokenizeBody,
)
from radixkv.server.http.app import Api
from radixkv.server.http.common import (
    HTTPError,
    all_or_none,
    parse,
    principal,
    request_body,
)
from radixkv.server.runtime.tokenizer_manager import Chunk, TokenizerManager

router = APIRouter()


class Generate(Serving):
    """POST /generate: a body becomes a `NativeJob`, one generation per prompt and sample."""

    async def parse(self) -> GenerateBody:
        body = await parse(self.request, GenerateBody)
        body.refuse_features_it_lacks()
        return body

    def build(self, body: GenerateBody) -> list[Generation]:
        self.job = job = NativeJob.of(self.manager, body)
        if body.stream and len(job.prompts) != 1:
            raise InvalidRequestError("stream takes a single prompt and n=1")
        who = principal(self.request)
        rooms = bootstraps(body.bootstrap_host, body.bootstrap_port, body.bootstrap_room, len(job.prompts) // job.n)
        if job.n > 1 and any(rooms):
            raise InvalidRequestError("bootstrap_room: a prefill/decode pair runs one sample per prompt (n=1)")
        loras = self.adapters(body.lora_path, len(job.prompts) // job.n)
        return [Generation(ids, p, lp, body.namespace, rid=rid, principal=who, bootstrap=room, lora=lora)
                for ids, p, rid, lp, room, lora in zip(job.prompts, job.params, job.rids, job.logprobs,
                                                       rooms * job.n, loras * job.n)]

    def adapters(self, given, n: int) -> list[str | None]:
        """Each of `n` prompts' LoRA adapter id from `lora_path` (one name, or a list of n)."""
        if isinstance(given, list):
            if len(given) != n:
                raise InvalidRequestError(f"lora_path: a list of {len(given)} for {n} prompt(s)")
            return [self.manager.adapter_id(name, f"lora_path[{i}]") for i, name in enumerate(given)]
        return [self.manager.adapter_id(given)] * n

    async def prefill(self, generations: list[Generation]) -> None:
        """n > 1: compute each prompt once first, so its n samples read it from the cache."""
        if self.job.n > 1:
            distinct = len(generations) // self.job.n
            await all_or_none(*(g.prefill().generate(self.manager) for g in generations[:distinct]))

    def respond(self, body: GenerateBody, generations: list[Generation], results: list[Result]) -> Any:
        outs = [{"text": text, "output_ids": got.ids,
                 "meta_info": last.meta_info() | logprob_meta(self.manager, got, g.logprob, body.return_text_in_logprobs)}
                for (text, got, last), g in zip(results, generations)]
        return outs[0] if self.job.single else outs

    def events(self, body: GenerateBody, generations: list[Generation],
               chunks: AsyncIterator[tuple[int, Chunk]]) -> AsyncIterator[dict[str, Any]]:
        return native_events(self.manager, only(chunks), generations[0].logprob, body.return_text_in_logprobs)


@router.post("/generate", openapi_extra=request_body(GenerateBody))
async def generate(request: Request):
    """Text or input_ids (one prompt or a batch), sampling_params (one, or one per prompt; `n`
    samples each), stream, rid, log-probs (`return_text_in_logprobs` adds each token's text).

    As SGLang answers: with `n > 1` the results are a list, sample j of prompt i at index
    `j * prompts + i`; a stream's events carry the text and output ids so far, with the log-probs
    of that event's new tokens (`output_token_logprobs_length` counts them all)."""
    return await Generate(request).handle()


class NativeJob:
    """A /generate body as requests: one per prompt and sample, validated, in SGLang's order."""

    def __init__(self, prompts, params, rids, logprobs, single: bool, n: int):
        self.prompts: list[list[int]] = prompts
        self.params: list[SamplingParams] = params
        self.rids: list[str | None] = rids
        self.logprobs: list[LogprobParams] = logprobs
        self.single, self.n = single, n

    @classmethod
    def of(cls, manager: TokenizerManager, body: GenerateBody) -> NativeJob:
        prompts, single = native_prompts(manager, body)
        count = len(prompts)
        dicts = per_prompt("sampling_params", body.sampling_params or {}, count)
        n = samples_per_prompt(dicts)
        params = []
        for j in range(n):
            for d in dicts:
                d = {k: v for k, v in d.items() if k != "n"}
                key = next((k for k in ("seed", "sampling_seed") if d.get(k) is not None), None)
                if n > 1 and key is not None and type(d[key]) is int:  # samples differ: seed + j (others: refused below)
                    d[key] = d[key] + j
                params.append(SamplingParams.from_dict(d))
        rids = per_prompt("rid", body.rid, count)
        if n > 1 and any(r is not None for r in rids):
            rids = [None if r is None else f"{r}-{j}" for j in range(n) for r in rids]
        else:
            rids = rids * n
        logprobs = [LogprobParams(bool(r), -1 if s is None else s, t or 0) for r, s, t in
                    zip(per_prompt("return_logprob", body.return_logprob, count),
                        per_prompt("logprob_start_len", body.logprob_start_len, count),
                        per_prompt("top_logprobs_num", body.top_logprobs_num, count))] * n
        prompts = prompts * n
        for i, (ids, p, lp) in enumerate(zip(prompts, params, logprobs)):
            try:
                manager.check(ids, p, lp)
            except InvalidRequestError as e:
                raise InvalidRequestError(str(e) if single and n == 1 else f"request [{i}]: {e}") from None
        return cls(prompts, params, rids, logprobs, single and n == 1, n)


def samples_per_prompt(dicts: list[dict[str, Any]]) -> int:
    """`sampling_params.n`, the same for every prompt (SGLang's rule)."""
    values = {d.get("n") if d.get("n") is not None else 1 for d in dicts}
    if len(values) != 1:
        raise InvalidRequestError(f"sampling_params.n differs between prompts ({sorted(values)}): give one n")
    (n,) = values
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise InvalidRequestError(f"sampling_params.n={n!r}: must be an integer in [1, {MAX_N}]")
    return n


def logprob_meta(manager: TokenizerManager, got: Collected, lp: LogprobParams, with_text: bool) -> dict[str, Any]:
    """The log-prob entries of `meta_info`, each `[logprob, token_id]` or, `with_text`,
    `[logprob, token_id, text]` (SGLang's `return_text_in_logprobs`)."""
    meta = got.logprob_meta(*astuple(lp))
    if not meta:
        return meta
    if with_text:
        for key in ("output_token_logprobs", "input_token_logprobs"):
            if key in meta:
                meta[key] = [with_token_text(manager, e) for e in meta[key]]
        for key in ("output_top_logprobs", "input_top_logprobs"):
            if key in meta:
                meta[key] = [None if alts is None else [with_token_text(manager, e) for e in alts]
                             for alts in meta[key]]
    return meta


def with_token_text(manager: TokenizerManager, entry: list) -> list:
    return [entry[0], entry[1], manager.token_text(entry[1])]


async def native_events(manager: TokenizerManager, chunks: AsyncIterator[Chunk], logprob: LogprobParams,
                        with_text: bool) -> AsyncIterator[dict[str, Any]]:
    """One event per chunk, as SGLang streams: `text` and `output_ids` so far, the log-probs of
    this event's tokens; an error chunk raises (the stream's tail)."""
    text, ids, logprobs_sent = "", [], 0
    async for chunk in chunks:
        chunk.raise_if_error()
        text += chunk.text
        ids.extend(chunk.new_ids)
        piece = Collected()
        piece.add(chunk)
        meta = chunk.meta_info() | logprob_meta(manager, piece, logprob, with_text)
        if logprob.return_logprob:
            logprobs_sent += len(chunk.new_ids)
            meta["output_token_logprobs_length"] = logprobs_sent
        yield {"text": text, "output_ids": list(ids), "finished": chunk.finished, "meta_info": meta}


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
        shown = body.rid if len(body.rid) <= 80 else f"{body.rid[:80]}... ({len(body.rid)} characters)"
        raise HTTPError(404, f"no request {shown!r} in flight", "not_found")
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


API = Api(router)
