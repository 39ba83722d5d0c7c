"""The router's HTTP front over `Router` (workers.py): the same API as one server.

| route | goes to |
|---|---|
| POST /generate, /v1/chat/completions, /v1/completions | the worker the policy picks (retried elsewhere before any byte) |
| POST /tokenize, /detokenize | any healthy worker (they serve one model) |
| POST /abort_request | the worker that has the named request, else every worker |
| GET /v1/models | a healthy worker |
| GET /health, /server_info, /metrics; POST /flush_cache | the router itself, or every worker |

The API key (one, `--api-key`) is required on every route but /health, compared in constant
time, and sent on to the workers.
"""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from radixkv.router.workers import ANY_WORKER, ROUTED, Router, RouterSettings
from radixkv.server.http.app import ApiKeyMiddleware
from radixkv.server.http.common import error_response

routes = APIRouter()


def create_router_app(settings: RouterSettings, router: Router | None = None) -> FastAPI:
    """The app over `router` (default: a `Router` over `settings.workers`)."""
    router = router if router is not None else Router(settings)

    async def lifespan(app):
        await router.start()
        yield
        await router.stop()

    app = FastAPI(title="radixkv router", lifespan=lifespan)
    app.state.router = router
    if settings.api_key:
        app.add_middleware(ApiKeyMiddleware, api_keys=(settings.api_key,))
    app.include_router(routes)
    return app


async def body_of(request: Request) -> dict[str, Any] | Response:
    try:
        body = await request.json()
    except (ValueError, RecursionError):
        return error_response(400, "the body is not valid JSON", "invalid_request_error")
    if not isinstance(body, dict):
        return error_response(400, "the body must be a JSON object", "invalid_request_error")
    return body


async def routed(request: Request) -> Response:
    body = await body_of(request)
    return body if isinstance(body, Response) else await request.app.state.router.forward(request.url.path, body)


async def any_worker(request: Request) -> Response:
    body = await body_of(request)
    return body if isinstance(body, Response) else await request.app.state.router.any_worker(request.url.path, body)


for _path in ROUTED:
    routes.add_api_route(_path, routed, methods=["POST"])
for _path in ANY_WORKER:
    routes.add_api_route(_path, any_worker, methods=["POST"])


@routes.api_route("/v1/responses/{response_id}", methods=["GET", "DELETE"])
async def stored_response(request: Request, response_id: str) -> Response:
    return await request.app.state.router.stored_response(request.method, response_id)


@routes.post("/abort_request")
async def abort(request: Request) -> Response:
    body = await body_of(request)
    return body if isinstance(body, Response) else await request.app.state.router.abort(body)


@routes.get("/health")
async def health(request: Request):
    workers = request.app.state.router.workers
    if any(w.healthy for w in workers):
        return {"status": "ok", "healthy_workers": sum(w.healthy for w in workers)}
    return error_response(503, "no healthy worker", "service_unavailable")


@routes.get("/v1/models")
async def models(request: Request):
    router = request.app.state.router
    for w in router.workers:
        if w.healthy:
            try:
                r = await router.client.get(f"{w.url}/v1/models", timeout=10)
                return Response(r.content, status_code=r.status_code, media_type="application/json")
            except httpx.HTTPError:
                continue
    return error_response(503, "no healthy worker", "service_unavailable")


@routes.get("/server_info")
async def server_info(request: Request):
    router = request.app.state.router
    return {"router": router.info(), "workers": {url: info for url, _, info in await router.fan_out("GET", "/server_info")}}


@routes.post("/flush_cache")
async def flush_cache(request: Request):
    results = await request.app.state.router.fan_out("POST", "/flush_cache")
    ok = all(status == 200 for _, status, _ in results)
    return JSONResponse({"flushed": ok, "workers": {u: s for u, s, _ in results}}, status_code=200 if ok else 409)


@routes.get("/metrics")
async def metrics(request: Request):
    router = request.app.state.router
    lines = ["# TYPE radixkv_router_routed_total counter"]
    lines += [f'radixkv_router_routed_total{{worker="{w.url}"}} {w.routed}' for w in router.workers]
    lines.append("# TYPE radixkv_router_worker_healthy gauge")
    lines += [f'radixkv_router_worker_healthy{{worker="{w.url}"}} {int(w.healthy)}' for w in router.workers]
    lines.append("# TYPE radixkv_router_retries_total counter")
    lines.append(f"radixkv_router_retries_total {router.retries}")
    return Response("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")
