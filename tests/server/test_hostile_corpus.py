"""The hostile-input corpus (`hostile/corpus.json`, made by `hostile/make_corpus.py`) against a
real server with two tenant keys and an admin key: every request gets the 4xx it must, whose
message names the client's field; none is a 5xx or hangs; /health keeps answering while they
run (no request stalls the event loop); afterwards no page is locked and an ordinary request
is served. The /health latencies seen are printed (p50, p99, max)."""

import json
import statistics
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server_helpers import start_server, stop_server
from tests.tiny_models import tiny_chat_model_dir

CORPUS = json.loads((Path(__file__).parent / "hostile" / "corpus.json").read_text())
K1, K2, ADMIN = "hostile-one", "hostile-two", "hostile-admin"
STALL_SECONDS = 1.0  # /health slower than this while the corpus runs is a stalled event loop


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = tiny_chat_model_dir(tmp_path_factory)
    server = start_server("--model", str(model), "--max-total-tokens", "4096", "--page-size", "4",
                          "--admin-key", ADMIN, api_key=K1, extra_keys=(K2,))
    yield server
    stop_server(server)


def send(client: httpx.Client, entry: dict, model: str) -> httpx.Response:
    headers = {}
    if "raw" in entry:
        content = entry["raw"].replace("$MODEL", model).encode("utf-8", "surrogatepass")
        headers["content-type"] = "application/json"
        return client.request(entry["method"], entry["path"], content=content, headers=headers)
    if "body" in entry:
        body = json.loads(json.dumps(entry["body"]).replace('"$MODEL"', json.dumps(model)))
        return client.request(entry["method"], entry["path"], json=body)
    return client.request(entry["method"], entry["path"])


def test_the_corpus_is_large_and_covers_every_api():
    assert len(CORPUS) >= 150
    paths = {e["path"] for e in CORPUS}
    assert {"/generate", "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
            "/v1/messages/count_tokens", "/tokenize", "/detokenize", "/abort_request", "/flush_cache"} <= paths


def health_pinger(server):
    """A thread timing GET /health every 20 ms until its event is set: (thread, event, latencies)."""
    latencies, stop = [], threading.Event()

    def ping() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            while not stop.is_set():
                start = time.perf_counter()
                assert c.get("/health").status_code == 200
                latencies.append(time.perf_counter() - start)
                time.sleep(0.02)

    thread = threading.Thread(target=ping, daemon=True)
    thread.start()
    return thread, stop, latencies


def summary(latencies: list[float]) -> tuple[float, float]:
    ordered = sorted(latencies)
    p99 = ordered[int(0.99 * (len(ordered) - 1))]
    print(f"{len(ordered)} pings, p50 {statistics.median(ordered) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
          f"max {ordered[-1] * 1000:.1f} ms")
    return p99, ordered[-1]


def wide_schema(properties: int) -> dict:
    return {"type": "object", "properties": {f"field_{i}": {"type": "object", "properties": {
        f"leaf_{j}": {"type": "string", "pattern": "[a-z]{1,8}"} for j in range(8)}} for i in range(properties)}}


def deep_schema(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema, "b": {"type": "integer"}}, "required": ["a", "b"]}
    return schema


def test_the_heaviest_valid_requests_at_once_do_not_stall_health(server):
    """What a request may legitimately make slow, several at once: tool schemas as deep as allowed
    (29 levels of objects) and 150 kB wide, counted and compiled; a batch of 1,500 prompts."""
    headers = {"Authorization": f"Bearer {K2}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as c:
        model = c.get("/v1/models").json()["data"][0]["id"]
    ask = [{"role": "user", "content": "hi"}]
    bodies = [("/v1/messages/count_tokens", {"model": model, "messages": ask, "tools": [
                  {"name": f"t{i}", "input_schema": schema}]})
              for i, schema in enumerate([deep_schema(28), wide_schema(250), deep_schema(29), wide_schema(260)])]
    bodies += [("/generate", {"text": [f"line {i}" for i in range(1500)], "sampling_params": {"max_new_tokens": 1}})]
    thread, stop, latencies = health_pinger(server)
    time.sleep(0.3)
    failures = []

    def send_one(path, body):
        with httpx.Client(base_url=server.url, headers=headers, timeout=300) as c:
            r = c.post(path, json=body)
        if r.status_code != 200:
            failures.append(f"{path}: {r.status_code} {r.text[:300]}")

    senders = [threading.Thread(target=send_one, args=pair) for pair in bodies]
    for s in senders:
        s.start()
    for s in senders:
        s.join(300)
    stop.set()
    thread.join(30)
    assert not failures, failures
    print("/health while the heaviest valid requests ran: ", end="")
    _, worst = summary(latencies)
    assert worst < STALL_SECONDS, f"/health took {worst:.2f} s: the event loop stalled"


def test_every_hostile_request_gets_its_4xx_naming_the_field_and_health_never_stalls(server):
    headers = {"Authorization": f"Bearer {K1}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as c:
        model = c.get("/v1/models").json()["data"][0]["id"]
    pinger, stop, latencies = health_pinger(server)
    wrong = []
    try:
        with httpx.Client(base_url=server.url, headers=headers, timeout=60) as c:
            for i, entry in enumerate(CORPUS):
                r = send(c, entry, model)
                message = r.json().get("error", {}).get("message", "") if r.headers.get(
                    "content-type", "").startswith("application/json") else r.text
                if r.status_code != entry["status"] or entry["names"] not in message:
                    wrong.append(f"#{i} {entry['method']} {entry['path']} ({entry['names']}): {r.status_code} "
                                 f"{message[:300]}")
    finally:
        stop.set()
        pinger.join(30)
    assert not wrong, f"{len(wrong)} of {len(CORPUS)} wrong:\n" + "\n".join(wrong)
    print("/health during the corpus: ", end="")
    _, worst = summary(latencies)
    assert worst < STALL_SECONDS, f"/health took {worst:.2f} s: the event loop stalled"
    server.wait_idle()  # nothing left running or locked
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as c:
        r = c.post("/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "hi"}],
                                                 "max_tokens": 2})
    assert r.status_code == 200, r.text
