"""The router's core: N `radixkv serve` workers, their health, and where each request goes
(the HTTP routes over it are `app.py`).

The routing key is the prompt as the client sent it: `text` or `input_ids`, a completion's
`prompt`, a chat's or an Anthropic request's messages (role and content, in order), or a
Responses request's instructions and input, so a conversation's next turn shares its key's
prefix with the previous one. OpenAI's `prompt_cache_key` pins a conversation to a worker.
A Responses turn that names `previous_response_id` goes to the worker that stored that
response (the router learns each id from the reply, or from the first event of a stream), and
so do `GET` / `DELETE /v1/responses/{id}`: a stored conversation lives on one worker only.

Faults: a health loop polls every worker's `/health`. A worker that fails a request or a check
is taken out (its routing tree with it) and used again once its checks pass. A request that
fails (no answer, or a 5xx) before any byte went to the client is retried on another worker (at
most once per worker). A stream that already sent bytes ends with an SSE error event instead,
so a client never sees a silent duplicate. With no healthy worker the router answers 503.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi.responses import Response, StreamingResponse

from radixkv.routing import make_policy
from radixkv.server.http.common import error_response

logger = logging.getLogger(__name__)
ROUTED = ("/generate", "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
ANY_WORKER = ("/tokenize", "/detokenize", "/v1/messages/count_tokens")
MAX_TRACKED_RIDS = 100_000
MAX_TRACKED_RESPONSES = 100_000  # stored Responses ids -> their worker (oldest forgotten first)
RESPONSE_ID = re.compile(rb'"id"\s*:\s*"(resp_[^"]+)"')
SCANNED_BYTES = 1 << 16  # how far into a stream the router looks for the response id


@dataclass(frozen=True)
class RouterSettings:
    workers: tuple[str, ...]  # base URLs
    policy: str = "cache_aware"
    api_key: str | None = None  # sent to workers as a bearer token, and required from clients
    health_interval: float = 2.0  # seconds between health checks
    request_timeout: float = 600.0
    tree_capacity: int = 1 << 22  # characters (or token ids) remembered per worker


@dataclass
class Worker:
    url: str
    healthy: bool = True
    inflight: int = 0
    routed: int = 0
    failures: int = 0
    last_error: str | None = None
    last_check: float = field(default=0.0)


def _text_of(content: Any) -> str:
    """A message's content as text: a string, or the text of its parts / blocks."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _messages_key(messages: Any, head: str = "") -> str:
    parts = [head]
    for m in messages if isinstance(messages, list) else []:
        if isinstance(m, dict):
            parts.append(f"<{m.get('role', '')}>{_text_of(m.get('content'))}")
    return "".join(parts)


def routing_key(path: str, body: dict[str, Any]) -> tuple[Sequence[Hashable], Hashable | None]:
    """(the prompt as a key sequence, a pin) of one request body."""
    pin = body.get("prompt_cache_key")
    if path == "/v1/chat/completions":
        return _messages_key(body.get("messages")), pin
    if path == "/v1/messages":  # Anthropic: the system prompt, then the messages
        system = body.get("system")
        return _messages_key(body.get("messages"), f"<system>{_text_of(system)}" if system else ""), pin
    if path == "/v1/responses":
        head = f"<system>{body['instructions']}" if isinstance(body.get("instructions"), str) else ""
        given = body.get("input")
        if isinstance(given, str):
            return f"{head}<user>{given}", pin
        return _messages_key([i for i in given if isinstance(i, dict)] if isinstance(given, list) else [], head), pin
    prompt = body.get("text", body.get("input_ids")) if path == "/generate" else body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
        prompt = prompt[0]  # a batch: route by its first prompt
    if isinstance(prompt, (str, list)):
        return (prompt if isinstance(prompt, str) else tuple(prompt)), pin
    return "", pin


class Router:
    """Workers, their health, and the routing policy."""

    def __init__(self, settings: RouterSettings):
        if not settings.workers:
            raise ValueError("the router needs at least one --worker URL")
        self.settings = settings
        self.workers = [Worker(u.rstrip("/")) for u in settings.workers]
        self.policy = make_policy(settings.policy, len(self.workers), tree_capacity=settings.tree_capacity)
        headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        self.client = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(settings.request_timeout, connect=5),
                                        limits=httpx.Limits(max_connections=1024))
        self.retries = 0
        self.rids: dict[str, int] = {}  # a client-named request in flight -> its worker
        self.responses: OrderedDict[str, int] = OrderedDict()  # a stored Responses id -> its worker
        self._health_task: asyncio.Task | None = None

    # -- health ----------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.check_all()
        self._health_task = asyncio.create_task(self._health_loop())

    async def stop(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
        await self.client.aclose()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.health_interval)
            await self.check_all()

    async def check_all(self) -> None:
        await asyncio.gather(*(self._check(i) for i in range(len(self.workers))))

    async def _check(self, i: int) -> None:
        w = self.workers[i]
        try:
            ok = (await self.client.get(f"{w.url}/health", timeout=5)).status_code == 200
            error = None if ok else "health check answered non-200"
        except httpx.HTTPError as e:
            ok, error = False, f"{type(e).__name__}: {e}"
        w.last_check = time.time()
        if ok and not w.healthy:
            logger.info("worker %s is back", w.url)
        if not ok:
            self._take_out(i, error)
        w.healthy = ok

    def _take_out(self, i: int, error: str | None) -> None:
        w = self.workers[i]
        if w.healthy:
            logger.warning("worker %s taken out: %s", w.url, error)
            self.policy.forget_worker(i)  # its cache is gone or unknown
        w.healthy, w.last_error = False, error
        w.failures += 1

    # -- routing ---------------------------------------------------------------------------------
    def choose(self, key, pin, exclude: set[int], owner: int | None = None) -> int | None:
        """A healthy worker not in `exclude`: `owner` (the worker holding the state a request
        continues) when it can take it, else by the policy (None if there is none)."""
        usable = [i for i, w in enumerate(self.workers) if w.healthy and i not in exclude]
        if not usable:
            return None
        if owner in usable:
            return owner
        big = 1 << 30  # a worker that cannot take the request looks infinitely loaded
        loads = [w.inflight if i in usable else big for i, w in enumerate(self.workers)]
        choice = self.policy.route(key, loads, pin)
        if choice not in usable:  # the policy's pick is out: the least loaded usable worker
            choice = min(usable, key=lambda i: (loads[i], i))
        return choice

    async def forward(self, path: str, body: dict[str, Any]) -> Response:
        key, pin = routing_key(path, body)
        stream = bool(body.get("stream"))
        rids = client_rids(body) if path == "/generate" else []
        learn = path == "/v1/responses"
        owner = self.responses.get(body.get("previous_response_id")) if learn else None
        tried: set[int] = set()
        while True:
            i = self.choose(key, pin, tried, owner)
            if i is None:
                return error_response(503, "no healthy worker can take the request" +
                              (f" (tried {len(tried)})" if tried else ""), "service_unavailable")
            tried.add(i)
            w = self.workers[i]
            w.inflight += 1
            w.routed += 1
            self._track(rids, i)
            try:
                if stream:
                    req = self.client.build_request("POST", f"{w.url}{path}", json=body)
                    upstream = await self.client.send(req, stream=True)
                    if upstream.status_code >= 500:  # nothing streamed yet: another worker may serve it
                        await upstream.aclose()
                        raise httpx.HTTPStatusError(f"{upstream.status_code} from worker", request=req,
                                                    response=upstream)
                    return StreamingResponse(self._relay(i, upstream, rids, path, learn),
                                             status_code=upstream.status_code,
                                             media_type=upstream.headers.get("content-type", "text/event-stream"))
                try:
                    r = await self.client.post(f"{w.url}{path}", json=body)
                finally:
                    w.inflight -= 1
                    self._untrack(rids, i)
                if r.status_code >= 500:  # a dying or broken worker; nothing reached the client yet
                    raise httpx.HTTPStatusError(f"{r.status_code} from worker", request=r.request, response=r)
                if learn and r.status_code == 200:
                    self._learn_response(r.content, i)
                return Response(r.content, status_code=r.status_code,
                                media_type=r.headers.get("content-type", "application/json"))
            except httpx.HTTPError as e:  # nothing came back: another worker may serve it
                if stream:
                    w.inflight -= 1
                    self._untrack(rids, i)
                self._take_out(i, f"{type(e).__name__}: {e}")
                self.retries += 1
                logger.warning("request to %s failed before any reply (%s); retrying elsewhere", w.url, e)

    def _track(self, rids: list[str], worker: int) -> None:
        for rid in rids:
            if len(self.rids) < MAX_TRACKED_RIDS:
                self.rids[rid] = worker

    def _untrack(self, rids: list[str], worker: int) -> None:
        for rid in rids:
            if self.rids.get(rid) == worker:
                del self.rids[rid]

    async def abort(self, body: dict[str, Any]) -> Response:
        """Stop a client-named request: at the worker that has it, else at every worker."""
        rid = body.get("rid")
        if not isinstance(rid, str):
            return error_response(400, "rid: a string is required", "invalid_request_error")
        known = self.rids.get(rid)
        targets = [known] if known is not None else [i for i, w in enumerate(self.workers) if w.healthy]
        for i in targets:
            try:
                r = await self.client.post(f"{self.workers[i].url}/abort_request", json={"rid": rid}, timeout=30)
            except httpx.HTTPError:
                continue
            if r.status_code == 200:
                return Response(r.content, status_code=200, media_type="application/json")
        return error_response(404, f"no request {rid!r} in flight", "not_found")

    async def any_worker(self, path: str, body: dict[str, Any]) -> Response:
        """A request any worker answers alike (they serve one model): the least loaded healthy one."""
        tried: set[int] = set()
        while (i := self.choose((), None, tried)) is not None:
            tried.add(i)
            try:
                r = await self.client.post(f"{self.workers[i].url}{path}", json=body, timeout=60)
            except httpx.HTTPError as e:
                self._take_out(i, f"{type(e).__name__}: {e}")
                continue
            return Response(r.content, status_code=r.status_code,
                            media_type=r.headers.get("content-type", "application/json"))
        return error_response(503, "no healthy worker", "service_unavailable")

    def _learn_response(self, head: bytes, worker: int) -> bool:
        """Remember which worker stored the response whose id `head` (a reply's first bytes)
        names; True once found."""
        found = RESPONSE_ID.search(head)
        if found is None:
            return False
        self.responses[found.group(1).decode()] = worker
        self.responses.move_to_end(found.group(1).decode())
        while len(self.responses) > MAX_TRACKED_RESPONSES:
            self.responses.popitem(last=False)
        return True

    async def stored_response(self, method: str, response_id: str) -> Response:
        """`GET` / `DELETE /v1/responses/{id}` at the worker that stored it; asked of every
        healthy worker when the router does not know it (it restarted, or the id is wrong)."""
        known = self.responses.get(response_id)
        order = [known] if known is not None and self.workers[known].healthy else []
        order += [i for i, w in enumerate(self.workers) if w.healthy and i not in order]
        answer: Response | None = None
        for i in order:
            try:
                r = await self.client.request(method, f"{self.workers[i].url}/v1/responses/{response_id}", timeout=30)
            except httpx.HTTPError as e:
                self._take_out(i, f"{type(e).__name__}: {e}")
                continue
            answer = Response(r.content, status_code=r.status_code,
                              media_type=r.headers.get("content-type", "application/json"))
            if r.status_code != 404:
                if method == "DELETE" and r.status_code == 200:
                    self.responses.pop(response_id, None)
                return answer
        return answer or error_response(503, "no healthy worker", "service_unavailable")

    async def _relay(self, i: int, upstream: httpx.Response, rids: list[str], path: str,
                     learn: bool = False) -> AsyncIterator[bytes]:
        w = self.workers[i]
        head = b""
        try:
            async for chunk in upstream.aiter_raw():
                if learn:  # the stream's first event carries the response id
                    head += chunk
                    learn = len(head) < SCANNED_BYTES and not self._learn_response(head, i)
                yield chunk
        except httpx.HTTPError as e:  # bytes already went out: end the stream with an error
            self._take_out(i, f"{type(e).__name__}: {e}")
            yield stream_failure(path, f"worker {w.url} failed mid-stream: {type(e).__name__}")
        finally:
            w.inflight -= 1
            self._untrack(rids, i)
            await upstream.aclose()

    async def fan_out(self, method: str, path: str) -> list[tuple[str, int, Any]]:
        async def one(w: Worker):
            try:
                r = await self.client.request(method, f"{w.url}{path}", timeout=30)
                return w.url, r.status_code, r.json()
            except (httpx.HTTPError, ValueError) as e:
                return w.url, 0, {"error": str(e)}
        return list(await asyncio.gather(*(one(w) for w in self.workers if w.healthy)))

    def info(self) -> dict[str, Any]:
        return {"policy": self.settings.policy, "retries": self.retries, "tracked_responses": len(self.responses),
                "decisions": dict(getattr(self.policy, "decisions", {})),
                "workers": [{"url": w.url, "healthy": w.healthy, "inflight": w.inflight, "routed": w.routed,
                             "failures": w.failures, "last_error": w.last_error} for w in self.workers]}


DONE_PATHS = ("/generate", "/v1/chat/completions", "/v1/completions")
"""The APIs whose streams end with `data: [DONE]` (a single server's do, after an error too)."""


def stream_failure(path: str, message: str) -> bytes:
    """The end of a stream whose worker failed after bytes went out: the API's error event
    (Anthropic's and the Responses API's are named), then `[DONE]` where the API ends with it."""
    if path == "/v1/messages":
        body = {"type": "error", "error": {"type": "api_error", "message": message}}
        return f"event: error\ndata: {json.dumps(body)}\n\n".encode()
    if path == "/v1/responses":
        body = {"type": "error", "code": "server_error", "message": message, "param": None}
        return f"event: error\ndata: {json.dumps(body)}\n\n".encode()
    err = {"error": {"message": message, "type": "worker_failed", "code": 502}}
    done = "data: [DONE]\n\n" if path in DONE_PATHS else ""
    return f"data: {json.dumps(err)}\n\n{done}".encode()


def client_rids(body: dict[str, Any]) -> list[str]:
    """The request ids a /generate body names (one, or one per prompt of a batch)."""
    rid = body.get("rid")
    if isinstance(rid, str):
        return [rid]
    return [r for r in rid if isinstance(r, str)] if isinstance(rid, list) else []


