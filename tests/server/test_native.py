"""POST /generate against the in-process Engine, streaming and not; control endpoints."""

import json

import pytest

from radixkv.model.mkl_dispatch import cpu_info, why_not

PROMPTS = ["The capital of France is", "A lighthouse is", "Two plus two equals"]


def greedy(n=12):
    return {"max_new_tokens": n, "temperature": 0}


def sse_events(response):
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            events.append(line[len("data: "):])
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_generate_equals_the_engine_for_the_same_prompts(server, default_engine):
    expected = default_engine.generate(PROMPTS, greedy())
    with server.client() as c:
        single = c.post("/generate", json={"text": PROMPTS[0], "sampling_params": greedy()}).json()
        batch = c.post("/generate", json={"text": PROMPTS, "sampling_params": greedy()}).json()
        by_ids = c.post("/generate", json={"input_ids": default_engine.tokenizer.encode(PROMPTS[1]),
                                           "sampling_params": greedy()}).json()
    assert single["text"] == expected[0]["text"] and single["output_ids"] == expected[0]["output_ids"]
    assert [b["text"] for b in batch] == [e["text"] for e in expected]
    assert by_ids["output_ids"] == expected[1]["output_ids"]
    meta = single["meta_info"]
    assert {"id", "prompt_tokens", "cached_tokens", "completion_tokens", "finish_reason", "ttft",
            "e2e_latency"} <= set(meta)


def test_streamed_generate_adds_up_to_the_same_text(server, default_engine):
    expected = default_engine.generate(PROMPTS[1], greedy(20))
    with server.client() as c, c.stream("POST", "/generate",
                                        json={"text": PROMPTS[1], "sampling_params": greedy(20), "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    # as SGLang streams: each event holds the text and output ids so far (clients slice text[pos:])
    assert events[-1]["text"] == expected["text"] and events[-1]["output_ids"] == expected["output_ids"]
    for before, after in zip(events, events[1:]):
        assert after["text"].startswith(before["text"])
        assert after["output_ids"][:len(before["output_ids"])] == before["output_ids"]
    assert events[-1]["finished"] and not any(e["finished"] for e in events[:-1])


def test_server_info_health_metrics_and_flush(server):
    with server.client() as c:
        assert c.get("/health").json() == {"status": "ok"}
        c.post("/generate", json={"text": "Hello there", "sampling_params": greedy(4)})
        info = c.get("/server_info").json()
        assert info["page_size"] == 1 and info["max_total_tokens"] == 16384
        assert set(info["processes"]) == {"http", "scheduler", "detokenizer"}
        # the scheduler process loads the model before its first MKL call: MKL's AVX-512 kernels
        # where this CPU has them (`mkl_dispatch`), else the reason they are not used
        assert info["mkl"] == (why_not(*cpu_info()) or "AVX-512 kernels (vendor check patched)"), info["mkl"]
        pool = info["kv_pool"]
        s = info["stats"]  # which tier served the prompts (no host tier here: none from the host)
        assert s["device_hit_tokens"] + s["host_hit_tokens"] + s["recomputed_prompt_tokens"] == s["prompt_tokens"]
        assert s["host_hit_tokens"] == 0 and s["host_total_tokens"] == 0
        assert pool["free_tokens"] + pool["evictable_tokens"] + pool["protected_tokens"] <= pool["total_tokens"]
        metrics = c.get("/metrics").text
        for name in ("radixkv_cache_hit_rate", "radixkv_prompt_tokens_total", "radixkv_cached_tokens_total",
                     "radixkv_generation_tokens_total", "radixkv_running_requests", "radixkv_waiting_requests",
                     "radixkv_token_usage", "radixkv_time_to_first_token_seconds_bucket",
                     "radixkv_e2e_request_latency_seconds_bucket", "radixkv_device_hit_tokens",
                     "radixkv_host_hit_tokens", "radixkv_recomputed_prompt_tokens", "radixkv_host_total_tokens"):
            assert name in metrics, name
        # `radixkv serve` compiles its forward by default on CPU, and no batch since recompiled it
        assert s["compiled"] and s["compile_fallback"] is None and s["recompilations"] == 0, s
        assert "radixkv_compiled 1.0" in metrics and "radixkv_recompilations 0.0" in metrics
        assert s["first_tokens"] >= 1 and s["mean_prefill_seconds"] > 0
        assert c.post("/flush_cache").json() == {"flushed": True}
        assert c.get("/server_info").json()["kv_pool"]["free_tokens"] == 16384


def test_an_unknown_rid_of_a_megabyte_is_not_echoed_back(server):
    """Issue 41: /abort_request echoed a 1 MB rid whole in its 404."""
    with server.client() as c:
        r = c.post("/abort_request", json={"rid": "x" * (1 << 20)})
    assert r.status_code == 404 and len(r.content) < 1024 and "1048576 characters" in r.text


def test_abort_request_stops_a_stream(server):
    with server.client() as c, c.stream("POST", "/generate", json={
            "text": "Write a long story.", "rid": "to-abort", "stream": True,
            "sampling_params": {"max_new_tokens": 500, "temperature": 0, "ignore_eos": True}}) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        with server.client() as c2:
            assert c2.post("/abort_request", json={"rid": "to-abort"}).json() == {"aborted": "to-abort"}
        events = [json.loads(x[6:]) for x in lines if x.startswith("data: ") and x != "data: [DONE]"]
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert events[-1]["meta_info"]["completion_tokens"] < 500
    server.wait_idle()


def test_generate_logprobs_equal_the_engine(server, default_engine):
    kwargs = dict(return_logprob=True, logprob_start_len=2, top_logprobs_num=2)
    expected = default_engine.generate(PROMPTS[0], greedy(5), **kwargs)["meta_info"]
    with server.client() as c:
        got = c.post("/generate", json={"text": PROMPTS[0], "sampling_params": greedy(5), **kwargs}).json()["meta_info"]
    for key in ("output_token_logprobs", "input_token_logprobs", "output_top_logprobs", "input_top_logprobs"):
        assert len(got[key]) == len(expected[key]) > 0, key
    for (a, ta), (b, tb) in zip(got["output_token_logprobs"], expected["output_token_logprobs"]):
        assert ta == tb and a == pytest.approx(b, abs=1e-4)
    assert [t for _, t in got["input_token_logprobs"]] == default_engine.tokenizer.encode(PROMPTS[0])[2:]


def test_tokenize_and_detokenize(server, default_engine):
    with server.client() as c:
        ids = c.post("/tokenize", json={"text": "Hello there"}).json()["input_ids"]
        assert ids == default_engine.tokenizer.encode_segment("Hello there")
        assert c.post("/detokenize", json={"input_ids": ids}).json()["text"] == "Hello there"
        chat = c.post("/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}).json()["input_ids"]
        assert chat == default_engine.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
        assert c.post("/detokenize", json={"input_ids": [10**7]}).status_code == 400


def test_tokenize_and_detokenize_in_vllms_shape(server, default_engine):
    """vLLM's clients (`vllm bench serve`) send {"model", "prompt"} and read "tokens", "count"
    and "max_model_len"; /detokenize takes "tokens" and answers "prompt"."""
    hf = default_engine.core.tokenizer.hf
    with server.client() as c:
        got = c.post("/tokenize", json={"model": "default", "prompt": "Hello there"}).json()
        assert got["tokens"] == hf("Hello there", add_special_tokens=True).input_ids == got["input_ids"]
        assert got["count"] == len(got["tokens"]) and got["max_model_len"] > 1000
        plain = c.post("/tokenize", json={"prompt": "Hello there", "add_special_tokens": False}).json()["tokens"]
        assert plain == default_engine.tokenizer.encode_segment("Hello there")
        back = c.post("/detokenize", json={"model": "default", "tokens": plain}).json()
        assert back["prompt"] == back["text"] == "Hello there"
        both = c.post("/tokenize", json={"prompt": "a", "text": "b"})
        assert both.status_code == 400 and "exactly one of text, prompt" in both.text
        assert c.post("/detokenize", json={"tokens": [10**7]}).status_code == 400
