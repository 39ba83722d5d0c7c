"""The scheduler decides without a model: `schedule()` says which requests run, how many tokens
each and at which KV slots; `update()` takes a hand-made `ModelOutput` back. Everything here
runs over a real page allocator, request table and radix cache of a few pages, with no runner,
sampler or tensor of logits."""

import torch

from radixkv.config import EngineConfig
from radixkv.errors import ErrorKind
from radixkv.mem import KVLayout, KVMemory, make_prefix_cache
from radixkv.sampling_params import SamplingParams
from radixkv.sched.records import ModelOutput, Sample, ScheduleOutput
from radixkv.sched.request import Req, ReqStatus
from radixkv.sched.scheduler import Scheduler
from radixkv.validation import RequestLimits

EOS = 2


def make_scheduler(num_pages=64, page_size=1, proposer=None, **options) -> Scheduler:
    """A scheduler over a KV pool of `num_pages` pages (the allocator keeps one back)."""
    config = EngineConfig.from_kwargs(model="unused", page_size=page_size, **options)
    memory = KVMemory(KVLayout(1, 1, 2, page_size), num_pages, max_reqs=8, max_context_len=128)
    cache = make_prefix_cache(memory.allocator, config.cache.eviction_policy)
    limits = RequestLimits(vocab_size=1000, context_length=128, pool_tokens=memory.allocator.total_tokens,
                           page_size=page_size, has_tokenizer=False)
    return Scheduler(config, memory, cache, limits, eos_ids=frozenset({EOS}), proposer=proposer)


def request(rid, prompt, max_new_tokens=4, **params) -> Req:
    return Req(rid, list(prompt), SamplingParams(max_new_tokens=max_new_tokens, **params))


def next_token(req: Req) -> int:
    """What the fake model samples: a token that depends only on how far the request is."""
    return 500 + len(req.output_ids)


def fake_forward(out: ScheduleOutput, sample=next_token) -> ModelOutput:
    """The model's answer to `out`: a token for every row that ends its pending tokens."""
    return ModelOutput([Sample([sample(row.req)]) if row.samples else None for row in out.rows],
                       [None] * len(out.rows))


def step(sched: Scheduler, sample=next_token):
    out = sched.schedule()
    return out, sched.update(out, fake_forward(out, sample)) if out.rows else out.finished


def run_to_idle(sched: Scheduler, max_steps=200) -> dict:
    finals = {}
    for _ in range(max_steps):
        if not sched.has_work:
            return finals
        for output in step(sched)[1]:
            if output.finished:
                finals[output.rid] = output
    raise AssertionError("the scheduler did not go idle")


def assert_idle_and_clean(sched: Scheduler) -> None:
    sched.check_invariants()  # idle: free + cached == total, no lock left
    a = sched.memory.allocator
    assert a.free_tokens + sched.cache.evictable_tokens == a.total_tokens
    assert sched.cache.protected_tokens == 0 and not sched.reqs


def test_admission_counts_the_cached_prefix_and_reserves_pages_for_the_rest():
    sched = make_scheduler()
    prompt = list(range(10, 26))  # 16 tokens
    sched.add_request(request("a", prompt, max_new_tokens=2))
    run_to_idle(sched)
    free_before = sched.memory.allocator.free_tokens + sched.cache.evictable_tokens

    sched.add_request(request("b", prompt + [40, 41]))
    out = sched.schedule()
    (row,) = out.rows
    req = sched.reqs["b"]
    assert out.num_decode == 0 and req.status is ReqStatus.RUNNING
    assert req.cached_tokens == 16 and sched.stats.cached_prompt_tokens == 16  # a's prompt is a hit
    assert (row.start, row.tokens) == (16, [40, 41]) and len(row.slots) == 2  # only the new tokens run
    assert req.seq.pages[:16] == sched.cache.peek(prompt).pages  # the cached pages, shared
    assert sched.memory.allocator.free_tokens + sched.cache.evictable_tokens < free_before  # pages reserved
    sched.check_invariants()


def test_a_long_prompt_is_prefilled_in_chunks_of_the_token_budget():
    sched = make_scheduler(chunked_prefill_size=8, max_prefill_tokens=8)
    prompt = list(range(100, 120))  # 20 tokens: chunks of 8, 8, 4
    sched.add_request(request("long", prompt, max_new_tokens=3))
    chunks = []
    for _ in range(3):
        out = sched.schedule()
        (row,) = out.rows
        chunks.append((row.start, len(row.tokens), row.samples))
        outputs = sched.update(out, fake_forward(out))
        # each computed chunk goes into the tree at once, for later requests to share
        assert sched.cache.peek(prompt).num_tokens == row.start + len(row.tokens)
    assert chunks == [(0, 8, False), (8, 8, False), (16, 4, True)]
    assert [o.new_ids for o in outputs] == [[500]]  # the first token comes with the last chunk
    finals = run_to_idle(sched)
    assert finals["long"].completion_tokens == 3
    assert_idle_and_clean(sched)


def test_decode_retracts_the_latest_arrival_when_memory_runs_out_and_both_finish():
    # 24 usable tokens; each request needs 8 + 10 = 18: both fit alone, not together
    sched = make_scheduler(num_pages=25, retract_decode_steps=1)
    sched.add_request(request("first", range(10, 18), max_new_tokens=10))
    sched.add_request(request("second", range(30, 38), max_new_tokens=10))
    step(sched)
    assert [r.rid for r in sched.running] == ["first", "second"]
    while not sched.stats.retractions:
        step(sched)
        sched.check_invariants()
    second = sched.reqs["second"]
    assert second.status is ReqStatus.WAITING and sched.waiting[0] is second and second.retractions == 1
    assert [r.rid for r in sched.running] == ["first"] and second.seq is None  # its pages went back
    finals = run_to_idle(sched)
    assert {rid: o.finish_reason["type"] for rid, o in finals.items()} == {"first": "length", "second": "length"}
    assert_idle_and_clean(sched)


def test_a_finished_request_gives_its_pages_back_and_the_tree_keeps_prompt_and_output():
    sched = make_scheduler()
    prompt = list(range(10, 20))
    sched.add_request(request("r", prompt, max_new_tokens=4))
    finals = run_to_idle(sched)
    out = finals["r"]
    assert out.finished and out.finish_reason == {"type": "length", "length": 4}
    assert out.completion_tokens == 4 and out.error is None
    computed = prompt + [500, 501, 502]  # the last output token was sampled, never run
    assert sched.cache.peek(computed).num_tokens == len(computed)
    assert_idle_and_clean(sched)


def test_a_sampled_stop_token_finishes_the_request():
    sched = make_scheduler()
    sched.add_request(request("r", range(10, 20), max_new_tokens=8))
    step(sched)  # prefill: first token 500
    out, outputs = step(sched, sample=lambda req: EOS)
    assert outputs[0].finished and outputs[0].finish_reason == {"type": "stop", "matched": EOS}
    assert_idle_and_clean(sched)


def test_abort_of_a_waiting_and_a_running_request_returns_everything():
    sched = make_scheduler(max_running_requests=1)
    sched.add_request(request("running", range(10, 20), max_new_tokens=8))
    sched.add_request(request("waiting", range(30, 40), max_new_tokens=8))
    step(sched)
    assert [r.rid for r in sched.running] == ["running"] and [r.rid for r in sched.waiting] == ["waiting"]
    for rid in ("waiting", "running"):
        out = sched.abort(rid)
        assert out.finished and out.finish_reason["type"] == "abort" and out.error is None
    assert sched.abort("running") is None  # already finished
    assert not sched.has_work
    assert_idle_and_clean(sched)


def test_a_failed_forward_rolls_its_batch_back_and_ends_its_requests_with_an_error():
    sched = make_scheduler()
    sched.add_request(request("r", range(10, 20), max_new_tokens=4))
    out = sched.schedule()
    outputs = sched.update(out, ModelOutput(error="the model forward failed: boom"))
    assert [(o.rid, o.error, o.error_kind) for o in outputs] == [
        ("r", "the model forward failed: boom", ErrorKind.INTERNAL.value)]
    assert sched.cache.peek(list(range(10, 20))).num_tokens == 0  # nothing uncomputed was cached
    assert_idle_and_clean(sched)


class CountingProposer:
    """Drafts 600, 601, ... after whatever the request has."""

    def propose(self, req, k):
        return [600 + i for i in range(k)]


def test_drafts_the_model_rejects_leave_the_kv_and_the_kept_ones_join_the_output():
    sched = make_scheduler(proposer=CountingProposer())
    sched.add_request(request("r", range(10, 20), max_new_tokens=8))
    step(sched)  # prefill: first token 500
    out = sched.schedule()
    (row,) = out.rows
    req = row.req
    assert row.draft and row.tokens == [500] + row.draft and len(row.slots) == 1 + len(row.draft)
    # the target agrees with the first draft only, then picks its own token
    sched.update(out, ModelOutput([Sample([row.draft[0], 777])], [None]))
    assert req.output_ids == [500, 600, 777]
    assert req.kv_len == req.seq_len - 1  # the rejected drafts' slots are gone, the kept one stays
    assert (req.spec_verify_ct, req.spec_accepted_tokens) == (1, 1)
    sched.check_invariants()
    run_to_idle(sched)
    assert_idle_and_clean(sched)


def test_the_scheduler_holds_no_model():
    sched = make_scheduler()
    assert not any(isinstance(v, torch.nn.Module) for v in vars(sched).values())
    assert not hasattr(sched, "runner")
