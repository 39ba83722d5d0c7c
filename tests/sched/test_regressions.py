"""Bugs found in review; each test failed before its fix."""

import pytest

from radixkv.errors import EngineError, InvalidRequestError
from radixkv.sampling_params import SamplingParams
from radixkv.sched import Req
from radixkv.sched.stop import finish_reason, trim_stop_string
from tests.sched.conftest import assert_idle_and_clean, greedy


@pytest.mark.timeout(60)
def test_page_rounding_cannot_make_a_valid_request_unadmittable(tiny_engine):
    # 2 pages of 4 tokens; 5 prompt + 3 new tokens = 8 tokens = 2 pages: valid. Admission used to
    # round the chunk and the decode headroom up separately (3 pages) and spin forever.
    engine = tiny_engine(max_total_tokens=8, page_size=4)
    out = engine.generate(input_ids=[1, 2, 3, 4, 5], sampling_params=greedy(3))
    assert len(out["output_ids"]) == 3
    assert_idle_and_clean(engine)


def test_a_failed_forward_never_puts_uncomputed_kv_in_the_cache(tiny_engine):
    engine = tiny_engine()
    prompt = list(range(10, 40))
    reference = engine.generate(input_ids=prompt, sampling_params=greedy(6))["output_ids"]
    engine.flush_cache()
    real_forward = engine.runner.forward

    def failing_forward(fb):
        raise RuntimeError("simulated device failure")

    engine.runner.forward = failing_forward
    with pytest.raises(EngineError, match="simulated"):  # the batch's requests end; the engine serves on
        engine.generate(input_ids=prompt, sampling_params=greedy(6))
    engine.runner.forward = real_forward
    assert engine.get_stats()["cached_tokens_in_tree"] == 0
    retry = engine.generate(input_ids=prompt, sampling_params=greedy(6))
    assert retry["output_ids"] == reference and retry["meta_info"]["cached_tokens"] == 0
    assert_idle_and_clean(engine)


class OneCharDecoder:
    """Token t decodes to chr(t): one character per token."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(t) for t in ids)


def finish_of(text, **params):
    req = Req("r", [1], SamplingParams(max_new_tokens=50, **params))
    reason = None
    for ch in text:
        req.output_ids.append(ord(ch))
        reason = finish_reason(req, frozenset(), 1000, OneCharDecoder())
        if reason:
            break
    return req, reason


def test_a_stop_string_before_min_new_tokens_neither_stops_nor_cuts():
    req, reason = finish_of("ab\ncdef\nxyz", stop=("\n",), min_new_tokens=4)
    assert reason == {"type": "stop", "matched": "\n"}
    assert len(req.output_ids) == 8  # stopped at the second newline, not the first
    assert trim_stop_string("ab\ncdef\n", reason) == "ab\ncdef"


def test_a_multi_character_stop_string_spanning_tokens_is_caught_once_complete():
    req, reason = finish_of("hello END world", stop=("END",))
    assert reason == {"type": "stop", "matched": "END"} and len(req.output_ids) == 9


def test_a_refused_stream_leaves_nothing_queued(tiny_engine):
    engine = tiny_engine()  # the tiny model ships no tokenizer: streaming text is refused
    with pytest.raises(InvalidRequestError, match="no tokenizer"):
        next(engine.generate_stream(input_ids=[1, 2, 3], sampling_params=greedy(2)))
    assert engine.get_stats()["waiting_requests"] == 0
    assert engine.flush_cache()


def test_a_request_that_cannot_be_admitted_yet_does_not_evict_the_cache(tiny_scheduler):
    sched = tiny_scheduler(max_total_tokens=64, retract_decode_steps=1)
    sched.add_request(Req("cached", list(range(100, 120)), SamplingParams(max_new_tokens=1, temperature=0)))
    while sched.has_work:
        sched.step()
    running = Req("running", list(range(200, 230)), SamplingParams(max_new_tokens=4, temperature=0))
    sched.add_request(running)
    sched.step()  # prefilled: holds 30 + pages
    big = Req("big", list(range(300, 340)), SamplingParams(max_new_tokens=1, temperature=0))
    sched.add_request(big)
    evicted_before = sched.cache.stats_evicted_tokens
    sched.step()
    assert big in sched.scheduler.waiting  # it does not fit yet, and evicting the cache would not help
    assert sched.cache.stats_evicted_tokens == evicted_before
    while sched.has_work:
        sched.step()
    assert_idle_and_clean(sched)


def test_a_request_counts_no_hit_on_what_it_inserted_itself(tiny_engine):
    engine = tiny_engine(eviction_policy="lfu")
    engine.generate(input_ids=list(range(10, 30)), sampling_params=greedy(3))
    hits = [n.hit_count for n in engine.core.cache.nodes()]
    assert hits and all(h == 0 for h in hits)
    engine.generate(input_ids=list(range(10, 30)), sampling_params=greedy(1))
    assert max(n.hit_count for n in engine.core.cache.nodes()) == 1


@pytest.mark.parametrize("namespace,message", [
    (["a"], "1 namespaces for 2 prompts"),
    ({"lora": 1}, "must be hashable"),
])
def test_bad_namespaces_are_typed_errors(tiny_engine, namespace, message):
    engine = tiny_engine()
    with pytest.raises(InvalidRequestError, match=message):
        engine.generate(input_ids=[[1, 2], [3, 4]], sampling_params=greedy(2), namespace=namespace)


def test_stop_token_ids_outside_the_vocabulary_are_rejected(tiny_engine):
    engine = tiny_engine()
    with pytest.raises(InvalidRequestError, match=r"stop_token_ids\[0\]=100000"):
        engine.generate(input_ids=[1, 2], sampling_params=greedy(4, stop_token_ids=[100000], min_new_tokens=2))


def test_a_vanishing_temperature_is_greedy_not_a_crash(tiny_engine):
    engine = tiny_engine()
    tiny_t = engine.generate(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 4, "temperature": 1e-40})
    assert tiny_t["output_ids"] == engine.generate(input_ids=[5, 6, 7], sampling_params=greedy(4))["output_ids"]


def test_a_shut_down_engine_answers_with_a_typed_error(tiny_engine):
    engine = tiny_engine()
    engine.shutdown()
    for call in (engine.get_stats, engine.flush_cache, lambda: engine.abort("x")):
        with pytest.raises(EngineError, match="shut down"):
            call()
