"""Leaving and stopping: a non-streaming client that disconnects aborts its request; SIGTERM
drains (requests in flight finish within --shutdown-timeout, the rest end with an error event
and [DONE]); Ctrl-C ends them at once and exits 130. Client-chosen request ids belong to the
API key that chose them. Socket directories of killed servers are cleaned up at start."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server_helpers import start_server

LONG = {"max_new_tokens": 3000, "temperature": 0, "ignore_eos": True}


def raw_post(server, body: dict, key: str | None) -> socket.socket:
    """A request sent over a bare socket (so the test can hang up on it)."""
    data = json.dumps(body)
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(f"POST /generate HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n{data}".encode())
    return s


def wait_running(server, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while server.info()["requests"]["running"] < n:
        assert time.monotonic() < deadline, f"{n} request(s) never started running"
        time.sleep(0.05)


class Stream(threading.Thread):
    """A streamed /generate read to its end: every event, and whether [DONE] came."""

    def __init__(self, server, key, body):
        super().__init__(daemon=True)
        self.server, self.key, self.body = server, key, body
        self.events, self.done, self.status = [], False, None

    def run(self):
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        with httpx.Client(base_url=self.server.url, headers=headers, timeout=120) as c, \
                c.stream("POST", "/generate", json={**self.body, "stream": True}) as r:
            self.status = r.status_code
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    self.done = True
                elif line.startswith("data: "):
                    self.events.append(json.loads(line[6:]))


def test_a_non_streaming_request_is_aborted_when_its_client_disconnects(server):
    before = server.info()["stats"]["generated_tokens"]
    s = raw_post(server, {"text": "Tell me everything about lighthouses.", "sampling_params": LONG}, server.api_key)
    wait_running(server, 1)
    s.close()  # the client gives up before its answer
    info = server.wait_idle(timeout=30)  # failed before the fix: it ran to its 3000 tokens
    assert info["stats"]["generated_tokens"] - before < 3000
    pool = info["kv_pool"]
    assert pool["free_tokens"] + pool["evictable_tokens"] == pool["total_tokens"]


def test_the_request_bodies_are_published_for_schema_driven_clients(server):
    with server.client() as c:
        doc = c.get("/openapi.json").json()
    for path, model in (("/generate", "GenerateBody"), ("/v1/chat/completions", "ChatCompletionBody"),
                        ("/v1/completions", "CompletionBody"), ("/tokenize", "TokenizeBody"),
                        ("/abort_request", "AbortBody")):
        body = doc["paths"][path]["post"]["requestBody"]
        assert body["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{model}"}, path
    assert {"text", "input_ids", "sampling_params", "stream", "rid"} <= set(
        doc["components"]["schemas"]["GenerateBody"]["properties"])
    assert "ChatMessage" in doc["components"]["schemas"]  # nested models come along


@pytest.fixture(scope="module")
def two_keys():
    # The drain must outlast the short stream of the SIGTERM test on a loaded machine (it ran out
    # at 4 s once, under a full suite); the long one (3,000 tokens) never fits in it.
    s = start_server("--shutdown-timeout", "10", api_key=None, extra_keys=("key-a", "key-b"))
    yield s
    if s.proc.poll() is None:
        s.proc.kill()
        s.proc.wait()


def test_a_request_id_belongs_to_the_key_that_chose_it(two_keys):
    a = Stream(two_keys, "key-a", {"text": "Count slowly.", "rid": "mine", "sampling_params": LONG})
    a.start()
    wait_running_with(two_keys, "key-a", 1)
    with httpx.Client(base_url=two_keys.url, timeout=60) as c:
        as_b = {"Authorization": "Bearer key-b"}
        r = c.post("/abort_request", json={"rid": "mine"}, headers=as_b)
        assert r.status_code == 404  # another key cannot stop it, nor learn that it runs
        r = c.post("/generate", json={"text": "Hi", "rid": "mine", "sampling_params": {"max_new_tokens": 2}},
                   headers=as_b)
        assert r.status_code == 200 and r.json()["meta_info"]["id"] == "mine"  # the same name, b's own
        r = c.post("/abort_request", json={"rid": "mine"}, headers={"Authorization": "Bearer key-a"})
        assert r.json() == {"aborted": "mine"}
    a.join(60)
    assert a.events[-1]["meta_info"]["finish_reason"]["type"] == "abort" and a.done
    assert a.events[-1]["meta_info"]["id"] == "mine"


def wait_running_with(server, key, n, timeout=60):
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as c:
        while c.get("/server_info").json()["requests"]["running"] < n:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_a_stored_response_belongs_to_the_key_that_made_it(two_keys):
    """Through the server: another key's response id is as unknown as a wrong one (before the
    SIGTERM test below stops this server)."""
    a, b = ({"Authorization": f"Bearer {k}"} for k in ("key-a", "key-b"))
    with httpx.Client(base_url=two_keys.url, timeout=60) as c:
        made = c.post("/v1/responses", headers=a, json={"model": "SmolLM2-135M-Instruct", "input": "Hi",
                                                         "max_output_tokens": 2, "temperature": 0})
        assert made.status_code == 200, made.text
        rid = made.json()["id"]
        assert c.get(f"/v1/responses/{rid}", headers=b).status_code == 404
        assert c.delete(f"/v1/responses/{rid}", headers=b).status_code == 404
        r = c.post("/v1/responses", headers=b, json={"model": "SmolLM2-135M-Instruct", "input": "More",
                                                      "previous_response_id": rid, "max_output_tokens": 2})
        assert r.status_code == 400 and "previous_response_id" in r.json()["error"]["message"]
        assert c.get(f"/v1/responses/{rid}", headers=a).json()["id"] == rid  # still a's


def test_sigterm_drains_then_ends_what_is_left_with_an_error_event(two_keys):
    short = Stream(two_keys, "key-a", {"text": "Name a colour.", "sampling_params": {
        "max_new_tokens": 8, "temperature": 0, "ignore_eos": True}})
    long = Stream(two_keys, "key-b", {"text": "Write a very long story.", "sampling_params": LONG})
    long.start()
    wait_running_with(two_keys, "key-a", 1)
    short.start()
    while not short.events:
        time.sleep(0.01)
    two_keys.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 4
    refused = None
    with httpx.Client(base_url=two_keys.url, headers={"Authorization": "Bearer key-a"}, timeout=10) as c:
        while time.monotonic() < deadline and refused is None:
            try:
                r = c.post("/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 2}})
            except httpx.TransportError:
                break
            if r.status_code == 503:
                refused = r.json()["error"]["message"]
                assert c.get("/health").status_code == 503  # a router takes it out
            time.sleep(0.02)
    assert refused and "shutting down" in refused  # new work is turned away while it drains
    short.join(30)
    long.join(30)
    assert short.done and short.events[-1]["finished"] and "error" not in short.events[-1]  # it finished in time
    assert long.done and long.events[-1]["error"]["code"] == 503  # it did not: an error event, then [DONE]
    assert "shutting down" in long.events[-1]["error"]["message"]
    assert two_keys.proc.wait(30) == 0


def test_ctrl_c_ends_streams_at_once_and_exits_130():
    server = start_server(api_key=None)
    stream = Stream(server, None, {"text": "Write a very long story.", "sampling_params": LONG})
    stream.start()
    while not stream.events:
        time.sleep(0.01)
    started = time.monotonic()
    server.proc.send_signal(signal.SIGINT)
    stream.join(30)
    assert stream.done and stream.events[-1]["error"]["code"] == 503
    assert server.proc.wait(30) == 130
    assert time.monotonic() - started < 20


def test_socket_directories_of_killed_servers_are_removed(tmp_path):
    from radixkv.server.runtime.sockets import PREFIX, remove_stale

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that no longer runs
    stale = tmp_path / f"{PREFIX}{gone.pid}-12345-abcd"
    mine = tmp_path / f"{PREFIX}{os.getpid()}-1-efgh"  # this pid, but a start time it never had
    import psutil

    alive = tmp_path / f"{PREFIX}{os.getpid()}-{round(psutil.Process().create_time() * 100)}-ijkl"
    other = tmp_path / "radixkvish-1-2-x"
    for d in (stale, mine, alive, other):
        d.mkdir()
        (d / "scheduler").write_text("")
    removed = {Path(p).name for p in remove_stale(str(tmp_path))}
    assert removed == {stale.name, mine.name}
    assert alive.exists() and other.exists()


def test_a_draining_server_refuses_new_requests_but_lets_accepted_ones_start_their_parts():
    """Found in review: the samples of an n > 1 request accepted before a SIGTERM start after
    its shared prefill, and were refused as new work."""
    import asyncio

    from radixkv.errors import ServiceUnavailable
    from radixkv.sampling_params import SamplingParams
    from radixkv.server.runtime.sockets import Endpoints
    from radixkv.server.runtime.tokenizer_manager import TokenizerManager
    from radixkv.validation import RequestLimits

    async def main():
        endpoints = Endpoints.create()
        manager = TokenizerManager(None, endpoints)
        manager.limits = RequestLimits(100, 64, 1024, 1, False)
        try:
            params = SamplingParams(max_new_tokens=2)
            manager.check([1, 2], params)
            manager.start_draining("the server is shutting down")
            with pytest.raises(ServiceUnavailable, match="shutting down"):
                manager.check([1, 2], params)  # a new request
            part = manager.stream([1, 2], params)  # a part of one accepted before: sent, then waits
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(part.__anext__(), 0.2)
            manager.fail_all("stopped")
            with pytest.raises(ServiceUnavailable):
                manager.stream([1, 2], params).__anext__().send(None)
        finally:
            manager.close()
            endpoints.remove()

    asyncio.run(main())

