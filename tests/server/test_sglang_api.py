"""SGLang's native API as its clients use it: the introspection endpoints, and /generate with
the fields SGLang's frontend and router send (n, stop_regex, no_stop_trim, text in log-probs,
cumulative streams, hints, cache namespaces), against the real server."""

import json

import pytest

PROMPT = "The capital of France is"


def greedy(n=12, **kw):
    return {"max_new_tokens": n, "temperature": 0, **kw}


def stream(c, body):
    with c.stream("POST", "/generate", json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def test_model_info_server_info_load_and_health_generate(server):
    with server.client() as c:
        info = c.get("/get_model_info").json()
        assert info == c.get("/model_info").json()
        assert info["is_generation"] is True and info["model_path"] == info["tokenizer_path"]
        assert info["served_model_name"] == "SmolLM2-135M-Instruct"
        assert info["architectures"] == ["LlamaForCausalLM"]
        ours = c.get("/server_info").json()
        theirs = c.get("/get_server_info").json()
        # SGLang's keys beside ours: launch arguments flat, internal_states per DP rank
        for key in ("model_path", "tokenizer_path", "page_size", "max_running_requests", "chunked_prefill_size",
                    "dp_size", "max_total_num_tokens", "internal_states", "version"):
            assert key in ours and key in theirs, key
        assert ours["max_total_num_tokens"] == ours["max_total_tokens"] == 16384
        assert ours["kv_pool"]["total_tokens"] == 16384  # ours unchanged beside them
        load = c.get("/get_load").json()
        assert load[0]["dp_rank"] == 0 and {"num_reqs", "num_waiting_reqs", "num_tokens"} <= set(load[0])
        loads = c.get("/v1/loads").json()
        assert loads["loads"][0]["max_total_num_tokens"] == 16384
        assert c.get("/health_generate").json() == {"status": "ok"}


def test_the_fields_sglang_frontend_sends_with_their_defaults_are_accepted(server, default_engine):
    """RuntimeEndpoint.generate's body: every sampling field, unset ones as null or []."""
    params = {"skip_special_tokens": True, "spaces_between_special_tokens": True, "max_new_tokens": 8,
              "min_new_tokens": 0, "n": 1, "stop": [], "stop_token_ids": [], "stop_regex": [], "temperature": 0,
              "top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
              "ignore_eos": False, "regex": None, "json_schema": None}
    expected = default_engine.generate(PROMPT, greedy(8))
    with server.client() as c:
        out = c.post("/generate", json={"text": PROMPT, "sampling_params": params}).json()
        # what the router adds to /generate: hints, and features off
        routed = c.post("/generate", json={
            "text": PROMPT, "sampling_params": greedy(8), "model": "anything", "return_text_in_logprobs": False,
            "log_metrics": True, "return_hidden_states": False, "background": False, "no_logs": False,
            "return_bytes": False, "return_entropy": False, "lora_path": None, "data_parallel_rank": None}).json()
    assert out["text"] == routed["text"] == expected["text"]


@pytest.mark.parametrize("field, value", [("return_hidden_states", True), ("background", True),
                                          ("lora_path", "adapter"), ("image_data", "x.png"),
                                          ("data_parallel_rank", 1), ("return_entropy", True)])
def test_a_feature_this_server_lacks_is_a_400_naming_it(server, field, value):
    with server.client() as c:
        r = c.post("/generate", json={"text": PROMPT, "sampling_params": greedy(2), field: value})
    assert r.status_code == 400 and field in r.json()["error"]["message"]


def test_n_returns_n_samples_in_sglangs_order_after_one_prefill(server):
    prompts = ["A lighthouse is", "Two plus two equals"]
    with server.client() as c:
        c.post("/flush_cache")
        outs = c.post("/generate", json={"text": prompts, "sampling_params": {
            "max_new_tokens": 6, "temperature": 1.0, "seed": 7, "n": 3}}).json()
        singles = [c.post("/generate", json={"text": prompts[i], "sampling_params": {
            "max_new_tokens": 6, "temperature": 1.0, "seed": 7 + j}}).json() for j in range(3) for i in range(2)]
        one = c.post("/generate", json={"text": prompts[0], "sampling_params": {"max_new_tokens": 2, "n": 2}}).json()
        bad = c.post("/generate", json={"text": prompts[0], "sampling_params": {"n": 0}})
        bad_seed = c.post("/generate", json={"text": prompts[0], "sampling_params": {"n": 2, "seed": "x"}})
    # sample j of prompt i at j * prompts + i; sample j seeded seed + j
    assert [o["output_ids"] for o in outs] == [s["output_ids"] for s in singles]
    assert len({tuple(o["output_ids"]) for o in outs[::2]}) > 1  # the samples differ
    # the prompt was computed once: every sample found it cached
    assert all(o["meta_info"]["cached_tokens"] == o["meta_info"]["prompt_tokens"] - 1 for o in outs)
    assert isinstance(one, list) and len(one) == 2  # one prompt, n=2: a list, as SGLang answers
    assert bad.status_code == 400 and "sampling_params.n" in bad.json()["error"]["message"]
    assert bad_seed.status_code == 400 and "seed" in bad_seed.json()["error"]["message"]


def test_stop_regex_stops_and_is_trimmed_unless_no_stop_trim(server, default_engine):
    full = default_engine.generate(PROMPT, greedy(20))["text"]
    with server.client() as c:
        out = c.post("/generate", json={"text": PROMPT, "sampling_params": greedy(20, stop_regex=r"\bParis\b")}).json()
        kept = c.post("/generate", json={"text": PROMPT, "sampling_params": greedy(
            20, stop_regex=[r"\bParis\b"], no_stop_trim=True)}).json()
        bad = c.post("/generate", json={"text": PROMPT, "sampling_params": greedy(2, stop_regex="(")})
    assert "Paris" in full
    cut = full.index("Paris")
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "Paris"}
    assert out["text"] == full[:cut] and kept["text"] == full[:cut + len("Paris")]
    assert bad.status_code == 400 and "stop_regex" in bad.json()["error"]["message"]


def test_return_text_in_logprobs_gives_triples_and_select_reads_them(server):
    with server.client() as c:
        out = c.post("/generate", json={"text": [PROMPT + " Paris", PROMPT + " Rome"],
                                        "sampling_params": {"max_new_tokens": 0, "temperature": 0},
                                        "return_logprob": True, "return_text_in_logprobs": True,
                                        "logprob_start_len": 3, "top_logprobs_num": 2}).json()
    for o in out:
        entries = o["meta_info"]["input_token_logprobs"]
        assert all(len(e) == 3 and isinstance(e[2], str) for e in entries)
        assert entries[-1][2].strip() in ("Paris", "Rome")
        tops = o["meta_info"]["input_top_logprobs"]
        assert all(t is None or all(len(e) == 3 for e in t) for t in tops)
        assert o["meta_info"]["output_token_logprobs_length"] == 0
    # the frontend's select: the mean prompt log-prob of each choice
    mean = [sum(e[0] for e in o["meta_info"]["input_token_logprobs"]) for o in out]
    assert mean[0] > mean[1]  # Paris is the likelier continuation


def test_a_stream_carries_text_so_far_and_the_log_probs_of_its_new_tokens(server, default_engine):
    expected = default_engine.generate(PROMPT, greedy(16), return_logprob=True)
    with server.client() as c:
        events = stream(c, {"text": PROMPT, "sampling_params": greedy(16), "return_logprob": True})
    assert events[-1]["text"] == expected["text"] and events[-1]["output_ids"] == expected["output_ids"]
    pos, got, prev = 0, [], 0
    for e in events:  # SGLang's frontend: chunk_text = text[pos:]
        piece = e["text"][pos:]
        pos += len(piece)
        meta = e["meta_info"]
        assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] - prev
        assert meta["output_token_logprobs_length"] == meta["completion_tokens"]
        prev = meta["completion_tokens"]
        got += meta["output_token_logprobs"]
    assert [t for _, t in got] == expected["output_ids"]
    ref = [lp for lp, _ in expected["meta_info"]["output_token_logprobs"]]
    assert [lp for lp, _ in got] == pytest.approx(ref, abs=1e-4)


def test_two_salts_never_share_a_prefix_and_one_salt_does(server):
    text = "Salted prompts: the quick brown fox jumps over the lazy dog, again and again and again."
    with server.client() as c:
        c.post("/flush_cache")

        def cached(**kw):
            return c.post("/generate", json={"text": text, "sampling_params": greedy(1), **kw}).json()[
                "meta_info"]["cached_tokens"]

        assert cached(extra_key="tenant-a") == 0
        assert cached(extra_key="tenant-b") == 0  # a's pages are not b's
        assert cached(cache_salt="tenant-a") > 10  # the same salt (vLLM's name) shares
        assert cached() == 0  # no salt: the shared tree, which holds neither tenant's prefix
        r = c.post("/generate", json={"text": text, "extra_key": "a", "cache_salt": "b"})
    assert r.status_code == 400 and "cache_salt" in r.json()["error"]["message"]


def test_concate_and_append_request_is_accepted_and_validated(server):
    with server.client() as c:
        ok = c.post("/concate_and_append_request", json={"src_rids": ["a", "b"], "dst_rid": "c"})
        bad = c.post("/concate_and_append_request", json={"src_rids": "a"})
    assert ok.status_code == 200 and ok.json()["success"] is True
    assert bad.status_code == 400
