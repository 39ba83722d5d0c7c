"""Admission acting on the scheduling policy's peek, made earlier in the same step: the tree may
have changed since (an earlier admission evicted, a prefix moved to the host tier), and the
request must still get the current match, its host part loaded back, and nothing left locked."""

import torch

from radixkv.mem import KVLayout, KVMemory, RadixCache
from radixkv.sampling_params import SamplingParams
from radixkv.sched.kv import RequestKV
from radixkv.sched.request import Req


def memory_and_cache(device_pages=16, host_pages=8):
    memory = KVMemory(KVLayout(1, 1, 2, 1, torch.float32), device_pages, max_reqs=4, max_context_len=64,
                      host_kv_size=str(host_pages))
    return memory, RadixCache(memory.allocator, "lru", host_tier=memory.host)


def cached(memory, cache, key):
    pages = memory.allocator.alloc(len(key))
    cache.insert(key, pages)
    memory.allocator.decref(pages)


def test_a_peek_gone_stale_under_eviction_is_matched_again_and_its_host_part_loaded():
    """Found in review: admission decided on load-back from the stale peek (no host part), then
    the settled match had one that nothing loaded or pinned; reserving pages dropped it from the
    host tier and recording the hit raised KeyError."""
    memory, cache = memory_and_cache()
    a, b = list(range(1, 9)), list(range(20, 28))
    cached(memory, cache, a)
    cached(memory, cache, b)
    req = Req("r", a + [99], SamplingParams(max_new_tokens=2))
    peeked = RequestKV(memory, cache, 2).peek(req)
    assert (peeked.num_tokens, peeked.host_tokens) == (8, 0)
    cache.evict(8)  # an earlier admission of this step: a (the least recently used) goes to the host tier
    kv = RequestKV(memory, cache, 2)
    done = kv.admit(req, peeked, chunk=64, headroom_pages=0)
    assert done is not None and done.cached_tokens == 8 and done.host_tokens == 8  # loaded back, counted once
    assert req.seq.pages[:8] == cache.peek(a).pages
    kv.release(req)
    kv.check([], [], idle=True)


def test_a_host_part_that_does_not_fit_back_is_left_and_recomputed():
    memory, cache = memory_and_cache(device_pages=10, host_pages=8)
    a = list(range(1, 9))
    cached(memory, cache, a)
    cache.evict(8)
    kv = RequestKV(memory, cache, 2)
    blocker = Req("big", list(range(40, 48)), SamplingParams(max_new_tokens=1))
    assert kv.admit(blocker, None, chunk=64, headroom_pages=0) is not None  # holds 8 of the 10 pages
    req = Req("r", a + [99], SamplingParams(max_new_tokens=1))
    assert kv.admit(req, None, chunk=64, headroom_pages=0) is None  # cannot fit: nothing changes
    kv.check([blocker], [req], idle=False)
    kv.release(blocker)
    done = kv.admit(req, None, chunk=64, headroom_pages=0)
    assert done is not None and done.cached_tokens == done.host_tokens == 8
    kv.release(req)
    kv.check([], [], idle=True)
