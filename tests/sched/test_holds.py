"""Return holds (`radixkv.sched.holds`): a finished request's cached sequence is kept from new
admissions a moment for its next turn. Unit tests over a real radix cache with a hand-moved
clock, then the scheduler deciding over a real pool (no model: `test_scheduler_decides`)."""

import pytest

from radixkv.mem import PageAllocator, make_prefix_cache
from radixkv.sched import holds as H
from radixkv.sched.holds import ReturnHolds
from tests.sched.test_scheduler_decides import assert_idle_and_clean, make_scheduler, request, run_to_idle, step


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def cache_with(*seqs, pages=64):
    """A page-1 radix cache holding each of `seqs` (unlocked), and the node each ends on."""
    alloc = PageAllocator(pages, 1)
    cache = make_prefix_cache(alloc, "lru")
    nodes = []
    for seq in seqs:
        got = alloc.alloc(len(seq))
        cache.insert_path(seq, got)
        alloc.decref(got)  # the tree's reference is the only one
        nodes.append(cache.settle(cache.peek(seq)).last_node)
    return cache, nodes


def holds_over(cache, seconds=1.0):
    clock = Clock()
    return ReturnHolds(cache, seconds, clock), clock


def test_a_held_sequence_cannot_be_evicted_and_a_continuation_claims_it():
    a, b = list(range(100, 120)), list(range(200, 210))
    cache, (na, nb) = cache_with(a, b)
    holds, clock = holds_over(cache)
    assert holds.hold(na)
    assert cache.evictable_tokens == len(b)
    cache.evict(30)
    assert cache.peek(a).num_tokens == 20 and cache.peek(b).num_tokens == 0  # only b went
    clock.now = 0.2
    nxt = cache.settle(cache.peek(a + [7, 8]))  # the next turn: a + its new message
    cache.lock(nxt.last_node)  # admitted: its own lock
    holds.claim(holds.claims(nxt.last_node))
    assert len(holds) == 0 and holds.stats.claimed == 1
    assert holds.idle_grace == pytest.approx(0.4)  # twice the return time seen
    cache.unlock(nxt.last_node)
    assert cache.evictable_tokens == 20


def test_a_match_covering_half_the_held_path_claims_it_and_less_does_not():
    a = list(range(100, 140))  # 40 tokens
    cache, (na,) = cache_with(a)
    holds, _ = holds_over(cache)
    holds.hold(na)
    short = cache.settle(cache.peek(a[:19])).last_node  # a retokenized answer may match less
    assert not holds.claims(short)
    holds.claim(holds.claims(short))
    assert len(holds) == 1
    half = cache.settle(cache.peek(a[:20])).last_node
    assert holds.claims(half)
    holds.claim(holds.claims(half))
    assert len(holds) == 0 and holds.stats.claimed == 1


def test_another_sequence_never_claims_a_hold():
    a, b = list(range(100, 120)), [100, 101] + list(range(300, 318))  # b shares 2 tokens with a
    cache, (na, nb) = cache_with(a, b)
    holds, _ = holds_over(cache)
    holds.hold(na)
    assert not holds.claims(nb) and not holds.claims(cache.root)
    holds.claim(holds.claims(nb))
    assert len(holds) == 1


def test_holds_expire_and_unreturned_holds_turn_holding_off_except_probes():
    seqs = [list(range(100 * i, 100 * i + 10)) for i in range(1, 120)]
    cache, nodes = cache_with(*seqs, pages=1300)
    holds, clock = holds_over(cache, seconds=1.0)
    for i in range(H.WARMUP):
        assert holds.hold(nodes[i])
        clock.now += 1.0
        holds.expire()
    assert holds.stats.expired == H.WARMUP and not holds.paying
    held = [holds.hold(n) for n in nodes[H.WARMUP: H.WARMUP + 2 * H.PROBE_EVERY]]
    assert sum(held) == 2 and holds.stats.skipped == 2 * H.PROBE_EVERY - 2  # one probe in PROBE_EVERY
    for node in holds.held_nodes():  # the probes come back
        holds.claim(holds.claims(node))
    rest = iter(nodes[H.WARMUP + 2 * H.PROBE_EVERY:])
    probes = 0
    while not holds.paying:  # every probe returns: holding resumes once half the outcomes are claims
        node = next(rest)
        if holds.hold(node):
            probes += 1
            holds.claim(holds.claims(node))
    assert probes + 2 == H.WARMUP  # claims now equal the expiries
    assert all(holds.hold(n) for n in list(rest)[:5])
    assert cache.evictable_tokens + cache.protected_tokens == cache.total_tokens


def test_yielding_ends_the_oldest_holds_until_enough_is_evictable():
    seqs = [list(range(100 * i, 100 * i + 10)) for i in range(1, 5)]
    cache, nodes = cache_with(*seqs)
    holds, clock = holds_over(cache)
    for n in nodes:
        holds.hold(n)
        clock.now += 0.1
    assert cache.evictable_tokens == 0
    holds.yield_for(15)
    assert len(holds) == 2 and holds.held_nodes() == nodes[2:] and holds.stats.yielded == 2
    assert holds.paying  # a yield says nothing about whether the sequence would have returned


def test_an_idle_pool_ends_only_the_holds_past_their_grace():
    seqs = [list(range(100 * i, 100 * i + 10)) for i in range(1, 3)]
    cache, nodes = cache_with(*seqs)
    holds, clock = holds_over(cache, seconds=5.0)
    holds.hold(nodes[0])
    clock.now = H.IDLE_GRACE
    holds.hold(nodes[1])
    holds.end_idle()
    assert holds.held_nodes() == [nodes[1]]


# -- the scheduler --------------------------------------------------------------------------------
def finish(sched, rid, max_steps=50):
    for _ in range(max_steps):
        out, outputs = step(sched)
        if any(o.rid == rid and o.finished for o in outputs):
            return out
    raise AssertionError(f"{rid} did not finish")


def conversation_then_cold_request(hold_seconds):
    """A 45-token pool: conversation a (20 prompt + 4 answer tokens) finishes while r runs; cold
    request c (16 tokens) then arrives, and fits only by evicting a's sequence; then a's next
    turn arrives."""
    sched = make_scheduler(num_pages=45, schedule_policy="lpm", hold_finished_seconds=hold_seconds,
                           retract_decode_steps=1)
    clock = Clock()
    if sched.kv.holds is not None:
        sched.kv.holds.clock = clock
    a = list(range(100, 120))
    sched.add_request(request("r", list(range(300, 302)), max_new_tokens=12))  # keeps the pool busy
    sched.add_request(request("a", a, max_new_tokens=5))
    finish(sched, "a")
    answer = [500, 501, 502, 503]  # what next_token sampled for a's 4 KV'd output tokens
    sched.add_request(request("c", list(range(400, 416)), max_new_tokens=2))
    step(sched)
    admitted_c = sched.reqs["c"] in sched.running
    sched.add_request(request("a2", a + answer + [504, 7, 8], max_new_tokens=2))
    step(sched)
    a2 = sched.reqs["a2"]
    return sched, admitted_c, a2


def test_a_held_conversation_keeps_its_pages_from_a_cold_request_and_its_next_turn_hits():
    sched, admitted_c, a2 = conversation_then_cold_request(hold_seconds=1.0)
    assert not admitted_c  # it waits rather than evict the conversation
    assert a2.status.name == "RUNNING" and a2.cached_tokens == 24  # prompt + answer, all cached
    assert sched.kv.holds.stats.claimed == 1
    for _ in range(60):
        if not sched.has_work:
            break
        step(sched)
        sched.check_invariants()
    assert not sched.has_work and len(sched.kv.holds) == 0  # c ran once there was room
    assert_idle_and_clean(sched)


def test_without_holds_the_cold_request_evicts_the_conversation():
    sched, admitted_c, a2 = conversation_then_cold_request(hold_seconds=0)
    assert sched.kv.holds is None
    assert admitted_c
    run_to_idle(sched)
    assert not sched.has_work and a2.cached_tokens < 24  # c evicted part of a's sequence


def queue_behind_two_holds():
    """A 40-token pool where x and y finished and are held, nothing runs, and z waits for room
    beside the holds; with the holds' hand-moved clock."""
    sched = make_scheduler(num_pages=40, schedule_policy="lpm", hold_finished_seconds=10.0,
                           retract_decode_steps=1)
    clock = Clock()
    sched.kv.holds.clock = clock
    sched.add_request(request("x", list(range(600, 610)), max_new_tokens=12))
    sched.add_request(request("y", list(range(700, 716)), max_new_tokens=2))
    finish(sched, "y")  # held; x runs on
    sched.add_request(request("z", list(range(800, 815)), max_new_tokens=2))  # no room beside the holds
    finish(sched, "x")  # held too: nothing runs, z waits behind two holds
    return sched, clock


def test_an_idle_pool_admits_the_queue_once_the_holds_grace_is_over():
    sched, clock = queue_behind_two_holds()
    assert len(sched.kv.holds) == 2 and sched.reqs["z"] not in sched.running
    out, _ = step(sched)
    assert not out.rows and "z" in sched.reqs  # within the grace it waits, and is not aborted
    clock.now += sched.kv.holds.idle_grace + 0.01
    finish(sched, "z")
    assert sched.kv.holds.stats.yielded >= 1
    assert_idle_and_clean(sched)


def test_a_running_request_growth_ends_holds_before_any_retraction():
    sched = make_scheduler(num_pages=33, schedule_policy="lpm", hold_finished_seconds=10.0,
                           retract_decode_steps=1)
    sched.kv.holds.clock = Clock()
    sched.add_request(request("long", list(range(300, 304)), max_new_tokens=24))
    sched.add_request(request("a", list(range(100, 120)), max_new_tokens=3))
    finish(sched, "a")
    assert len(sched.kv.holds) == 1
    while len(sched.kv.holds):  # long needs the held pages to decode on
        step(sched)
    assert sched.reqs["long"] in sched.running and sched.kv.holds.stats.yielded == 1
    finish(sched, "long", max_steps=40)
    assert sched.stats.retractions == 0
    assert_idle_and_clean(sched)


def test_a_request_is_passed_over_only_when_another_is_admitted_ahead_of_it():
    sched = make_scheduler(num_pages=24, schedule_policy="lpm", hold_finished_seconds=0, retract_decode_steps=1)
    sched.add_request(request("big", list(range(100, 116)), max_new_tokens=4))
    step(sched)
    sched.add_request(request("w", list(range(200, 216)), max_new_tokens=2))  # no room while big runs
    for _ in range(3):
        step(sched)
    assert sched.reqs["w"].passed_over == 0  # nobody went ahead of it
    run_to_idle(sched)
    assert_idle_and_clean(sched)


def test_another_tenant_with_the_same_tokens_neither_claims_nor_evicts_a_hold():
    """Tenants' prefixes live under their own namespaces: a second tenant sending the first one's
    conversation (its next turn, token for token) hits nothing, claims nothing, and as a new
    request may not evict the held sequence."""
    sched, admitted_c, a2 = conversation_then_cold_request(hold_seconds=1.0)
    run_to_idle(sched)
    a = list(range(100, 120)) + [500, 501, 502, 503, 504]
    sched.add_request(request("r", list(range(300, 302)), max_new_tokens=12))  # busy pool again
    sched.add_request(request("a3", a + [7, 8], max_new_tokens=5))
    finish(sched, "a3")  # tenant one's turn, held
    claimed = sched.kv.holds.stats.claimed
    intruder = request("b", a + [7, 8, 9], max_new_tokens=2)
    intruder.namespace = "tenant-b"
    sched.add_request(intruder)
    step(sched)
    assert sched.kv.holds.stats.claimed == claimed and len(sched.kv.holds) == 1
    assert (intruder.cached_tokens or 0) == 0


def test_aborting_the_last_queued_request_behind_holds_leaves_no_hold():
    """The queue waits behind holds with nothing running; its one request is aborted: the
    scheduler is idle, so no hold may outlive it (an idle pool has no lock)."""
    sched, _ = queue_behind_two_holds()
    assert len(sched.kv.holds) == 2 and not sched.running
    sched.abort("z")
    assert not sched.has_work and len(sched.kv.holds) == 0
    assert_idle_and_clean(sched)
