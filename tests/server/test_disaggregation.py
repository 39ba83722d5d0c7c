"""Prefill/decode disaggregation between real servers: `radixkv serve --disaggregation-mode
prefill` and `... decode`, behind SGLang's Rust router (`sglang-router --pd-disaggregation`) and
behind `radixkv router --pd-disaggregation`. Greedy outputs equal one whole server's, token for
token (several prompts, some sharing a prefix, streamed and not, three APIs); the pages that
travelled are counted; a conversation's next turn moves only its new pages; and a prefill
server killed mid-request, or one that never comes, ends the request with an error and leaves
the decode server's pool whole."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from radixkv.procs import orphanless
from tests.server_helpers import API_KEY, Server, free_port, start_server, stop_server, wait_ready

pytest.importorskip("mooncake.engine", reason="the Mooncake extra: pip install 'radixkv[mooncake]'")
pytestmark = pytest.mark.timeout(600)
MODEL = "SmolLM2-135M-Instruct"
GREEDY = {"max_new_tokens": 12, "temperature": 0.0}
SHARED = ("A lighthouse keeper writes to her sister about the winter storms, the supply boat that is "
          "always late, and the gulls that have learned to knock on the window. ") * 6
PROMPTS = [SHARED + "What does she ask her sister to send?", SHARED + "Which bird visits most often?",
           "Write one sentence about a quiet harbour at dawn."]


def pair(*extra, timeout="30"):
    bootstrap = free_port()
    common = ("--disaggregation-transfer-timeout", timeout, *extra)
    prefill = start_server("--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(bootstrap),
                           *common, wait=False)
    decode = start_server("--disaggregation-mode", "decode", *common, wait=False)
    return prefill, decode, bootstrap


def sglang_router(prefill: Server, decode: Server, bootstrap: int) -> Server:
    port = free_port()
    argv = orphanless("sglang_router.launch_router", "--pd-disaggregation", "--prefill", prefill.url, str(bootstrap),
                      "--decode", decode.url, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warn",
                      "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--api-key", API_KEY)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ))
    server = Server(proc, port, API_KEY)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                server.ready.set()
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError("SGLang's router did not start")


@pytest.fixture(scope="module")
def servers():
    prefill, decode, bootstrap = pair()
    whole = start_server(wait=False)
    started = [prefill, decode, whole]
    try:
        for s in started:
            wait_ready(s)
        ours = start_server(command=("router", "--pd-disaggregation", "--prefill", prefill.url, str(bootstrap),
                                     "--decode", decode.url))
        started.append(ours)
        theirs = sglang_router(prefill, decode, bootstrap)
        started.append(theirs)
        yield {"prefill": prefill, "decode": decode, "whole": whole, "ours": ours, "sglang": theirs}
    finally:
        for s in started:
            s.proc.send_signal(signal.SIGTERM)
        for s in started:
            s.proc.wait(30)


def generate(server, text, stream=False, **extra):
    with server.client() as c:
        body = {"text": text, "sampling_params": GREEDY, "stream": stream, **extra}
        if not stream:
            r = c.post("/generate", json=body)
            assert r.status_code == 200, r.text
            return r.json()["output_ids"]
        ids = []
        with c.stream("POST", "/generate", json=body) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    event = json.loads(line[6:])
                    assert "error" not in event, event
                    ids = event["output_ids"]  # SGLang's stream: the ids so far
        return ids


def chat(server, content, stream=False):
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 12,
            "temperature": 0, "stream": stream}
    with server.client() as c:
        if not stream:
            r = c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["message"]["content"]
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200, r.read()
            pieces = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        return "".join(p["choices"][0]["delta"].get("content") or "" for p in pieces if p["choices"])


def disagg(server) -> dict:
    return server.info()["disaggregation"]


def whole_pool(server, timeout: float = 30) -> None:
    """Idle, and every page free or evictable: a pull's pages come back once its transfer settled
    (at once when answered; after a time-out, when the prefill server answers the cancel or the
    timeout passes again)."""
    deadline = time.monotonic() + timeout
    while True:
        pool = server.wait_idle(60)["kv_pool"]
        if pool["free_tokens"] + pool["evictable_tokens"] == pool["total_tokens"]:
            return
        assert time.monotonic() < deadline, pool
        time.sleep(0.2)


@pytest.mark.parametrize("router", ["sglang", "ours"])
def test_pd_outputs_equal_one_whole_server(servers, router):
    front, whole, decode = servers[router], servers["whole"], servers["decode"]
    before = disagg(decode)["disagg_transferred_tokens"]
    texts = [f"({router}) {t}" for t in PROMPTS]  # each router's own: the decode server has not seen them
    for text in texts:
        assert generate(front, text) == generate(whole, text), text
    assert generate(front, texts[2] + " Again.", stream=True) == generate(whole, texts[2] + " Again.")
    question = f"({router}) Name three rivers of Europe and one fact about each."
    assert chat(front, question) == chat(whole, question)
    assert chat(front, question + " Be brief.", stream=True) == chat(whole, question + " Be brief.")
    body = {"model": MODEL, "prompt": texts[0] + " In short:", "max_tokens": 12, "temperature": 0}
    with front.client() as c:
        r = c.post("/v1/completions", json=body)
    with whole.client() as c:
        w = c.post("/v1/completions", json=body)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == w.json()["choices"][0]["text"]
    after = disagg(decode)
    assert after["disagg_transferred_tokens"] > before and after["disagg_failed"] == 0, after
    assert disagg(servers["prefill"])["disagg_transferred_bytes"] >= after["disagg_transferred_bytes"]
    whole_pool(decode)
    whole_pool(servers["prefill"])


def test_the_next_turn_moves_only_its_new_pages(servers):
    front, decode = servers["ours"], servers["decode"]
    first = "Tell me a short story about a fox who keeps a lantern shop in the forest. " * 8
    with front.client() as c:
        r1 = c.post("/generate", json={"text": first, "sampling_params": GREEDY})
        n1 = r1.json()["meta_info"]["prompt_tokens"]
        before = disagg(decode)
        second = first + r1.json()["text"] + " And what happened next?"
        r2 = c.post("/generate", json={"text": second, "sampling_params": GREEDY})
    assert r2.status_code == 200
    after = disagg(decode)
    moved = after["disagg_transferred_tokens"] - before["disagg_transferred_tokens"]
    held = after["disagg_local_prefix_tokens"] - before["disagg_local_prefix_tokens"]
    n2 = r2.json()["meta_info"]["prompt_tokens"]
    assert held >= n1 and moved == n2 - 1 - held, (n1, n2, held, moved)
    assert moved < 30


def test_a_batch_through_our_router_gets_a_room_per_prompt(servers):
    with servers["ours"].client() as c:
        r = c.post("/generate", json={"text": PROMPTS[:2], "sampling_params": GREEDY})
    assert r.status_code == 200, r.text
    assert [o["output_ids"] for o in r.json()] == [generate(servers["whole"], t) for t in PROMPTS[:2]]


def test_hostile_bootstrap_fields_are_refused_by_name(servers):
    with servers["decode"].client() as c:
        for body, field in [({"bootstrap_room": -1, "bootstrap_host": "127.0.0.1"}, "bootstrap_room"),
                            ({"bootstrap_room": 5, "bootstrap_host": "a/b"}, "bootstrap_host"),
                            ({"bootstrap_room": 5, "bootstrap_host": "h", "bootstrap_port": 0}, "bootstrap_port"),
                            ({"bootstrap_host": "127.0.0.1"}, "bootstrap_room")]:
            r = c.post("/generate", json={"text": "hi", "sampling_params": GREEDY, **body})
            assert r.status_code == 400 and field in r.json()["error"]["message"], r.text
    with servers["whole"].client() as c:  # a whole server is not part of a pair
        r = c.post("/generate", json={"text": "hi", "bootstrap_room": 5, "bootstrap_host": "127.0.0.1"})
    assert r.status_code == 400 and "disaggregation-mode" in r.json()["error"]["message"], r.text


def test_faults_end_with_an_error_and_leave_the_pools_whole():
    prefill, decode, bootstrap = pair(timeout="3")
    router = None
    try:
        wait_ready(prefill), wait_ready(decode)
        router = start_server(command=("router", "--pd-disaggregation", "--prefill", prefill.url, str(bootstrap),
                                       "--decode", decode.url))
        # a room whose prefill never comes (sent to the decode server alone): a 503 after the timeout
        with decode.client() as c:
            start = time.monotonic()
            r = c.post("/generate", json={"text": PROMPTS[0], "sampling_params": GREEDY, "bootstrap_room": 42,
                                          "bootstrap_host": "127.0.0.1", "bootstrap_port": bootstrap})
        assert r.status_code == 503 and "prefill server" in r.json()["error"]["message"], r.text
        assert time.monotonic() - start < 15
        # the prefill server killed while the request is in flight: the router answers 502 at once
        long_text = "The cartographer redrew the coastline after every storm, " * 120
        answer = {}

        def send():
            with router.client() as c:
                answer["r"] = c.post("/generate", json={"text": long_text, "sampling_params": GREEDY})

        sender = threading.Thread(target=send)
        sender.start()
        time.sleep(0.4)
        prefill.proc.kill()
        sender.join(60)
        r = answer["r"]
        assert r.status_code in (502, 503) and "prefill" in r.text, r.text
        with decode.client() as c:  # the decode server keeps serving whole requests
            assert c.post("/generate", json={"text": "Hello", "sampling_params": GREEDY}).status_code == 200
        whole_pool(decode)  # its pulled pages came back once the transfer settled
    finally:
        for s in (router, prefill, decode):
            if s is not None:
                stop_server(s)
