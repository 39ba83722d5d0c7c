"""The Engine on the default model: text in and out, chat turns that hit the cache, streaming."""

import pytest

from radixkv.errors import InvalidRequestError
from tests.sched.conftest import assert_idle_and_clean, greedy

SYSTEM_PROMPT = "You are a concise assistant. Answer in one short sentence, without preamble."


def test_generate_text_matches_the_documented_shape(default_engine):
    out = default_engine.generate("The capital of France is", {"max_new_tokens": 16, "temperature": 0})
    assert set(out) == {"text", "output_ids", "meta_info"}
    meta = out["meta_info"]
    assert {"id", "prompt_tokens", "cached_tokens", "completion_tokens", "finish_reason"} <= set(meta)
    assert "Paris" in out["text"] and meta["completion_tokens"] == len(out["output_ids"])
    outs = default_engine.generate(["a", "b"], {"max_new_tokens": 8})
    assert isinstance(outs, list) and len(outs) == 2
    outs = default_engine.generate(input_ids=[[1, 2, 3]], sampling_params={"max_new_tokens": 4})
    assert len(outs) == 1 and outs[0]["meta_info"]["prompt_tokens"] == 3


def test_each_chat_turn_hits_the_whole_previous_turn(default_engine):
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    previous = None
    for question in ["What is the capital of France?", "And of Germany?", "And of Italy?"]:
        messages.append({"role": "user", "content": question})
        prompt = default_engine.tokenizer.apply_chat_template(messages)
        out = default_engine.generate(input_ids=prompt, sampling_params=greedy(24))
        if previous is not None:
            prev_prompt, prev_out = previous
            # everything the last turn computed: its prompt and its answer minus the final token
            assert out["meta_info"]["cached_tokens"] >= len(prev_prompt) + len(prev_out["output_ids"]) - 1
        messages.append({"role": "assistant", "content": out["text"]})
        previous = (prompt, out)
    assert_idle_and_clean(default_engine)


def test_a_shared_system_prompt_hits_for_every_request_after_the_first(default_engine):
    default_engine.flush_cache()
    system = [{"role": "system", "content": SYSTEM_PROMPT * 3}]
    questions = ["Name a color.", "Name a fruit.", "Name a planet.", "Name a tree."]
    prompts = [default_engine.tokenizer.apply_chat_template(system + [{"role": "user", "content": q}])
               for q in questions]
    system_len = len(default_engine.tokenizer.apply_chat_template(system, add_generation_prompt=False))
    outs = default_engine.generate(input_ids=prompts, sampling_params=greedy(4))
    cached = [o["meta_info"]["cached_tokens"] for o in outs]
    assert cached[0] == 0
    assert all(c >= system_len - 2 for c in cached[1:]), cached


def test_stop_strings_end_and_trim_the_text(default_engine):
    free = default_engine.generate("Count: 1, 2, 3,", greedy(12))["text"]
    stop = free.strip().split(",")[1].strip() if "," in free else free.strip()[:2]
    out = default_engine.generate("Count: 1, 2, 3,", greedy(12, stop=[stop]))
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert stop not in out["text"] and free.startswith(out["text"])


def test_streaming_yields_the_same_text_as_generate(default_engine):
    full = default_engine.generate("Write one sentence about cats.", greedy(20))
    chunks = list(default_engine.generate_stream("Write one sentence about cats.", greedy(20)))
    assert "".join(c["text"] for c in chunks) == full["text"]
    assert [t for c in chunks for t in c["output_ids"]] == full["output_ids"]
    assert chunks[-1]["finished"] and not any(c["finished"] for c in chunks[:-1])


def test_a_stream_ending_on_a_one_character_stop_string_trims_it_like_generate(default_engine):
    # a 1-character stop string holds nothing back: the token that ends generation carries it
    params = greedy(12, stop=["\n"])
    full = default_engine.generate("The capital of France is", params)
    assert full["meta_info"]["finish_reason"] == {"type": "stop", "matched": "\n"}
    chunks = list(default_engine.generate_stream("The capital of France is", params))
    assert "".join(c["text"] for c in chunks) == full["text"] and "\n" not in full["text"]


def test_chat_rejects_malformed_messages(default_engine):
    with pytest.raises(InvalidRequestError, match=r"messages\[0\]"):
        default_engine.chat([{"content": "hi"}])
    with pytest.raises(InvalidRequestError, match="exactly one of prompt or input_ids"):
        default_engine.generate()
