"""`radixkv router --pd-disaggregation`: each request to a prefill server and a decode server.

As SGLang's PD router does: the prefill server is chosen by the policy (cache-aware by default:
a conversation's turns land where its prefix is), the decode server by load; the body goes to
both with `bootstrap_host` (the prefill server's host), `bootstrap_port` (its bootstrap port, or
None) and a random 63-bit `bootstrap_room` (one per prompt of a batch) added. The prefill
server computes the prompt and sends its KV to the decode server, whose answer (streamed or
whole) is the client's. The prefill server is sent the body unstreamed: its reply only says
whether the prefill worked.

Faults: a prefill server that fails (no answer, or a 5xx) ends the request at once with a 502
naming it (a stream: its error event), one that refuses it (a 4xx: bad request, full) with its
own answer; either way the decode request is dropped (its server aborts it when the connection
closes, and frees its pages once the transfer is settled); a decode
server that fails before any byte is tried on another decode server with a new room and the
same prefill server. The APIs a pair does not serve (Responses, Anthropic) go to a decode
server whole.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlparse

import httpx
from fastapi.responses import Response, StreamingResponse

from radixkv.router.workers import Router, RouterSettings, routing_key, stream_failure
from radixkv.server.http.common import error_response

logger = logging.getLogger(__name__)
PD_PATHS = ("/generate", "/v1/chat/completions", "/v1/completions")
ROOM_MAX = (1 << 63) - 1


def batch_size(path: str, body: dict[str, Any]) -> int | None:
    """How many prompts a /generate body holds (None: one, not a list)."""
    if path != "/generate":
        return None
    text, ids = body.get("text"), body.get("input_ids")
    if isinstance(text, list):
        return len(text)
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        return len(ids)
    return None


def with_bootstrap(path: str, body: dict[str, Any], host: str, port: int | None) -> dict[str, Any]:
    """`body` with the pair's bootstrap fields (lists for a batch), each prompt its own room."""
    n = batch_size(path, body)
    if n is None:
        return {**body, "bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": random.randint(0, ROOM_MAX)}
    return {**body, "bootstrap_host": [host] * n, "bootstrap_port": [port] * n,
            "bootstrap_room": [random.randint(0, ROOM_MAX) for _ in range(n)]}


class PDRouter(Router):
    """Prefill servers (with their bootstrap ports) and decode servers (see the module docstring)."""

    def __init__(self, settings: RouterSettings, prefill: tuple[tuple[str, int | None], ...],
                 decode: tuple[str, ...]):
        super().__init__(RouterSettings((*[u for u, _ in prefill], *decode), settings.policy, settings.api_key,
                                        settings.health_interval, settings.request_timeout, settings.tree_capacity))
        self.bootstrap_ports = [port for _, port in prefill]
        self.prefill_ids = set(range(len(prefill)))
        self.decode_ids = set(range(len(prefill), len(self.workers)))
        self.pairs = 0

    async def forward(self, path: str, body: dict[str, Any]) -> Response:
        if path not in PD_PATHS:  # served whole by a decode server
            return await self._whole(path, body)
        key, pin = routing_key(path, body)
        p = self.choose(key, pin, self.decode_ids)
        if p is None:
            return error_response(503, "no healthy prefill server", "service_unavailable")
        host = urlparse(self.workers[p].url).hostname or "127.0.0.1"
        tried: set[int] = set(self.prefill_ids)
        while (d := self.choose((), None, tried)) is not None:
            tried.add(d)
            paired = with_bootstrap(path, body, host, self.bootstrap_ports[p])
            self.pairs += 1
            answer = await self._pair(path, paired, p, d)
            if answer is not None:
                return answer
        return error_response(503, "no healthy decode server can take the request", "service_unavailable")

    async def _whole(self, path: str, body: dict[str, Any]) -> Response:
        d = self.choose((), None, set(self.prefill_ids))
        if d is None:
            return error_response(503, "no healthy decode server", "service_unavailable")
        try:
            r = await self.client.post(f"{self.workers[d].url}{path}", json=body)
        except httpx.HTTPError as e:
            self._take_out(d, f"{type(e).__name__}: {e}")
            return error_response(503, f"decode server {self.workers[d].url} failed: {type(e).__name__}",
                                  "service_unavailable")
        return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type", "application/json"))

    async def _prefill(self, p: int, path: str, body: dict[str, Any]) -> Response | None:
        """Run the prefill; None if it worked, else the client's answer: the prefill server's own
        4xx (the request is bad, or it is full), or a 502 naming it (no answer, or a 5xx: it is
        taken out). Either way no pages will come, so the decode request is dropped."""
        w = self.workers[p]
        w.inflight += 1
        w.routed += 1
        try:
            r = await self.client.post(f"{w.url}{path}", json={**body, "stream": False})
        except httpx.HTTPError as e:
            self._take_out(p, f"{type(e).__name__}: {e}")
            return error_response(502, f"prefill server {w.url} failed: {type(e).__name__}", "prefill_failed")
        finally:
            w.inflight -= 1
        if r.status_code >= 500:
            self._take_out(p, f"{r.status_code} from prefill")
            return error_response(502, f"prefill server {w.url} answered {r.status_code}: {r.text[:300]}",
                                  "prefill_failed")
        if r.status_code >= 400:
            return Response(r.content, status_code=r.status_code,
                            media_type=r.headers.get("content-type", "application/json"))
        return None

    async def _pair(self, path: str, body: dict[str, Any], p: int, d: int) -> Response | None:
        """The pair's answer; None when the decode server failed before any byte (try another)."""
        prefill = asyncio.create_task(self._prefill(p, path, body))
        w = self.workers[d]
        w.inflight += 1
        w.routed += 1
        stream = bool(body.get("stream"))
        req = self.client.build_request("POST", f"{w.url}{path}", json=body)
        decode = asyncio.create_task(self.client.send(req, stream=True))
        try:
            done, _ = await asyncio.wait({prefill, decode}, return_when=asyncio.FIRST_COMPLETED)
            if prefill in done and prefill.result() is not None:  # no pages will come: drop the decode
                decode.cancel()
                await _close(decode)
                w.inflight -= 1
                return prefill.result()
            upstream = await decode
        except httpx.HTTPError as e:
            w.inflight -= 1
            self._take_out(d, f"{type(e).__name__}: {e}")
            await prefill
            return None
        if stream and upstream.status_code == 200:
            return StreamingResponse(self._relay_pair(d, upstream, prefill, path), status_code=200,
                                     media_type=upstream.headers.get("content-type", "text/event-stream"))
        try:
            content = await _read_or_fail(upstream, prefill)
        finally:
            w.inflight -= 1
            await upstream.aclose()
        if isinstance(content, Response):
            return content
        await prefill  # its reply says nothing the decode server's does not
        return Response(content, status_code=upstream.status_code,
                        media_type=upstream.headers.get("content-type", "application/json"))

    async def _relay_pair(self, d: int, upstream: httpx.Response, prefill: asyncio.Task,
                          path: str) -> AsyncIterator[bytes]:
        w = self.workers[d]
        chunks = upstream.aiter_raw().__aiter__()
        try:
            while True:
                nxt = asyncio.ensure_future(chunks.__anext__())
                waiting = {nxt} if prefill.done() else {nxt, prefill}
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if prefill in done and prefill.result() is not None and nxt not in done:
                    nxt.cancel()
                    yield stream_failure(path, _message(prefill.result()))
                    return
                try:
                    yield await nxt
                except StopAsyncIteration:
                    return
        except httpx.HTTPError as e:
            self._take_out(d, f"{type(e).__name__}: {e}")
            yield stream_failure(path, f"decode server {w.url} failed mid-stream: {type(e).__name__}")
        finally:
            w.inflight -= 1
            await upstream.aclose()
            if not prefill.done():
                prefill.cancel()

    def info(self) -> dict[str, Any]:
        info = super().info()
        for i, worker in enumerate(info["workers"]):
            worker["role"] = "prefill" if i in self.prefill_ids else "decode"
            if i in self.prefill_ids:
                worker["bootstrap_port"] = self.bootstrap_ports[i]
        return info | {"pd_disaggregation": True, "pairs": self.pairs}


def _message(answer: Response) -> str:
    """The error message of an error response's JSON body."""
    try:
        return json.loads(answer.body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return answer.body.decode(errors="replace")[:300]


async def _read_or_fail(upstream: httpx.Response, prefill: asyncio.Task) -> bytes | Response:
    """The decode server's whole reply, or the prefill's failure (its answer) if that comes first."""
    read = asyncio.ensure_future(upstream.aread())
    done, _ = await asyncio.wait({read, prefill}, return_when=asyncio.FIRST_COMPLETED)
    if read not in done and prefill.result() is not None:
        read.cancel()
        return prefill.result()
    return await read


async def _close(task: asyncio.Task) -> None:
    try:
        response = await task
    except (asyncio.CancelledError, httpx.HTTPError):
        return
    await response.aclose()


