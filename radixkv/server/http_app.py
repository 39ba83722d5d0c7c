"""The FastAPI app: native endpoints, errors, API key, body limit. OpenAI's endpoints live in
`openai_api.py` and are mounted here.

| endpoint | what |
|---|---|
| POST /generate | text or input_ids (one or a batch), sampling_params, stream, rid |
| POST /v1/chat/completions, /v1/completions | OpenAI API (`openai_api.py`) |
| GET /v1/models | the served model |
| GET /health | 200 while every process is up, else 503 |
| GET /server_info | model, KV pool (free / evictable / protected tokens), config |
| POST /flush_cache | empty the prefix cache (409 while requests run) |
| POST /abort_request | {"rid": ...}: stop a request in flight |
| POST /tokenize, /detokenize | text (or chat messages) <-> token ids, with this model's tokenizer |
| GET /metrics | Prometheus text: hit rate, token counters, queues, KV usage, TTFT, latency |

Every error is `{"error": {"message", "type", "code"}}` with a 4xx/5xx status; a bad request
changes nothing in the runtime.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from dataclasses import astuple, dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from radixkv import __version__
from radixkv.errors import EngineError, InvalidRequestError, RadixKVError
from radixkv.results import Collected
from radixkv.sampling_params import LogprobParams, SamplingParams
from radixkv.server.metrics import ServerMetrics
from radixkv.server.protocol import AbortBody, DetokenizeBody, GenerateBody, TokenizeBody
from radixkv.server.tokenizer_manager import ServiceUnavailable, TokenizerManager

logger = logging.getLogger(__name__)
DEFAULT_MAX_BODY_BYTES = 8 << 20


@dataclass(frozen=True)
class ServerSettings:
    model_name: str  # what /v1/models lists and OpenAI requests must name
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES


class HTTPError(RadixKVError):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.kind = status, kind


def error_response(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def error_of(e: Exception) -> tuple[int, str, str]:
    """(status, message, type) of an exception a handler let through."""
    if isinstance(e, HTTPError):
        return e.status, str(e), e.kind
    if isinstance(e, InvalidRequestError):
        return 400, str(e), "invalid_request_error"
    if isinstance(e, ValidationError):
        return 400, validation_message(e), "invalid_request_error"
    if isinstance(e, ServiceUnavailable):
        return 503, str(e), "service_unavailable"
    if isinstance(e, EngineError):
        return 500, str(e), "internal_error"
    return 500, f"internal error: {type(e).__name__}: {e}", "internal_error"


def validation_message(e: ValidationError) -> str:
    """pydantic's errors as one line a user can act on: which field, what is wrong."""
    parts = []
    for err in e.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "body"
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown field {where!r}")
        elif err["type"] == "missing":
            parts.append(f"missing field {where!r}")
        else:
            parts.append(f"{where}: {err['msg']}")
    more = f" (and {len(e.errors()) - 5} more)" if len(e.errors()) > 5 else ""
    return "; ".join(dict.fromkeys(parts)) + more


async def json_body(request: Request, settings: ServerSettings) -> Any:
    """The request's JSON; 413 past the size limit, 400 when malformed."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > settings.max_body_bytes:
        raise HTTPError(413, f"request body of {declared} bytes exceeds the limit of {settings.max_body_bytes} "
                             f"bytes (--max-body-bytes)")
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > settings.max_body_bytes:
            raise HTTPError(413, f"request body exceeds the limit of {settings.max_body_bytes} bytes "
                                 f"(--max-body-bytes)")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HTTPError(400, f"malformed JSON body: {e}") from None
    if not isinstance(data, dict):
        raise HTTPError(400, f"the body must be a JSON object, got {type(data).__name__}")
    return data


class ApiKeyMiddleware:
    """401 unless `Authorization: Bearer <api_key>` (every path but /health)."""

    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] != "/health":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(given, self.expected):
                response = error_response(401, "missing or wrong API key: send 'Authorization: Bearer <key>' "
                                               "(the server was started with --api-key)", "authentication_error")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()


SSE_DONE = b"data: [DONE]\n\n"


def create_app(manager: TokenizerManager, settings: ServerSettings, metrics: ServerMetrics) -> FastAPI:
    app = FastAPI(title="radixkv", version=__version__, docs_url=None, redoc_url=None)
    app.state.manager, app.state.settings, app.state.metrics = manager, settings, metrics
    app.state.child_pids, app.state.ipc_directory = {}, None

    if settings.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key)

    @app.exception_handler(RadixKVError)
    @app.exception_handler(ValidationError)
    @app.exception_handler(Exception)
    async def any_error(request: Request, e: Exception) -> JSONResponse:
        status, message, kind = error_of(e)
        if status >= 500:
            logger.error("%s %s -> %d: %s", request.method, request.url.path, status, message)
        return error_response(status, message, kind)

    @app.exception_handler(404)
    async def not_found(request: Request, exc) -> JSONResponse:
        return error_response(404, f"no endpoint {request.method} {request.url.path}", "not_found")

    @app.exception_handler(405)
    async def wrong_method(request: Request, exc) -> JSONResponse:
        return error_response(405, f"{request.url.path} does not take {request.method}", "invalid_request_error")

    # -- generation ----------------------------------------------------------------------------
    @app.post("/generate")
    async def generate(request: Request):
        body = GenerateBody.model_validate(await json_body(request, settings))
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
        if body.stream:
            if not single:
                raise InvalidRequestError("stream takes a single prompt")
            return StreamingResponse(native_stream(manager, prompts[0], params[0], rids[0], logprobs[0]),
                                     media_type="text/event-stream")
        import asyncio

        results = await asyncio.gather(*(manager.generate(ids, p, rid, logprob=lp)
                                         for ids, p, rid, lp in zip(prompts, params, rids, logprobs)))
        outs = [{"text": text, "output_ids": got.ids, "meta_info": last.meta_info() | got.logprob_meta(*astuple(lp))}
                for (text, got, last), lp in zip(results, logprobs)]
        return outs[0] if single else outs

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = TokenizeBody.model_validate(await json_body(request, settings))
        if (body.text is None) == (body.messages is None):
            raise InvalidRequestError("give exactly one of text or messages")
        if body.text is not None:
            return {"input_ids": manager.tokenizer.encode_segment(body.text)}
        return {"input_ids": manager.tokenizer.apply_chat_template(body.messages, body.add_generation_prompt)}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = DetokenizeBody.model_validate(await json_body(request, settings))
        vocab = manager.limits.vocab_size
        bad = [t for t in body.input_ids if not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(f"input_ids holds {bad[:3]}: not token ids in [0, {vocab})")
        return {"text": manager.tokenizer.decode(body.input_ids, body.skip_special_tokens)}

    @app.post("/abort_request")
    async def abort_request(request: Request):
        body = AbortBody.model_validate(await json_body(request, settings))
        if not manager.abort(body.rid):
            raise HTTPError(404, f"no request {body.rid!r} in flight", "not_found")
        return {"aborted": body.rid}

    # -- control and introspection -------------------------------------------------------------
    @app.get("/health")
    async def health():
        if manager.dead is not None:
            return error_response(503, manager.dead, "service_unavailable")
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": settings.model_name, "object": "model", "created": 0, "owned_by": "radixkv",
            "root": manager.info["model_dir"], "max_model_len": manager.limits.context_length}]}

    roles_cache: dict[str, Any] = {}

    def chat_roles() -> dict[str, Any] | None:
        """The chat template's role segments (for frontends that render turn by turn)."""
        if "roles" not in roles_cache:
            try:
                roles_cache["roles"] = manager.tokenizer.chat_roles().to_dict()
            except RadixKVError:
                roles_cache["roles"] = None
        return roles_cache["roles"]

    @app.get("/server_info")
    async def server_info():
        stats = await manager.control("stats")
        info = dict(manager.info)
        return {**info, "version": __version__, "model_name": settings.model_name,
                "chat_roles": chat_roles(),
                "processes": {"http": os.getpid(), **app.state.child_pids},
                "ipc_directory": app.state.ipc_directory,
                "kv_pool": {k: stats[k] for k in ("total_tokens", "free_tokens", "used_tokens", "evictable_tokens",
                                                  "protected_tokens", "cached_tokens_in_tree", "token_usage")},
                "requests": {"running": stats["running_requests"], "waiting": stats["waiting_requests"]},
                "stats": stats}

    @app.post("/flush_cache")
    async def flush_cache():
        if not (await manager.control("flush_cache"))["flushed"]:
            raise HTTPError(409, "the cache was not flushed: requests are in flight (retry when idle)",
                            "conflict")
        return {"flushed": True}

    @app.get("/metrics")
    async def prometheus():
        body = metrics.render(await manager.control("stats"))
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    from radixkv.server.openai_api import add_openai_routes

    add_openai_routes(app, manager, settings)
    return app


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


async def native_stream(manager: TokenizerManager, ids: list[int], params: SamplingParams, rid: str | None,
                        logprob: LogprobParams):
    """Engine.generate_stream's chunks as server-sent events, then [DONE]."""
    try:
        async for chunk in manager.stream(ids, params, rid, logprob=logprob):
            if chunk.error is not None:
                status, message, kind = error_of(_error_of_chunk(chunk))
                yield sse({"error": {"message": message, "type": kind, "code": status}})
                break
            piece = Collected()
            piece.add(chunk)
            yield sse({"text": chunk.text, "output_ids": chunk.new_ids, "finished": chunk.finished,
                       "meta_info": chunk.meta_info() | piece.logprob_meta(*astuple(logprob))})
    except RadixKVError as e:
        status, message, kind = error_of(e)
        yield sse({"error": {"message": message, "type": kind, "code": status}})
    yield SSE_DONE


def _error_of_chunk(chunk) -> Exception:
    try:
        chunk.raise_if_error()
    except Exception as e:  # noqa: BLE001
        return e
    return EngineError("unknown error")
