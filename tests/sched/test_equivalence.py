"""Greedy outputs are the same however the scheduler gets there."""

import pytest

from radixkv.mem import POLICIES

from tests.sched.conftest import assert_idle_and_clean, greedy, workload


@pytest.fixture(scope="module")
def baseline(tiny_model_dir):
    """One request at a time, no prefix cache, roomy pool."""
    from radixkv.engine import Engine

    engine = Engine(str(tiny_model_dir("llama")), disable_radix_cache=True, max_total_tokens=2048,
                    progress=False, log_level="warning")
    outs = [engine.generate(input_ids=p, sampling_params=greedy())["output_ids"] for p in workload()]
    engine.shutdown()
    return outs


def run_batched(engine, repeats=2):
    """The workload twice in one batch (the second copy hits whatever the first cached)."""
    prompts = workload() * repeats
    outs = engine.generate(input_ids=prompts, sampling_params=greedy())
    return [o["output_ids"] for o in outs], outs


@pytest.mark.parametrize("options", [
    dict(),
    dict(disable_radix_cache=True),
    dict(schedule_policy="fcfs"),
    dict(schedule_policy="dfs-weight"),
    dict(chunked_prefill_size=8, max_prefill_tokens=16),
    dict(page_size=4),
    dict(page_size=4, chunked_prefill_size=8, schedule_policy="dfs-weight"),
    dict(eviction_policy="lfu"),
], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_batched_outputs_equal_one_at_a_time_without_cache(tiny_engine, baseline, options):
    engine = tiny_engine(**options)
    got, _ = run_batched(engine)
    assert got == baseline * 2
    assert_idle_and_clean(engine)


@pytest.mark.parametrize("policy", ["lpm", "fcfs", "dfs-weight"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_a_tight_pool_evicts_and_retracts_but_outputs_stay_equal(tiny_engine, baseline, policy, page_size):
    # each request needs at most 48 tokens; 12 of them at once need far more than 64
    engine = tiny_engine(max_total_tokens=64, schedule_policy=policy, page_size=page_size,
                         retract_decode_steps=2)
    got, _ = run_batched(engine)
    assert got == baseline * 2
    stats = engine.get_stats()
    assert stats["retractions"] > 0 and stats["evicted_tokens"] > 0
    assert_idle_and_clean(engine)


@pytest.mark.parametrize("eviction", sorted(POLICIES))
def test_eviction_policy_changes_speed_never_results(tiny_engine, baseline, eviction):
    engine = tiny_engine(max_total_tokens=64, eviction_policy=eviction, retract_decode_steps=2)
    got, _ = run_batched(engine, repeats=3)
    assert got == baseline * 3
    assert engine.get_stats()["evicted_tokens"] > 0
    assert_idle_and_clean(engine)


def test_cache_hits_are_reported_and_counted(tiny_engine):
    engine = tiny_engine()
    first = engine.generate(input_ids=workload(), sampling_params=greedy())
    again = engine.generate(input_ids=workload(), sampling_params=greedy())
    for prompt, a, b in zip(workload(), first, again):
        assert b["meta_info"]["cached_tokens"] == len(prompt) - 1  # all but the last token
        assert b["output_ids"] == a["output_ids"]
    stats = engine.get_stats()
    assert stats["prompt_tokens"] == 2 * sum(len(p) for p in workload())
    cached = sum(o["meta_info"]["cached_tokens"] for o in first + again)
    assert stats["cached_prompt_tokens"] == cached
    assert stats["cache_hit_rate"] == pytest.approx(cached / stats["prompt_tokens"])
    assert engine.flush_cache()
    assert engine.get_stats()["free_tokens"] == engine.get_stats()["total_tokens"]
    assert engine.generate(input_ids=workload()[0], sampling_params=greedy())["meta_info"]["cached_tokens"] == 0


def test_in_batch_sharing_computes_a_common_new_prefix_once(tiny_engine):
    shared = list(range(50, 114))  # 64 new tokens common to every request, nothing cached yet
    prompts = [shared + [200 + i, 201 + i] for i in range(4)]
    engine = tiny_engine()
    outs = engine.generate(input_ids=prompts, sampling_params=greedy(4))
    cached = [o["meta_info"]["cached_tokens"] for o in outs]
    assert cached[0] == 0 and all(c >= len(shared) for c in cached[1:])
    baseline = tiny_engine(disable_radix_cache=True).generate(input_ids=prompts, sampling_params=greedy(4))
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in baseline]
