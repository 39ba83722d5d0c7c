"""The FastAPI app: the routers of each API, the API key, the error handlers, and an OpenAPI
document that describes the request bodies the routes really take.

| router | endpoints |
|---|---|
| `native_api.py` | POST /generate, /tokenize, /detokenize, /abort_request |
| `openai_api.py` | GET /v1/models; POST /v1/chat/completions, /v1/completions |
| `responses_api.py` | POST /v1/responses; GET, DELETE /v1/responses/{id} |
| `anthropic_api.py` | POST /v1/messages, /v1/messages/count_tokens |
| `admin_api.py` | GET /health, /server_info, /metrics, /cache_tree, /dashboard; POST /flush_cache |

Every error is `{"error": {"message", "type", "code"}}` with a 4xx/5xx status
(`http_common.error_of` maps the core's typed errors), except on Anthropic's Messages API,
whose errors are Anthropic's shape (`error_answer`); a bad request changes nothing in the
runtime.
"""

from __future__ import annotations

import logging
import secrets

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from radixkv.errors import RadixKVError
from radixkv.server import (
    admin_api,
    anthropic_api,
    native_api,
    openai_api,
    responses_api,
    sglang_api,
)
from radixkv.server.http_common import (
    BODY_MODELS,
    DEFAULT_MAX_BODY_BYTES,
    ClientDisconnected,
    ServerSettings,
    error_of,
    error_response,
)
from radixkv.server.metrics import ServerMetrics
from radixkv.server.response_store import ResponseStore
from radixkv.server.tokenizer_manager import TokenizerManager
from radixkv.version import __version__

__all__ = ["DEFAULT_MAX_BODY_BYTES", "ServerSettings", "create_app"]
logger = logging.getLogger(__name__)
OPEN_PATHS = ("/health", "/dashboard")  # no key: liveness, and a page without data (its script sends the key)


class ApiKeyMiddleware:
    """401 unless `Authorization: Bearer <key>` or `x-api-key: <key>` (Anthropic's header) names
    one of the keys (every path but `OPEN_PATHS`).

    Keys are compared in constant time, all of them every time, against both headers; the key
    that matched is the request's principal (`http_common.principal`)."""

    def __init__(self, app, api_keys: tuple[str, ...]):
        self.app = app
        self.keys = [key.encode() for key in api_keys]

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            headers = dict(scope["headers"])
            bearer, api_key = headers.get(b"authorization"), headers.get(b"x-api-key")
            matched = None
            for i, key in enumerate(self.keys):
                by_bearer = bearer is not None and secrets.compare_digest(bearer, b"Bearer " + key)
                by_api_key = api_key is not None and secrets.compare_digest(api_key, key)
                if (by_bearer or by_api_key) and matched is None:
                    matched = i
            if matched is None:
                response = error_answer(scope["path"], 401, "missing or wrong API key: send 'Authorization: Bearer "
                                        "<key>' or 'x-api-key: <key>' (the server was started with --api-key)",
                                        "authentication_error")
                await response(scope, receive, send)
                return
            scope.setdefault("state", {})["principal"] = f"key{matched}"
        await self.app(scope, receive, send)


def error_answer(path: str, status: int, message: str, kind: str) -> JSONResponse:
    """An error in the shape of the API `path` belongs to: Anthropic's on its Messages API
    (`anthropic_api.serves`), ours everywhere else."""
    if anthropic_api.serves(path):
        return anthropic_api.error_response(status, message)
    return error_response(status, message, kind)


def create_app(manager: TokenizerManager, settings: ServerSettings, metrics: ServerMetrics) -> FastAPI:
    app = FastAPI(title="radixkv", version=__version__, docs_url=None, redoc_url=None)
    app.state.manager, app.state.settings, app.state.metrics = manager, settings, metrics
    app.state.child_pids, app.state.ipc_directory = {}, None
    app.state.responses = ResponseStore(settings.responses_store_size, settings.responses_store_ttl)
    if settings.api_keys:
        app.add_middleware(ApiKeyMiddleware, api_keys=settings.api_keys)
    for router in (native_api.router, openai_api.router, responses_api.router, anthropic_api.router,
                   admin_api.router, sglang_api.router):
        app.include_router(router)

    @app.exception_handler(RadixKVError)
    @app.exception_handler(ValidationError)
    @app.exception_handler(Exception)
    async def any_error(request: Request, e: Exception) -> JSONResponse:
        status, message, kind = error_of(e)
        if status >= 500:
            logger.error("%s %s -> %d: %s", request.method, request.url.path, status, message)
        return error_answer(request.url.path, status, message, kind)

    @app.exception_handler(ClientDisconnected)
    async def client_left(request: Request, e: Exception) -> Response:
        return Response(status_code=499)  # nobody reads it: the work for them was cancelled

    @app.exception_handler(404)
    async def not_found(request: Request, exc) -> JSONResponse:
        return error_answer(request.url.path, 404, f"no endpoint {request.method} {request.url.path}", "not_found")

    @app.exception_handler(405)
    async def wrong_method(request: Request, exc) -> JSONResponse:
        return error_answer(request.url.path, 405, f"{request.url.path} does not take {request.method}",
                            "invalid_request_error")

    app.openapi = lambda: openapi_document(app)
    return app


def openapi_document(app: FastAPI) -> dict:
    """FastAPI's document, with each route's request body model (routes parse their bodies
    themselves, for the limits and messages of `http_common.json_body`, so FastAPI cannot see
    them) and a bearer-key security scheme when the server takes keys."""
    if app.openapi_schema is None:
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        for name, model in BODY_MODELS.items():
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(schema.pop("$defs", {}))
            schemas[name] = schema
        served = [app.state.settings.model_name, app.state.manager.info["model_dir"]]
        for schema in schemas.values():  # the one model OpenAI requests may name
            if "model" in schema.get("properties", {}):
                schema["properties"]["model"] = {"type": "string", "enum": served, "title": "Model"}
        if app.state.settings.api_keys:
            doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            doc["security"] = [{"bearer": []}]
        app.openapi_schema = doc
    return app.openapi_schema
