"""Routed replay on a slice of the Mooncake trace: cache-aware routing keeps (nearly) one big
cache's hit rate with an even load; round-robin does not."""

from pathlib import Path

import pytest

from radixkv.workloads.replay import replay
from radixkv.workloads.routing import replay_routed
from radixkv.workloads.trace import load_trace

MOONCAKE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "mooncake_conversation_trace.jsonl"


@pytest.mark.skipif(not MOONCAKE.is_file(), reason="trace not present")
def test_cache_aware_routing_is_within_two_points_of_one_big_cache():
    trace = load_trace(MOONCAKE, 1500)
    one = replay(trace, "lru", capacity_tokens=2 * 500_000, page_size=512)
    aware = replay_routed(trace, "cache_aware", 2, 500_000)
    rr = replay_routed(trace, "round_robin", 2, 500_000)
    assert sum(aware.requests_per_worker) == rr.requests == 1500
    assert aware.hit_rate >= one.hit_rate - 0.02 and aware.imbalance < 1.2
    assert rr.hit_rate < aware.hit_rate - 0.005
    assert aware.decisions["cache"] > 0


@pytest.mark.skipif(not MOONCAKE.is_file(), reason="trace not present")
def test_a_shared_store_gives_round_robin_replicas_what_any_of_them_computed():
    trace = load_trace(MOONCAKE, 1500)
    alone = replay_routed(trace, "round_robin", 2, 500_000, host_tokens=64_000)
    shared = replay_routed(trace, "round_robin", 2, 500_000, host_tokens=64_000, store_tokens=4_000_000)
    one = replay(trace, "lru", capacity_tokens=2 * 500_000, page_size=512)
    assert alone.store_hit_tokens == 0 and shared.store_hit_tokens > 0
    assert shared.hit_rate > alone.hit_rate + 0.02  # what the other replica computed now hits
    assert shared.hit_rate >= one.hit_rate - 0.01  # as good as one big cache, whichever replica it lands on
    assert shared.hit_tokens > shared.host_hit_tokens + shared.store_hit_tokens  # the device hits too
