"""The FastAPI app: the API key, the error handlers, the admin routes, each API's routes (given
by the caller: `radixkv.server.api.APIS`), and an OpenAPI document that describes the request
bodies the routes really take.

Every error is `{"error": {"message", "type", "code"}}` with a 4xx/5xx status
(`common.error_of` maps the core's typed errors), except under an API whose errors have a shape
of their own (`Api.error_response`: Anthropic's Messages API); a bad request changes nothing in
the runtime.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from radixkv.errors import RadixKVError
from radixkv.server.http import admin
from radixkv.server.http.common import (
    BODY_MODELS,
    DEFAULT_MAX_BODY_BYTES,
    ClientDisconnected,
    ServerSettings,
    error_of,
    error_response,
)
from radixkv.server.http.metrics import ServerMetrics
from radixkv.server.runtime.tokenizer_manager import TokenizerManager
from radixkv.tenancy import principal_of
from radixkv.version import __version__

__all__ = ["DEFAULT_MAX_BODY_BYTES", "Api", "ServerSettings", "create_app"]
ErrorResponse = Callable[[int, str, str], JSONResponse]  # (status, message, type) -> the answer


@dataclass(frozen=True)
class Api:
    """One API the server speaks: its routes; when its errors have a shape of their own, the
    paths that answer in it (`prefix` and below) and how (`error_response`); and what it keeps
    on the app (`setup`, e.g. the Responses API's store)."""

    router: APIRouter
    prefix: str | None = None
    error_response: ErrorResponse | None = None
    setup: Callable[[FastAPI, ServerSettings], None] | None = None

    def serves(self, path: str) -> bool:
        return self.prefix is not None and (path == self.prefix or path.startswith(self.prefix + "/"))


logger = logging.getLogger(__name__)
OPEN_PATHS = ("/health", "/dashboard")  # no key: liveness, and a page without data (its script sends the key)


class ApiKeyMiddleware:
    """401 unless `Authorization: Bearer <key>` or `x-api-key: <key>` (Anthropic's header) names
    one of the keys (every path but `OPEN_PATHS`).

    Keys are compared in constant time, all of them every time, against both headers; the key
    that matched is the request's principal (`common.principal`: a digest of the key, or '' when
    the server has one principal), and whether it is the admin key (`common.is_admin`)."""

    def __init__(self, app, api_keys: tuple[str, ...], admin_key: str | None = None,
                 answer: Callable[[str, int, str, str], Response] | None = None):
        self.app = app
        keys = [*api_keys, *([admin_key] if admin_key is not None else [])]
        self.keys = [key.encode() for key in keys]
        several = len(keys) > 1
        self.principals = [principal_of(key) if several else "" for key in keys]
        self.admin = [admin_key is None and not several or key == admin_key for key in keys]
        self.answer = answer or (lambda path, status, message, kind: error_response(status, message, kind))

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
                response = self.answer(scope["path"], 401, "missing or wrong API key: send 'Authorization: "
                                       "Bearer <key>' or 'x-api-key: <key>' (the server was started with --api-key)",
                                       "authentication_error")
                await response(scope, receive, send)
                return
            state = scope.setdefault("state", {})
            state["principal"], state["admin"] = self.principals[matched], self.admin[matched]
        await self.app(scope, receive, send)


def create_app(manager: TokenizerManager, settings: ServerSettings, metrics: ServerMetrics,
               apis: Sequence[Api] = ()) -> FastAPI:
    app = FastAPI(title="radixkv", version=__version__, docs_url=None, redoc_url=None)
    app.state.manager, app.state.settings, app.state.metrics = manager, settings, metrics
    app.state.child_pids, app.state.ipc_directory = {}, None

    def error_answer(path: str, status: int, message: str, kind: str) -> JSONResponse:
        """An error in the shape of the API `path` belongs to."""
        own = next((api.error_response for api in apis if api.error_response is not None and api.serves(path)), None)
        return (own or error_response)(status, message, kind)

    if settings.api_keys:
        app.add_middleware(ApiKeyMiddleware, api_keys=settings.api_keys, admin_key=settings.admin_key,
                           answer=error_answer)
    for api in apis:
        if api.setup is not None:
            api.setup(app, settings)
        app.include_router(api.router)
    app.include_router(admin.router)

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
    themselves, for the limits and messages of `common.json_body`, so FastAPI cannot see
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
