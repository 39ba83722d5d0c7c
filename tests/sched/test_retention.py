"""Retention hints from the request down: the scheduler caps them (--max-cache-retention), the
request's KV retains what it caches (each prefill chunk, then the whole sequence), admission
evicts unretained prefixes first and is never blocked by a hint."""

import pytest
import torch

from radixkv.config import EngineConfig
from radixkv.errors import ConfigError
from radixkv.mem import KVLayout, KVMemory, RadixCache
from radixkv.retention import WHOLE, Retention
from radixkv.sampling_params import SamplingParams
from radixkv.sched.kv import RequestKV
from radixkv.sched.request import Req
from tests.mem.conftest import FakeClock


def request_kv(num_pages=16):
    memory = KVMemory(KVLayout(1, 1, 2, 1, torch.float32), num_pages, max_reqs=4, max_context_len=64)
    return RequestKV(memory, RadixCache(memory.allocator, "lru", clock=FakeClock()), retract_decode_steps=1)


def run_prompt(kv, prompt, retention=None):
    """Admit `prompt` whole, then finish it (its prompt goes into the tree); whether it fit."""
    req = Req(f"r{prompt[0]}", prompt, SamplingParams(max_new_tokens=1), retention=retention)
    if kv.admit(req, None, chunk=64, headroom_pages=0) is None:
        return False
    kv.release(req)
    return True


@pytest.mark.parametrize("value", [-1, float("inf"), "1h", True])
def test_the_config_refuses_a_bad_max_cache_retention_naming_the_flag(value):
    with pytest.raises(ConfigError, match="max_cache_retention.*--max-cache-retention"):
        EngineConfig.from_kwargs(max_cache_retention=value)


def test_admission_evicts_an_unretained_prefix_before_a_retained_older_one():
    kv = request_kv(num_pages=18)
    kept, other = list(range(1, 9)), list(range(20, 28))
    assert run_prompt(kv, kept, Retention.whole(60))
    assert run_prompt(kv, other)  # 2 pages are left free
    assert run_prompt(kv, list(range(40, 49)))  # 9 tokens + 1 of decode headroom: 8 cached tokens must go
    assert (kv.cache.peek(kept).num_tokens, kv.cache.peek(other).num_tokens) == (8, 0)
    assert kv.stats()["retained_tokens"] == 8
    kv.check([], [], idle=True)


def test_a_pool_full_of_retained_prefixes_still_admits():
    kv = request_kv(num_pages=18)
    assert run_prompt(kv, list(range(1, 9)), Retention.whole(60))
    assert run_prompt(kv, list(range(20, 28)), Retention.whole(60))
    assert kv.cache.evictable_tokens == 16  # a hint never makes a prefix unevictable
    assert run_prompt(kv, list(range(40, 57)))  # needs all but one of the 18 pages
    kv.check([], [], idle=True)


def test_each_prefill_chunk_is_retained_as_it_is_cached():
    kv = request_kv()
    req = Req("r", list(range(1, 11)), SamplingParams(max_new_tokens=1), retention=Retention(((6, 60.0),)))
    kv.admit(req, None, chunk=4, headroom_pages=0)
    kv.cache_chunk(req)  # after the first chunk's forward
    assert kv.cache.retained_tokens == 4
    kv.grow(req, 6)
    kv.release(req)
    assert kv.cache.retained_tokens == 6  # the span ends at 6: the rest of the prompt is cached, not retained
    assert kv.cache.total_tokens == 10
    kv.check([], [], idle=True)


def test_the_scheduler_caps_hints_and_reports_retained_tokens(tiny_scheduler):
    sched = tiny_scheduler(max_cache_retention=30, compile="off")
    req = Req("a", list(range(5, 25)), SamplingParams(max_new_tokens=3), retention=Retention.whole(3600))
    sched.add_request(req)
    assert req.retention == Retention(((WHOLE, 30.0),))
    while sched.has_work:
        sched.step()
    stats = sched.get_stats()
    assert stats["max_cache_retention"] == 30
    assert stats["retained_tokens"] == stats["cached_tokens_in_tree"] > 0
    unhinted = Req("b", list(range(50, 60)), SamplingParams(max_new_tokens=1), retention=Retention.whole(0))
    sched.add_request(unhinted)
    assert unhinted.retention is None  # nothing left to retain: the request pays nothing for it
    sched.abort("b")
    sched.check_invariants()
