"""Rank 0's KV journal, replayed on another rank's memory, leaves it slot-for-slot identical:
request-table writes, copy-on-write page copies, host-tier saves and loads, in order."""

import random

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.attention.forward_batch import ForwardBatch, ForwardMode
from radixkv.mem.kv_memory import KVMemory
from radixkv.mem.kv_pool import KVLayout
from radixkv.tp.journal import KVJournal, replay
from radixkv.tp.messages import TP_CODEC, TPForward, batch_from_message, forward_message

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, page_size=4, dtype=torch.float32)


def memories(host: bool):
    size = 64 if host else None
    a = KVMemory(LAYOUT, 16, max_reqs=4, max_context_len=64, host_kv_size=size)
    b = KVMemory(LAYOUT, 16, max_reqs=4, max_context_len=64, host_kv_size=size)
    return a, b


def fill_random(memory: KVMemory, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for t in memory.host.storage if memory.host is not None else ():
        t.zero_()  # (a real host page is only loaded after it was saved)
    slots = torch.arange(memory.pool.num_slots)
    for layer in range(LAYOUT.num_layers):
        k = torch.randn(len(slots), LAYOUT.num_kv_heads, LAYOUT.head_dim, generator=g)
        memory.pool.store(layer, slots, k, -k)


def same_state(a: KVMemory, b: KVMemory) -> bool:
    pages = torch.arange(a.allocator.num_pages + 1)
    return (torch.equal(a.req_table.table, b.req_table.table)
            and all(torch.equal(x, y) for x, y in zip(a.pool.read_pages(pages), b.pool.read_pages(pages)))
            and all(torch.equal(x, y) for x, y in zip(a.host.storage, b.host.storage)))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["write", "cow", "save", "load"]), st.integers(0, 10**6)),
                min_size=1, max_size=25))
def test_replaying_the_journal_reproduces_rank_0s_memory(ops):
    a, b = memories(host=True)
    fill_random(a, 1)
    fill_random(b, 1)  # both ranks start from the same KV (as after the same forwards)
    journal = KVJournal()
    a.attach_journal(journal)
    for op, seed in ops:
        r = random.Random(seed)
        if op == "write":
            row, start = r.randrange(4), r.randrange(60)
            a.req_table.write(row, start, [r.randrange(64) for _ in range(r.randrange(1, 64 - start))])
        elif op == "cow":  # a shared partial page, extended: copy-on-write
            seq = a.new_sequence()
            seq.extend(2)
            fork = seq.fork()
            fork.extend(1)
            fork.release()
            seq.release()
        elif op == "save":
            a.host.save([r.randrange(1, 17)], [r.randrange(1, 17)])
        else:
            a.host.load([r.randrange(1, 17)], [r.randrange(1, 17)])
    table_writes, page_ops = journal.drain()
    msg = TP_CODEC.decode(TP_CODEC.encode(TPForward(table_writes, page_ops, "decode", [], 1, 1)))
    replay(b, msg.table_writes, msg.page_ops)
    assert same_state(a, b)
    assert journal.drain() == ([], [])


def test_a_forward_batch_crosses_the_wire_unchanged():
    fb = ForwardBatch.build(ForwardMode.EXTEND, [[5, 6, 7], [8]], [2, 0], [4, 9], list(range(10, 14)))
    msg = TP_CODEC.decode(TP_CODEC.encode(forward_message(fb, [], [])))
    back = batch_from_message(msg, torch.device("cpu"))
    for name in ("input_ids", "positions", "req_pool_indices", "seq_lens", "prefix_lens", "extend_start_loc",
                 "out_cache_loc", "logits_index"):
        assert torch.equal(getattr(back, name), getattr(fb, name)), name
        assert getattr(back, name).dtype == getattr(fb, name).dtype
    assert (back.mode, back.max_extend_len, back.max_seq_len) == (fb.mode, fb.max_extend_len, fb.max_seq_len)


def test_copy_on_write_and_host_copies_are_journaled_in_order():
    a, _ = memories(host=True)
    journal = KVJournal()
    a.attach_journal(journal)
    seq = a.new_sequence()
    seq.extend(2)
    fork = seq.fork()
    fork.extend(1)  # the shared partial page is copied before the fork writes into it
    a.host.save([3], [5])
    a.host.load([5], [7])
    _, page_ops = journal.drain()
    assert [op for op, _, _ in page_ops] == ["copy", "save", "load"]
    assert page_ops[0][1] == [seq.pages[-1]] and page_ops[0][2] == [fork.pages[-1]]
