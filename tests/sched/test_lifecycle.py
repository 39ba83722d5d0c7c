"""Aborts, stops, limits and bad input: nothing leaks and the engine keeps serving."""

import pytest

from radixkv.errors import EngineError, InvalidRequestError
from radixkv.sampling_params import SamplingParams
from radixkv.sched import Req
from tests.sched.conftest import SYSTEM, assert_idle_and_clean, greedy, workload


def test_abort_of_waiting_and_running_requests_frees_everything(tiny_scheduler):
    sched = tiny_scheduler(max_running_requests=2)
    reqs = [Req(f"r{i}", p, SamplingParams(max_new_tokens=30, temperature=0)) for i, p in enumerate(workload())]
    for r in reqs:
        sched.add_request(r)
    for _ in range(4):
        sched.step()
    running = [r.rid for r in sched.scheduler.running]
    waiting = [r.rid for r in sched.scheduler.waiting]
    assert running and waiting
    out = sched.abort(running[0])
    assert out.finished and out.finish_reason["type"] == "abort"
    assert sched.abort(waiting[-1]).finish_reason["type"] == "abort"
    assert sched.abort(waiting[-1]) is None  # already gone
    sched.check_invariants()
    while sched.has_work:
        sched.step()
        sched.check_invariants()
    assert_idle_and_clean(sched)


def test_closing_a_stream_early_aborts_its_request(tiny_model_dir, default_engine):
    stream = default_engine.generate_stream("Tell me a long story.", greedy(64, ignore_eos=True))
    chunks = [next(stream) for _ in range(3)]
    assert all(not c["finished"] for c in chunks)
    stream.close()
    assert_idle_and_clean(default_engine)


@pytest.mark.parametrize("params,field", [
    ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"max_new_tokens": 10**9}, "max_new_tokens"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_p": 2}, "top_p"),
    ({"top_k": "5"}, "top_k"),
    ({"stop": "x"}, "stop strings need a tokenizer"),
])
def test_bad_sampling_params_are_typed_errors(tiny_engine, params, field):
    engine = tiny_engine()
    with pytest.raises(InvalidRequestError, match=field):
        engine.generate(input_ids=[1, 2, 3], sampling_params=params)
    assert engine.generate(input_ids=[1, 2, 3], sampling_params=greedy(2))["meta_info"]["completion_tokens"] == 2


@pytest.mark.parametrize("ids,message", [
    ([], "prompt is empty"),
    ([1, 2, 512], r"input_ids\[2\]=512 is not a token id"),
    ([1, -1], r"input_ids\[1\]=-1"),
    ([1, "a"], r"input_ids\[1\]='a'"),
    (list(range(1, 500)) * 2, "exceeds the context length of 512"),
])
def test_bad_prompts_are_typed_errors(tiny_engine, ids, message):
    engine = tiny_engine()
    with pytest.raises(InvalidRequestError, match=message):
        engine.generate(input_ids=ids, sampling_params=greedy(4))
    assert_idle_and_clean(engine)


def test_a_prompt_larger_than_the_pool_is_rejected_and_others_still_run(tiny_engine):
    engine = tiny_engine(max_total_tokens=64)
    with pytest.raises(InvalidRequestError, match="more KV than the whole pool holds"):
        engine.generate(input_ids=list(range(1, 60)), sampling_params=greedy(16))
    with pytest.raises(InvalidRequestError, match=r"request \[1\]: input_ids\[0\]=9999"):
        engine.generate(input_ids=[[1, 2], [9999]], sampling_params=greedy(2))
    assert engine.get_stats()["admitted_requests"] == 0  # the good one in the batch did not run
    assert engine.generate(input_ids=[1, 2, 3], sampling_params=greedy(4))["output_ids"]
    assert_idle_and_clean(engine)


def test_stop_token_ids_min_and_max_new_tokens(tiny_engine):
    engine = tiny_engine()
    free_run = engine.generate(input_ids=SYSTEM, sampling_params=greedy(10))["output_ids"]
    stop_at = free_run[3]
    out = engine.generate(input_ids=SYSTEM, sampling_params=greedy(10, stop_token_ids=[stop_at]))
    assert out["output_ids"] == free_run[: free_run.index(stop_at) + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_at}
    late = engine.generate(input_ids=SYSTEM, sampling_params=greedy(10, stop_token_ids=[stop_at], min_new_tokens=8))
    assert stop_at not in late["output_ids"][:8]
    none = engine.generate(input_ids=SYSTEM, sampling_params=greedy(0))
    assert none["output_ids"] == [] and none["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    assert_idle_and_clean(engine)


def test_seeded_sampling_is_reproducible_whatever_the_batch(tiny_engine):
    engine = tiny_engine()
    params = {"max_new_tokens": 12, "temperature": 1.0, "seed": 7}
    alone = engine.generate(input_ids=workload()[2], sampling_params=params)["output_ids"]
    batch = engine.generate(input_ids=workload(), sampling_params=[params if i == 2 else greedy()
                                                                   for i in range(len(workload()))])
    assert batch[2]["output_ids"] == alone
    other_seed = engine.generate(input_ids=workload()[2], sampling_params={**params, "seed": 8})
    assert other_seed["output_ids"] != alone


def test_namespaces_isolate_cached_prefixes(tiny_engine):
    engine = tiny_engine()
    engine.generate(input_ids=workload()[0], sampling_params=greedy(2), namespace="lora-a")
    b = engine.generate(input_ids=workload()[0], sampling_params=greedy(2), namespace="lora-b")
    a = engine.generate(input_ids=workload()[0], sampling_params=greedy(2), namespace="lora-a")
    assert b["meta_info"]["cached_tokens"] == 0
    assert a["meta_info"]["cached_tokens"] == len(workload()[0]) - 1


def test_shutdown_engine_refuses_work(tiny_engine):
    engine = tiny_engine()
    engine.shutdown()
    with pytest.raises(EngineError, match="shut down"):
        engine.generate(input_ids=[1, 2], sampling_params=greedy(2))


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_next_turn_hits_prompt_and_answer_minus_page_rounding(tiny_engine, page_size):
    engine = tiny_engine(page_size=page_size)
    prompt = SYSTEM + [100, 101, 102]
    for turn in range(3):
        out = engine.generate(input_ids=prompt, sampling_params=greedy(9))
        history = prompt + out["output_ids"]
        prompt = history + [150 + turn, 151 + turn]
        nxt = engine.generate(input_ids=prompt, sampling_params=greedy(1))
        computed = len(history) - 1  # the last sampled token never went through the model
        assert nxt["meta_info"]["cached_tokens"] == computed - computed % page_size
    assert_idle_and_clean(engine)
