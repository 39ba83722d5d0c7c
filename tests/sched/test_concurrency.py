"""One Engine from many threads and interleaved streams; the loop's typed error replies."""

import threading

import pytest

from radixkv.errors import ErrorKind, InvalidRequestError
from radixkv.sampling_params import SamplingParams
from radixkv.sched import Req
from radixkv.core.loop import AddRequest, SchedulerLoop
from tests.sched.conftest import assert_idle_and_clean, greedy, workload


def test_four_threads_share_one_engine_and_get_their_own_answers(tiny_engine):
    engine = tiny_engine()
    prompts = workload()
    expected = [engine.generate(input_ids=p, sampling_params=greedy(10))["output_ids"] for p in prompts]
    results, errors = {}, []

    def worker(k):
        try:
            for rnd in range(3):
                i = (k + rnd) % len(prompts)
                results[(k, rnd)] = (i, engine.generate(input_ids=prompts[i], sampling_params=greedy(10))["output_ids"])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(results) == 12
    assert all(out == expected[i] for i, out in results.values())
    assert_idle_and_clean(engine)


def test_generate_while_a_stream_is_open_and_after_one_is_abandoned(default_engine):
    stream = default_engine.generate_stream("Tell me about lighthouses.", greedy(40, ignore_eos=True))
    first = next(stream)
    assert not first["finished"]
    out = default_engine.generate("The capital of France is", greedy(8))
    assert "Paris" in out["text"]
    rest = list(stream)  # the held stream still has all of its tokens
    assert rest[-1]["finished"]
    assert len(first["output_ids"]) + sum(len(c["output_ids"]) for c in rest) == 40
    held = default_engine.generate_stream("Tell me about ships.", greedy(40, ignore_eos=True))
    next(held)  # broken out of, never closed: its request keeps running on its own
    assert default_engine.generate("2 + 2 =", greedy(4))["meta_info"]["completion_tokens"] == 4
    held.close()
    assert_idle_and_clean(default_engine)


def test_abort_ends_a_stream_with_finish_reason_abort(default_engine):
    stream = default_engine.generate_stream("Write a long poem.", greedy(200, ignore_eos=True))
    first = next(stream)
    assert default_engine.abort(first["meta_info"]["id"])
    chunks = list(stream)
    assert chunks[-1]["finished"] and chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert not default_engine.abort(first["meta_info"]["id"])  # no longer in flight
    assert_idle_and_clean(default_engine)


@pytest.mark.parametrize("prompt", [123, [1, 2], {"text": "hi"}])
def test_a_prompt_of_the_wrong_type_is_a_typed_error(default_engine, prompt):
    with pytest.raises(InvalidRequestError):
        default_engine.generate(prompt, greedy(2))


def test_outputs_carry_only_the_new_tokens(tiny_scheduler):
    sched = tiny_scheduler()
    req = Req("r", [5, 6, 7], SamplingParams(max_new_tokens=6, temperature=0))
    sched.add_request(req)
    seen = []
    while sched.has_work:
        for out in sched.step():
            assert len(out.new_ids) <= 1
            seen.extend(out.new_ids)
    assert seen == req.output_ids and len(seen) == 6


def test_the_loop_answers_a_refused_request_with_a_typed_error_reply(tiny_scheduler):
    sched = tiny_scheduler()
    delivered = []
    loop = SchedulerLoop(sched, delivered.extend)
    loop.apply(AddRequest(Req("bad", [1, 99999], SamplingParams(max_new_tokens=2))))
    (out,) = delivered
    assert out.finished and out.error_kind == ErrorKind.INVALID_REQUEST and "input_ids[1]=99999" in out.error
    loop.apply(AddRequest(Req("ok", [1, 2], SamplingParams(max_new_tokens=2))))
    loop.apply(AddRequest(Req("ok", [1, 2], SamplingParams(max_new_tokens=2))))  # a duplicate id
    assert delivered[-1].error_kind == ErrorKind.INVALID_REQUEST and "already in use" in delivered[-1].error
    while sched.has_work:
        loop.deliver(sched.step())
    assert_idle_and_clean(sched)
