"""The trace simulator against the reference figures of benchmarks/data/README.md."""

from pathlib import Path

import pytest

from radixkv.workloads.chat import ChatTraceConfig, generate_chat_trace, write_trace
from radixkv.workloads.replay import replay
from radixkv.workloads.trace import load_trace

MOONCAKE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "mooncake_conversation_trace.jsonl"
needs_trace = pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"{MOONCAKE} not present")


@pytest.fixture(scope="module")
def mooncake():
    return load_trace(MOONCAKE)


@needs_trace
@pytest.mark.slow  # 18 s; the full-trace reference figure of LRU is checked below, "inf" bounds a slice in the host-tier test
def test_unlimited_cache_reproduces_the_reference_hit_rate(mooncake):
    result = replay(mooncake, "inf", page_size=512)
    assert result.requests == 12031
    assert abs(100 * result.hit_rate - 37.4) <= 0.2, result.hit_rate


@needs_trace
def test_lru_over_10000_pages_reproduces_the_reference_hit_rate(mooncake):
    result = replay(mooncake, "lru", capacity_tokens=10_000 * 512, page_size=512)
    assert abs(100 * result.hit_rate - 21.5) <= 0.5, result.hit_rate
    assert result.evicted_tokens > 0


@needs_trace
@pytest.mark.slow  # 36 s; the bounds' reference figures are checked in test_lru/unlimited above
def test_the_offline_bounds_order_the_policies_on_a_slice(mooncake):
    head = mooncake[:1500]
    online = ("lru", "lfu", "fifo", "reuse", "reuse-cost")
    rates = {p: replay(head, p, 1_000_000, check_every=1000).hit_rate
             for p in (*online, "reuse-oracle", "belady", "inf", "none")}
    assert rates["none"] == 0
    assert max(rates[p] for p in online) <= rates["reuse-oracle"] <= rates["belady"] <= rates["inf"]


def test_replay_of_a_chat_trace_hits_the_shared_history(tmp_path):
    cfg = ChatTraceConfig(num_requests=80, num_conversations=10, system_tokens=64, seed=1)
    path = tmp_path / "chat.jsonl"
    write_trace(generate_chat_trace(cfg), path)
    trace = load_trace(path)
    big = replay(trace, "lru", 1_000_000, page_size=16, check_every=10)
    tight = replay(trace, "lru", 2_000, page_size=16, check_every=10)
    ceiling = replay(trace, "inf", page_size=16)
    assert big.hit_rate == ceiling.hit_rate > 0.5
    assert tight.hit_rate < big.hit_rate and tight.evicted_tokens > 0
    assert big.prefill_work_saved <= big.prefill_work


@needs_trace
def test_a_host_tier_adds_host_hits_on_top_of_the_same_device_hits(mooncake):
    trace = mooncake[:800]
    none = replay(trace, "lru", capacity_tokens=1_000_000, page_size=512)
    rows = {m: replay(trace, "lru", capacity_tokens=1_000_000, page_size=512, host_capacity_tokens=m * 1_000_000,
                      check_every=100) for m in (2, 4)}
    assert none.host_hit_tokens == 0
    for m, r in rows.items():
        assert r.device_hit_tokens + r.host_hit_tokens == r.hit_tokens
        assert r.host_hit_tokens > 0 and r.hit_rate > none.hit_rate + 0.05
    assert rows[4].hit_rate >= rows[2].hit_rate
    # unlimited memory bounds what any split between tiers can serve
    assert rows[4].hit_rate <= replay(trace, "inf", page_size=512).hit_rate + 1e-9
    through = replay(trace, "lru", capacity_tokens=1_000_000, page_size=512, host_capacity_tokens=2_000_000,
                     host_write_policy="write-through", check_every=100)
    assert through.host_hit_tokens > 0


def conversation_and_one_offs():
    """A conversation whose second turn comes after two one-off prompts have filled the cache
    (4 pages of 16 tokens): LRU evicts its first turn just before it is needed."""
    from radixkv.workloads.trace import TraceRequest

    turns = [(0, (1, 2)), (1000, (10, 11)), (2000, (20, 21)), (3000, (1, 2, 3))]  # (ms, block ids)
    return [TraceRequest(float(ms), 16 * len(blocks), 8, blocks) for ms, blocks in turns]


def test_oracle_retention_hints_keep_a_conversation_that_continues():
    trace = conversation_and_one_offs()
    run = dict(capacity_tokens=64, page_size=16, block_size=16, check_every=1)
    lru = replay(trace, "lru", **run)
    hinted = replay(trace, "lru", hints="oracle", hint_seconds=60, **run)
    assert lru.hit_tokens == 0
    assert hinted.hit_tokens == 32 and hinted.hinted_requests == 1  # only the turn that continues
    # hinting every request ranks them all by deadline, that is by when they were cached: LRU again
    assert replay(trace, "lru", hints="all", hint_seconds=60, **run).hit_tokens == 0
    # the replay's clock is the trace's: a hint shorter than the gap runs out before it helps
    assert replay(trace, "lru", hints="oracle", hint_seconds=0.5, **run).hit_tokens == 0


def test_a_storage_tier_adds_storage_hits_under_the_same_device_and_host_hits(mooncake):
    trace = mooncake[:800]
    host = replay(trace, "lru", capacity_tokens=500_000, page_size=512, host_capacity_tokens=500_000)
    three = replay(trace, "lru", capacity_tokens=500_000, page_size=512, host_capacity_tokens=500_000,
                   storage_capacity_tokens=4_000_000, check_every=100)
    assert host.storage_hit_tokens == 0
    assert three.device_hit_tokens + three.host_hit_tokens + three.storage_hit_tokens == three.hit_tokens
    assert three.device_hit_tokens == host.device_hit_tokens  # loads only turn misses into reads
    assert three.storage_hit_tokens > 0 and three.hit_rate > host.hit_rate
    assert three.hit_rate <= replay(trace, "inf", page_size=512).hit_rate + 1e-9
    with pytest.raises(ValueError, match="host tier"):
        replay(trace[:5], "lru", capacity_tokens=500_000, page_size=512, storage_capacity_tokens=1_000_000)
