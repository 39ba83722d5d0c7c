"""SGLang's introspection endpoints, in SGLang's shapes, for the clients built on them (its
frontend's `RuntimeEndpoint`, its router, its benchmark scripts).

    GET  /model_info, /get_model_info     model path, tokenizer path, is_generation, architectures
    GET  /get_load, /v1/loads             requests running and waiting, KV tokens used, per DP rank
    GET  /health_generate                 200 once one token decodes (503 while it cannot)
    POST /concate_and_append_request      the frontend's parallel-encoding join (see its docstring)

`/server_info` (and SGLang's older name for it, `/get_server_info`) carries SGLang's keys
beside ours: `radixkv.server.http.admin`.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone

from fastapi import APIRouter, Request

from radixkv.errors import RadixKVError
from radixkv.sampling_params import SamplingParams
from radixkv.server.api.protocol import ConcatAppendBody
from radixkv.server.http.app import Api
from radixkv.server.http.common import error_response, parse, request_body
from radixkv.server.runtime.tokenizer_manager import TokenizerManager
from radixkv.version import __version__

router = APIRouter()
HEALTH_GENERATE_TIMEOUT = 60.0


@router.get("/model_info")
@router.get("/get_model_info")
async def model_info(request: Request):
    """What SGLang's `/model_info` reports: clients pick a chat template from `model_path`."""
    state = request.app.state
    info = state.manager.info
    return {"model_path": info["model_dir"], "tokenizer_path": info["model_dir"],
            "served_model_name": state.settings.model_name, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": "default", "has_image_understanding": False,
            "has_audio_understanding": False,
            "architectures": [info["architecture"]]}


@router.get("/get_load")
async def get_load(request: Request):
    """SGLang's per-rank load: requests running plus waiting, waiting, KV tokens in use."""
    s = await request.app.state.manager.control("stats")
    return [{"dp_rank": 0, "num_reqs": s["running_requests"] + s["waiting_requests"],
             "num_waiting_reqs": s["waiting_requests"], "num_tokens": s["used_tokens"]}]


@router.get("/v1/loads")
async def loads(request: Request):
    """SGLang's `/v1/loads` (its core and memory sections)."""
    state = request.app.state
    s = await state.manager.control("stats")
    config = state.manager.info["config"]
    return {"timestamp": datetime.now(timezone.utc).isoformat(), "version": __version__,
            "accelerator": state.manager.info["device"], "num_accelerators": config.get("tp_size", 1),
            "loads": [{"dp_rank": 0, "timestamp": time.time(), "num_running_reqs": s["running_requests"],
                       "num_waiting_reqs": s["waiting_requests"], "num_used_tokens": s["used_tokens"],
                       "num_total_tokens": s["total_tokens"], "max_total_num_tokens": s["total_tokens"],
                       "max_running_requests": config.get("max_running_requests"),
                       "token_usage": s["token_usage"], "cache_hit_rate": s["cache_hit_rate"]}]}


@router.get("/health_generate")
async def health_generate(request: Request):
    """200 once the model decodes one token (a real request through every process), 503 when
    it cannot: SGLang's deep health check, for routers that probe with it."""
    manager: TokenizerManager = request.app.state.manager
    reason = manager.dead or manager.draining
    if reason is not None:
        return error_response(503, reason, "service_unavailable")
    try:
        await asyncio.wait_for(manager.generate([0], SamplingParams(max_new_tokens=1, temperature=0.0)),
                               HEALTH_GENERATE_TIMEOUT)
    except (RadixKVError, asyncio.TimeoutError) as e:
        return error_response(503, f"a one-token request failed: {type(e).__name__}: {e}", "service_unavailable")
    return {"status": "ok"}


@router.post("/concate_and_append_request", openapi_extra=request_body(ConcatAppendBody))
async def concate_and_append_request(request: Request):
    """SGLang frontend's parallel encoding (`fork` + `join(mode="concate_and_append")`): the
    forks' prompts were each computed after the shared prefix; SGLang splices their KV after
    the destination's, positions as computed, which approximates attention over the joined
    text. Here the join is exact instead: nothing is spliced, and the destination's next request
    (the joined text) reuses the cached shared prefix and computes the forks' text in context,
    so its output equals running the joined text from scratch. Accepted and validated."""
    body = await parse(request, ConcatAppendBody)
    return {"success": True, "dst_rid": body.dst_rid, "src_rids": body.src_rids, "mode": "exact (recomputed)"}


API = Api(router)
