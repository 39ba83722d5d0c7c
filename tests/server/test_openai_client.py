"""The official `openai` client against the real server."""

import openai
import pytest

from tests.server_helpers import API_KEY

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, timeout=120, max_retries=0)


def ask(question):
    return [{"role": "system", "content": "You are a concise assistant."}, {"role": "user", "content": question}]


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_models_retrieve_gets_the_served_model_and_404_for_another(client, server):
    """Issue 41: `client.models.retrieve` was a 404 (OpenAI and SGLang serve it)."""
    (listed,) = client.models.list().data
    got = client.models.retrieve(listed.id)
    assert got.id == listed.id and got.owned_by == "radixkv"
    assert client.models.retrieve(server.info()["model_dir"]).id == listed.id  # by its directory too
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("gpt-4o")


def test_chat_completion_and_its_stream_say_the_same(client):
    full = client.chat.completions.create(model=MODEL, messages=ask("What is the capital of France?"),
                                          max_tokens=16, temperature=0)
    text = full.choices[0].message.content
    assert "Paris" in text and full.choices[0].finish_reason in ("stop", "length")
    assert full.usage.prompt_tokens > 0 and full.usage.completion_tokens > 0
    stream = client.chat.completions.create(model=MODEL, messages=ask("What is the capital of France?"),
                                            max_tokens=16, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    # the same prompt again: all of it but the last token came from the cache
    details = chunks[-1].usage.prompt_tokens_details
    assert details.cached_tokens == full.usage.prompt_tokens - 1
    # ... and the usage extension says why each prompt token hit or missed
    causes = details.model_extra["cache"]
    assert sum(causes.values()) == full.usage.prompt_tokens and causes["device"] == details.cached_tokens
    assert sum(full.usage.prompt_tokens_details.model_extra["cache"].values()) == full.usage.prompt_tokens


def test_completions_with_stop_and_seed(client):
    out = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=12,
                                    temperature=0, stop=["\n"])
    assert "Paris" in out.choices[0].text and "\n" not in out.choices[0].text
    a = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=1.0, seed=3)
    b = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=1.0, seed=3)
    assert a.choices[0].text == b.choices[0].text


def test_n_choices_share_one_computation_of_the_prompt(client, server):
    messages = ask("Give me a name for a lighthouse keeper's cat, and say why. " * 3)
    before = server.info()["stats"]["prefill_tokens"]
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=1.0,
                                         seed=11, n=2)
    assert [c.index for c in out.choices] == [0, 1]
    assert out.choices[0].message.content != out.choices[1].message.content  # seeds 11 and 12
    computed = server.info()["stats"]["prefill_tokens"] - before
    assert computed <= out.usage.prompt_tokens + 2  # the prompt once, then one last token per choice


def test_cached_tokens_grow_over_a_three_turn_conversation(client):
    messages = [{"role": "system", "content": "You are a helpful assistant who answers briefly."}]
    cached = []
    for question in ["Name a large ocean.", "Name a small sea.", "Which of the two is saltier?"]:
        messages.append({"role": "user", "content": question})
        out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0)
        cached.append(out.usage.prompt_tokens_details.cached_tokens)
        messages.append({"role": "assistant", "content": out.choices[0].message.content})
    assert cached[1] > cached[0] and cached[2] > cached[1]


def test_chat_logprobs_and_top_logprobs(client):
    out = client.chat.completions.create(model=MODEL, messages=ask("Say hello."), max_tokens=6, temperature=0,
                                         logprobs=True, top_logprobs=3)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    assert "".join(c.token for c in content).startswith(out.choices[0].message.content[:3])
    for c in content:
        assert c.logprob <= 0 and len(c.top_logprobs) == 3
        assert c.top_logprobs[0].token == c.token  # greedy: the chosen token is the most likely
        assert c.top_logprobs[0].logprob == pytest.approx(c.logprob)
    stream = client.chat.completions.create(model=MODEL, messages=ask("Say hello."), max_tokens=6, temperature=0,
                                            logprobs=True, stream=True)
    streamed = [e.logprob for chunk in stream if chunk.choices and chunk.choices[0].logprobs
                for e in chunk.choices[0].logprobs.content]
    assert streamed == pytest.approx([c.logprob for c in content], abs=1e-4)  # the rerun hits the cache


def test_completion_logprobs(client):
    out = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0,
                                    logprobs=2)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert "".join(lp.tokens).startswith(out.choices[0].text[:2]) and all(len(t) == 2 for t in lp.top_logprobs)
