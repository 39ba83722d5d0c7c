"""What OpenAI-API clients beyond the `openai` package need: `echo` with prompt log-probs
(lm-eval's loglikelihood requests), `name` on messages, a chat stream whose first chunk is the
first token, the extra chat fields SGLang's router adds, `continue_final_message`, and
`cache_salt` -- against the real server."""

import json

import pytest

MODEL = "SmolLM2-135M-Instruct"


def events(c, path, body):
    with c.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def test_echo_returns_the_prompt_and_its_log_probs_as_lm_eval_reads_them(server, default_engine):
    ids = default_engine.tokenizer.encode("The capital of France is Paris")
    ref = default_engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0},
                                  return_logprob=True, logprob_start_len=0, top_logprobs_num=1)
    with server.client() as c:
        # lm-eval local-completions: token-id prompts, echo, logprobs=1, max_tokens=1
        out = c.post("/v1/completions", json={"model": MODEL, "prompt": [ids], "echo": True, "logprobs": 1,
                                              "max_tokens": 1, "temperature": 0, "seed": 1234}).json()
        plain = c.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "echo": False, "max_tokens": 2})
        only_prompt = c.post("/v1/completions", json={"model": MODEL, "prompt": "The capital of France is",
                                                      "echo": True, "max_tokens": 0}).json()
    lp = out["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == len(ids) + 1 and lp["token_logprobs"][0] is None
    assert lp["top_logprobs"][0] is None and all(isinstance(t, dict) for t in lp["top_logprobs"][1:])
    expected = [v for v, _ in ref["meta_info"]["input_token_logprobs"][1:]]
    assert lp["token_logprobs"][1:len(ids)] == pytest.approx(expected, abs=1e-4)
    assert lp["token_logprobs"][-1] == pytest.approx(ref["meta_info"]["output_token_logprobs"][0][0], abs=1e-4)
    # lm-eval's is_greedy compares each token's log-prob with its position's best
    assert all(max(top.values()) >= v - 1e-6 for v, top in zip(lp["token_logprobs"][1:], lp["top_logprobs"][1:]))
    assert "".join(lp["tokens"][:len(ids)]) == default_engine.tokenizer.decode(ids, skip_special_tokens=False)
    assert out["choices"][0]["text"].startswith("The capital of France is Paris")
    assert lp["text_offset"] == sorted(lp["text_offset"])
    assert plain.status_code == 200
    assert only_prompt["choices"][0]["text"] == "The capital of France is"
    assert only_prompt["usage"]["completion_tokens"] == 0


def test_a_streamed_echo_starts_with_the_prompt(server):
    with server.client() as c:
        got = events(c, "/v1/completions", {"model": MODEL, "prompt": "A lighthouse is", "echo": True,
                                            "max_tokens": 4, "temperature": 0})
        plain = c.post("/v1/completions", json={"model": MODEL, "prompt": "A lighthouse is", "max_tokens": 4,
                                                "temperature": 0}).json()
    assert got[0]["choices"][0]["text"].startswith("A lighthouse is")
    assert "".join(e["choices"][0]["text"] for e in got) == "A lighthouse is" + plain["choices"][0]["text"]


def test_the_chat_streams_first_chunk_is_the_first_token_with_the_role(server):
    with server.client() as c:
        got = events(c, "/v1/chat/completions", {
            "model": MODEL, "messages": [{"role": "user", "content": "Say hello.", "name": "ada"}],
            "max_tokens": 6, "temperature": 0})
    first = got[0]["choices"][0]["delta"]
    assert first["role"] == "assistant" and first["content"]  # no role-only or empty chunk before it
    contents = [e["choices"][0]["delta"].get("content") for e in got if e["choices"]]
    assert all(x for x in contents if x is not None) and "role" not in got[1]["choices"][0]["delta"]
    assert got[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_the_chat_fields_sglangs_router_adds_are_taken(server):
    messages = [{"role": "user", "content": "Name a colour."}]
    with server.client() as c:
        base = c.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 5,
                                                    "temperature": 0}).json()
        routed = c.post("/v1/chat/completions", json={
            "model": MODEL, "messages": messages, "max_tokens": 5, "temperature": 0, "no_stop_trim": False,
            "continue_final_message": False, "skip_special_tokens": True, "separate_reasoning": True,
            "stream_reasoning": True, "return_hidden_states": False, "chat_template_kwargs": {},
            "stop_token_ids": [], "lora_path": None}).json()
        bad = c.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "lora_path": "adapter"})
    assert routed["choices"][0]["message"] == base["choices"][0]["message"]
    assert bad.status_code == 400 and "lora_path" in bad.json()["error"]["message"]


def test_continue_final_message_continues_the_assistants_text(server, default_engine):
    messages = [{"role": "user", "content": "Count to five."}, {"role": "assistant", "content": "1, 2, 3,"}]
    with server.client() as c:
        out = c.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 6,
                                                   "temperature": 0, "continue_final_message": True}).json()
        bad = c.post("/v1/chat/completions", json={"model": MODEL, "messages": messages[:1],
                                                   "continue_final_message": True})
    prompt = default_engine.tokenizer.apply_chat_template(messages, continue_final_message=True)
    assert default_engine.tokenizer.decode(prompt, skip_special_tokens=False).endswith("1, 2, 3,")
    assert out["usage"]["prompt_tokens"] == len(prompt)
    expected = default_engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 6, "temperature": 0})
    assert out["choices"][0]["message"]["content"] == expected["text"]
    assert bad.status_code == 400 and "continue_final_message" in bad.json()["error"]["message"]


def test_cache_salt_namespaces_chat_and_completions(server):
    text = "Tenant isolation: a long shared system prompt that would otherwise be cached for everyone."
    with server.client() as c:
        c.post("/flush_cache")

        def cached(path, **kw):
            body = ({"messages": [{"role": "user", "content": text}]} if "chat" in path else {"prompt": text})
            r = c.post(path, json={"model": MODEL, "max_tokens": 1, **body, **kw}).json()
            return r["usage"]["prompt_tokens_details"]["cached_tokens"]

        assert cached("/v1/chat/completions", cache_salt="a") == 0
        assert cached("/v1/chat/completions", cache_salt="b") == 0
        assert cached("/v1/chat/completions", cache_salt="a") > 10
        assert cached("/v1/completions", cache_salt="b") == 0  # b's chat prompt is not this text's prefix
        assert cached("/v1/completions", cache_salt="b") > 10
        assert cached("/v1/completions") == 0
