"""`radixkv serve --dp 2 --router sglang`: SGLang's Rust router (`sglang-router` from PyPI,
cache_aware) in front of two radixkv workers. A conversation keeps landing on the worker that
holds its prefix while other traffic comes in between; streams pass through; killing the
command (SIGKILL) takes the workers and the router with it."""

import json
import time

import psutil
import pytest

from tests.server_helpers import start_server, stop_server

pytest.importorskip("sglang_router", reason="sglang-router is a test extra: pip install 'radixkv[router]'")

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def routed():
    server = start_server(command=("serve", "--dp", "2", "--router", "sglang", "--max-total-tokens", "8192",
                                   "--compile", "off"))
    children = psutil.Process(server.proc.pid).children(recursive=True)
    try:  # SGLang's router, not ours (it renames its process "sglang::router")
        assert any("sglang" in " ".join(c.cmdline()) and "radixkv" not in " ".join(c.cmdline()) for c in children)
    except BaseException:
        stop_server(server)
        raise
    yield server
    server.proc.kill()  # the command dies without a word: its workers and SGLang's router go with it
    server.proc.wait()
    deadline = time.monotonic() + 30
    while any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children):
        assert time.monotonic() < deadline, "a worker or the router outlived the command"
        time.sleep(0.2)


def chat(c, messages, **kw):
    r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 8,
                                              "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_conversation_stays_on_the_worker_holding_its_prefix(routed):
    system = {"role": "system", "content": "You are a ship's navigator. Answer in one short sentence, always."}
    others = [{"role": "system", "content": f"You are assistant number {i}, a cook who only talks about soup."}
              for i in range(3)]
    messages, cached = [system], []
    with routed.client() as c:
        for turn in range(4):
            messages.append({"role": "user", "content": f"Question {turn}: where are we heading next?"})
            out = chat(c, messages)
            cached.append(out["usage"]["prompt_tokens_details"]["cached_tokens"])
            messages.append({"role": "assistant", "content": out["choices"][0]["message"]["content"]})
            for other in others:  # traffic in between, on other prefixes
                chat(c, [other, {"role": "user", "content": f"Soup number {turn}?"}])
        gen = c.post("/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 3}})
    assert cached[0] < cached[1] < cached[2] < cached[3], cached  # each turn hit the previous one's worker
    assert gen.status_code == 200 and gen.json()["meta_info"]["completion_tokens"] == 3


def test_streams_pass_through_the_router(routed):
    messages = [{"role": "user", "content": "Name three rivers."}]
    with routed.client() as c:
        whole = chat(c, messages)["choices"][0]["message"]["content"]
        with c.stream("POST", "/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 8,
                                                            "temperature": 0, "stream": True}) as r:
            assert r.status_code == 200
            pieces = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
    text = "".join(p["choices"][0]["delta"].get("content") or "" for p in pieces if p["choices"])
    assert text == whole
