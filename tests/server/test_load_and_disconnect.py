"""64 concurrent streaming clients; a client that disconnects mid-stream."""

import asyncio
import json
import socket

import httpx


def test_64_concurrent_streaming_clients_complete_then_the_pool_is_all_free(server):
    async def one(client, i):
        body = {"text": f"Request {i}: name an animal that starts with the letter {chr(65 + i % 26)}.",
                "stream": True, "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}}
        text, finished = [], False
        async with client.stream("POST", "/generate", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    event = json.loads(line[6:])
                    assert "error" not in event, event
                    text.append(event["text"])
                    finished = event["finished"]
        return finished, "".join(text)

    async def main():
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=300, limits=limits) as c:
            return await asyncio.gather(*(one(c, i) for i in range(64)))

    results = asyncio.run(main())
    assert all(finished for finished, _ in results) and all(text for _, text in results)
    server.wait_idle()
    with server.client() as c:
        assert c.post("/flush_cache").json() == {"flushed": True}
        pool = c.get("/server_info").json()["kv_pool"]
    assert pool["free_tokens"] == pool["total_tokens"]


def test_a_client_that_disconnects_mid_stream_aborts_its_request(server):
    body = json.dumps({"text": "Tell me everything about lighthouses.", "stream": True,
                       "sampling_params": {"max_new_tokens": 2000, "temperature": 0, "ignore_eos": True}})
    raw = (f"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.api_key}\r\n"
           f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}")
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(raw.encode())
        received = b""
        while received.count(b"data: ") < 3:  # a few tokens in
            received += s.recv(4096)
        running = server.info()["requests"]["running"]
    assert running == 1  # then the socket closes, mid-stream
    info = server.wait_idle(timeout=30)  # aborted: nothing runs, no page is locked
    pool = info["kv_pool"]
    assert pool["free_tokens"] + pool["evictable_tokens"] == pool["total_tokens"]
    assert info["stats"]["generated_tokens"] < 2000 or info["requests"]["running"] == 0
