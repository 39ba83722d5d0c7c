"""Mixed batches: decode tokens ride in the same forward as prefill chunks."""

from radixkv.sampling_params import SamplingParams
from radixkv.sched import Req
from tests.sched.conftest import assert_idle_and_clean, greedy


def test_decoding_request_gains_a_token_every_step_of_a_long_chunked_prefill(tiny_scheduler):
    sched = tiny_scheduler(chunked_prefill_size=8, max_prefill_tokens=8)
    short = Req("short", [5, 6, 7], SamplingParams(max_new_tokens=30, temperature=0))
    sched.add_request(short)
    while not short.output_ids:
        sched.step()
    long = Req("long", list(range(40, 100)), SamplingParams(max_new_tokens=2, temperature=0))
    sched.add_request(long)
    steps = 0
    while long.is_prefilling or long.status.value == "waiting":
        before = len(short.output_ids)
        sched.step()
        steps += 1
        assert len(short.output_ids) == before + 1  # never stalls behind the 60-token prompt
    assert steps >= 60 // 8
    stats = sched.get_stats()
    assert stats["mixed_steps"] >= steps - 1 and stats["prefill_tokens"] >= 63
    while sched.has_work:
        sched.step()
    assert_idle_and_clean(sched)


def test_prompt_slightly_over_the_chunk_size_finishes_its_tail_in_the_next_mixed_step(tiny_engine):
    engine = tiny_engine(chunked_prefill_size=16)
    outs = engine.generate(input_ids=[list(range(10, 14)), list(range(20, 38))],
                           sampling_params=greedy(6))  # 18 tokens: a chunk of 16, then 2
    stats = engine.get_stats()
    assert stats["extend_steps"] == 2 and stats["mixed_steps"] == 1
    alone = [engine.generate(input_ids=p, sampling_params=greedy(6))["output_ids"]
             for p in (list(range(10, 14)), list(range(20, 38)))]
    assert [o["output_ids"] for o in outs] == alone
    assert_idle_and_clean(engine)
