"""Control and introspection: GET /health, /server_info, /metrics, /cache_tree, /dashboard; POST /flush_cache."""

from __future__ import annotations

import os
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from radixkv.errors import RadixKVError
from radixkv.ipc.messages import CACHE_TREE_MAX_NODES as MAX_NODES
from radixkv.server.http.common import HTTPError, error_response, is_admin, principal, viewer
from radixkv.server.http.dashboard import PAGE as DASHBOARD
from radixkv.server.runtime.tokenizer_manager import TokenizerManager
from radixkv.version import __version__

router = APIRouter()
POOL_FIELDS = ("total_tokens", "free_tokens", "used_tokens", "evictable_tokens", "protected_tokens",
               "cached_tokens_in_tree", "token_usage", "retained_tokens", "max_cache_retention")


@router.get("/health")
async def health(request: Request):
    """200 while every process is up and the server takes requests, else 503 (a router takes
    it out)."""
    manager: TokenizerManager = request.app.state.manager
    child_died = getattr(request.app.state, "child_died", None)  # asked now, not at the watcher's next look
    if manager.dead is None and child_died is not None and (why := child_died()):
        manager.fail_all(why)
    reason = manager.dead or manager.draining
    if reason is not None:
        return error_response(503, reason, "service_unavailable")
    return {"status": "ok"}


def chat_roles(request: Request) -> dict[str, Any] | None:
    """The chat template's role segments (for frontends that render turn by turn), computed once."""
    state = request.app.state
    if not hasattr(state, "chat_roles"):
        try:
            state.chat_roles = state.manager.tokenizer.chat_roles().to_dict()
        except RadixKVError:
            state.chat_roles = None
    return state.chat_roles


@router.get("/server_info")
@router.get("/get_server_info")
async def server_info(request: Request):
    """Model, KV pool (free / evictable / protected tokens), requests, processes, config, stats;
    with SGLang's keys beside ours (`sglang_server_keys`), for its clients; `/get_server_info` is
    SGLang's older name for it."""
    state = request.app.state
    stats = await state.manager.control("stats")
    return {**sglang_server_keys(state, stats), **state.manager.info, "version": __version__, "model_name": state.settings.model_name,
            "chat_roles": chat_roles(request), "processes": {"http": os.getpid(), **state.child_pids},
            "ipc_directory": state.ipc_directory, "kv_pool": {k: stats[k] for k in POOL_FIELDS},
            "requests": {"running": stats["running_requests"], "waiting": stats["waiting_requests"]},
            "kv_events": kv_events_info(state.manager.info.get("kv_events"), stats),
            "kv_storage": {k: v for k, v in stats.items() if k.startswith("storage_")} or None,
            "disaggregation": {k: v for k, v in stats.items() if k.startswith("disagg")} or None, "stats": stats}


def kv_events_info(described: dict[str, Any] | None, stats: dict[str, Any]) -> dict[str, Any] | None:
    """Where this worker publishes KV cache events (`--kv-events-config`), and how many it has
    published; None when it publishes none."""
    if described is None:
        return None
    return {**described, "published_batches": stats.get("kv_event_batches", 0),
            "published_events": stats.get("kv_events_published", 0)}


@router.post("/flush_cache")
async def flush_cache(request: Request):
    """Empty the prefix cache (409 while requests are in flight). Only the admin key may,
    on a server with several keys (`--admin-key`): it empties every tenant's cache."""
    if not is_admin(request):
        raise HTTPError(403, "flush_cache empties every tenant's cache: only the --admin-key may", "permission_error")
    if not (await request.app.state.manager.control("flush_cache"))["flushed"]:
        raise HTTPError(409, "the cache was not flushed: requests are in flight (retry when idle)", "conflict")
    return {"flushed": True}


async def lora_body(request: Request, fields: tuple[str, ...]) -> dict[str, str]:
    """The JSON object of a /load_lora_adapter or /unload_lora_adapter call: `fields`, strings."""
    try:
        body = await request.json()
    except (ValueError, RecursionError):
        raise HTTPError(400, "the body is not valid JSON", "invalid_request_error") from None
    if not isinstance(body, dict):
        raise HTTPError(400, "the body must be a JSON object", "invalid_request_error")
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise HTTPError(400, f"{unknown[0]}: unknown field (this call takes {', '.join(fields)})", "invalid_request_error")
    for name in fields:
        if not isinstance(body.get(name), str) or not body[name]:
            raise HTTPError(400, f"{name}: a non-empty string is required", "invalid_request_error")
    return body


@router.post("/load_lora_adapter")
async def load_lora_adapter(request: Request):
    """Load a PEFT LoRA adapter (`lora_name`, `lora_path`: a directory on the server), as SGLang
    and vLLM name the call; a bad adapter is a 400 naming what is wrong, and the server keeps
    serving. Only the admin key may, on a server with several keys: it reads the server's disk."""
    if not is_admin(request):
        raise HTTPError(403, "load_lora_adapter reads the server's disk: only the --admin-key may", "permission_error")
    body = await lora_body(request, ("lora_name", "lora_path"))
    adapters = (await request.app.state.manager.control("load_lora", args=body))["adapters"]
    return {"success": True, "loaded": body["lora_name"], "adapters": sorted(adapters)}


@router.post("/unload_lora_adapter")
async def unload_lora_adapter(request: Request):
    """Unload adapter `lora_name`: a 409 while requests run or wait under it (they keep running)."""
    if not is_admin(request):
        raise HTTPError(403, "unload_lora_adapter changes every tenant's models: only the --admin-key may",
                        "permission_error")
    body = await lora_body(request, ("lora_name",))
    adapters = (await request.app.state.manager.control("unload_lora", args=body))["adapters"]
    return {"success": True, "unloaded": body["lora_name"], "adapters": sorted(adapters)}


@router.get("/cache_tree")
async def cache_tree(request: Request, limit: int = 200):
    """The radix tree's top `limit` nodes by tokens x (hits + 1), each with a text preview (see
    `radixkv.mem.tree_view`)."""
    if not 1 <= limit <= MAX_NODES:
        raise HTTPError(400, f"limit={limit}: must be in 1..{MAX_NODES}", "invalid_request_error")
    manager: TokenizerManager = request.app.state.manager
    seen_by = viewer(request)
    tree = await manager.control("cache_tree", viewer=seen_by)
    nodes = tree["nodes"][:limit]
    hide_text = seen_by == "" and principal(request) != ""  # several keys share one cache: not their text
    for node in nodes:
        ids = node.pop("preview_ids")
        node["preview"] = None if hide_text else manager.tokenizer.decode(ids)
    return {"nodes": nodes, "total_nodes": tree["total_nodes"], "total_tokens": tree["total_tokens"],
            "page_size": manager.info["page_size"]}


@router.get("/dashboard")
async def dashboard() -> HTMLResponse:
    """The live cache dashboard (`radixkv.server.http.dashboard`): a static page, open without a
    key (it holds no data); its script reads the JSON endpoints with the key from `#key=`."""
    return HTMLResponse(DASHBOARD, headers={"Cache-Control": "no-store",
                                            "Content-Security-Policy": "default-src 'self'; script-src 'unsafe-inline'; "
                                                                       "style-src 'unsafe-inline'; img-src data:"})


@router.get("/metrics")
async def metrics(request: Request):
    """Prometheus text: hit rate, token counters, queues, KV usage, TTFT, latency."""
    state = request.app.state
    body = state.metrics.render(await state.manager.control("stats"))
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")


def sglang_server_keys(state, stats: dict[str, Any]) -> dict[str, Any]:
    """The keys SGLang's `/server_info` has that ours names differently: the launch arguments
    flat at the top level, `internal_states` per DP rank, the resolved pool size."""
    info = state.manager.info
    return {**info["config"], "model_path": info["model_dir"], "tokenizer_path": info["model_dir"],
            "served_model_name": state.settings.model_name, "dp_size": 1,
            "max_total_num_tokens": info["max_total_tokens"],
            "max_req_input_len": info["limits"]["context_length"] - 1,
            "internal_states": [{"dp_rank": 0, "avg_spec_accept_length": stats["spec_tokens_per_verify"],
                                 "token_usage": stats["token_usage"]}]}
