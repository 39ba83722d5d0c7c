"""The router in front of two real workers (the default model): conversations stick to the
worker that caches them, `prompt_cache_key` pins, streams pass through unchanged, and a worker
that dies is routed around and used again once it is back."""

import concurrent.futures
import json
import os
import signal
import time

import httpx
import openai
import pytest

from tests.server_helpers import API_KEY, start_server, stop_server, wait_ready

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def cluster():
    workers = [wait_ready(w) for w in [start_server("--max-total-tokens", "4096", wait=False) for _ in range(2)]]
    urls = [w.url for w in workers]
    router = start_server(*[a for u in urls for a in ("--worker", u)], "--health-interval", "0.5",
                          command=("router",))
    yield router, workers
    for s in (router, *workers):  # all at once: they stop together
        if s.proc.poll() is None:
            s.proc.send_signal(signal.SIGTERM)
    for s in (router, *workers):
        stop_server(s)


def routed(router) -> list[int]:
    return [w["routed"] for w in router.info()["router"]["workers"]]


def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, timeout=120, max_retries=0)


def test_a_conversation_stays_on_one_worker_and_its_cache_grows(cluster):
    router, _ = cluster
    c = client(router)
    before = routed(router)
    messages = [{"role": "system", "content": "You are a helpful assistant who answers in one sentence."}]
    cached = []
    for question in ("What is a lighthouse?", "Who kept them?", "Are they still used?"):
        messages.append({"role": "user", "content": question})
        r = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
    delta = [a - b for a, b in zip(routed(router), before)]
    assert sorted(delta) == [0, 3]  # every turn went to the same worker
    assert cached[1] > cached[0] and cached[2] > cached[1]


def test_prompt_cache_key_pins_a_conversation(cluster):
    router, _ = cluster
    c = client(router)
    before = routed(router)
    for i in range(3):  # unrelated prompts, one key: one worker
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"Count to {i + 2}."}],
                                  max_tokens=4, temperature=0, extra_body={"prompt_cache_key": "conv-7"})
    assert sorted(a - b for a, b in zip(routed(router), before)) == [0, 3]


def test_streaming_through_the_router_equals_the_worker(cluster):
    router, workers = cluster
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "Name three colours."}], max_tokens=12,
               temperature=0, stream=True)
    via_router = "".join(ch.choices[0].delta.content or "" for ch in client(router).chat.completions.create(**ask)
                         if ch.choices)
    direct = "".join(ch.choices[0].delta.content or "" for ch in client(workers[0]).chat.completions.create(**ask)
                     if ch.choices)
    assert via_router == direct and via_router


def test_tokenize_and_abort_go_through_the_router(cluster):
    """Both were 404 through the router."""
    router, workers = cluster
    with router.client() as r, workers[0].client() as w:
        via = r.post("/tokenize", json={"text": "Hello there"})
        assert via.status_code == 200 and via.json() == w.post("/tokenize", json={"text": "Hello there"}).json()
        assert r.post("/detokenize", json={"input_ids": via.json()["input_ids"]}).json()["text"] == "Hello there"
        assert r.post("/abort_request", json={"rid": "nobody"}).status_code == 404
        with r.stream("POST", "/generate", json={"text": "Write a long story.", "rid": "routed-1", "stream": True,
                                                 "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}) as s:
            lines = s.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            with router.client() as r2:
                assert r2.post("/abort_request", json={"rid": "routed-1"}).json() == {"aborted": "routed-1"}
            events = [json.loads(x[6:]) for x in lines if x.startswith("data: ") and x != "data: [DONE]"]
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert httpx.post(f"{router.url}/tokenize", json={"text": "x"}, headers={"Authorization": "Bearer nope"}
                      ).status_code == 401


def test_responses_conversations_follow_their_stored_turns(cluster):
    """/v1/responses and /v1/messages were 404 at the router; a previous_response_id must reach
    the worker that stored it, whatever the new input's key would route to."""
    router, _ = cluster
    c = client(router)
    before = routed(router)
    r = c.responses.create(model=MODEL, input="Name a colour.", max_output_tokens=6, temperature=0)
    for i, question in enumerate(("And another?", "One more, a different one.")):
        stream = c.responses.create(model=MODEL, input=question, previous_response_id=r.id, max_output_tokens=6,
                                    temperature=0, stream=(i == 1))
        r = next(e.response for e in stream if e.type in ("response.completed", "response.incomplete")) \
            if i == 1 else stream
        assert r.usage.input_tokens_details.cached_tokens > 0
    assert sorted(a - b for a, b in zip(routed(router), before)) == [0, 3]
    assert c.responses.retrieve(r.id).id == r.id  # found at its worker
    c.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    with router.client() as h:
        m = h.post("/v1/messages", json={"model": MODEL, "max_tokens": 4, "temperature": 0,
                                          "messages": [{"role": "user", "content": "Hi"}]})
        assert m.status_code == 200 and m.json()["type"] == "message"
        counted = h.post("/v1/messages/count_tokens", json={"model": MODEL,
                                                             "messages": [{"role": "user", "content": "Hi"}]})
        assert counted.status_code == 200 and counted.json()["input_tokens"] > 0


@pytest.mark.slow  # about 100 s: a worker dies and restarts; run with -m slow
def test_a_dead_worker_is_routed_around_and_used_again_when_back(cluster):
    router, workers = cluster
    c = client(router)

    def ask(i):
        return c.completions.create(model=MODEL, prompt=f"Fact number {i} about the sea:", max_tokens=64,
                                    temperature=0, extra_body={"ignore_eos": True}).choices[0].text

    retries = router.info()["router"]["retries"]
    sockets = workers[0].info()["ipc_directory"]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(ask, i) for i in range(16)]
        deadline = time.monotonic() + 60
        while workers[0].info()["requests"]["running"] == 0:  # requests are in flight on it
            assert time.monotonic() < deadline, "no request ever reached worker 0"
            time.sleep(0.05)
        port = workers[0].port
        workers[0].proc.kill()  # dies mid-run, with no chance to answer or clean up
        workers[0].proc.wait()
        answers = [f.result(timeout=120) for f in futures]
    assert len(answers) == 16  # nothing lost: requests that got no reply were retried on the other
    assert router.info()["router"]["retries"] > retries  # the retry path ran
    assert os.path.isdir(sockets)  # a killed server leaves its socket directory behind...
    with router.client() as h:
        assert h.get("/health").status_code == 200
    info = router.info()["router"]
    assert [w["healthy"] for w in info["workers"]] == [False, True]
    workers[0] = start_server("--max-total-tokens", "4096", port=port)  # comes back on the same address
    assert not os.path.exists(sockets)  # ...which the next server to start removes
    deadline = time.monotonic() + 30
    while not router.info()["router"]["workers"][0]["healthy"]:
        assert time.monotonic() < deadline, "the router never saw the worker come back"
        time.sleep(0.2)
    before = routed(router)
    for i in range(4):
        ask(100 + i)
    assert routed(router)[0] > before[0]  # used again
