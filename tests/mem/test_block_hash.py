"""One block hash (`radixkv.mem.block_hash`): the storage tier's keys, the KV events' ids, a
recorded trace's ids and the planner's are the same names for the same blocks."""

import json

from hypothesis import given
from hypothesis import strategies as st

from radixkv.mem import PageAllocator, RadixCache
from radixkv.mem.block_hash import block, block_id, block_ids, chain, root
from radixkv.mem.cache_events import CacheEventLog, PagesStored
from radixkv.mem.disk_storage import SUFFIX
from radixkv.mem.tree_hashes import node_hashes
from radixkv.sampling_params import SamplingParams
from radixkv.sched import Req
from radixkv.workloads.trace import TraceRequest, rehash
from tests.mem.conftest import cache_tokens
from tests.mem.test_storage_tier import IDENTITY, disk_cache, push_to_storage
from tests.sched.conftest import tiny_scheduler  # noqa: F401 (a fixture)

tokens = st.lists(st.integers(0, 2**31), max_size=40)


@given(tokens, st.integers(1, 8), st.sampled_from([None, "salt", 7, ("t", 1)]))
def test_a_block_hash_is_its_parent_chained_with_its_tokens(ids, size, namespace):
    hashes = list(chain(root(namespace), ids, size, partial=True))
    prev = root(namespace)
    for i, h in enumerate(hashes):
        assert h == block(prev, ids[i * size:(i + 1) * size]) and len(h) == 16
        prev = h
    assert block_ids(namespace, ids, size, partial=True) == [block_id(h) for h in hashes]
    assert all(0 <= i < 2**63 for i in block_ids(namespace, ids, size, partial=True))
    assert list(chain(root(namespace), ids, size)) == hashes[:len(ids) // size]  # whole blocks only


@given(tokens.filter(bool), st.integers(1, 4))
def test_a_hash_names_its_whole_prefix_and_its_namespace(ids, size):
    other = [ids[0] + 1] + ids[1:]
    assert list(chain(root(None), other, size, partial=True))[-1] != list(chain(root(None), ids, size, partial=True))[-1]
    assert list(chain(root("a"), ids, size, partial=True))[-1] != list(chain(root(None), ids, size, partial=True))[-1]


def test_the_event_announces_the_block_the_store_holds_and_the_trace_records(tmp_path, tiny_scheduler):
    prompt, size = list(range(40, 56)), 2
    # the store: keys of the pages written to disk
    cache, pool = disk_cache(tmp_path / "store")
    push_to_storage(cache, pool, prompt[:8])
    stored = set(cache.storage._index)
    cache.storage.close()
    assert set(chain(root(None), prompt[:8], size)) <= stored
    # the events: ids of the pages the tree announces
    events = RadixCache(PageAllocator(32, size))
    events.events = CacheEventLog(size)
    cache_tokens(events, prompt)
    (announced,) = [e for e in events.events.take() if isinstance(e, PagesStored)]
    assert announced.hashes == [block_id(h) for h in chain(root(None), prompt, size)]
    assert announced.hashes[:4] == [block_id(k) for k in chain(root(None), prompt[:8], size)]
    leaf = events.tree.walk(tuple(prompt), None)
    assert [block_id(h) for h in node_hashes(next(iter(leaf))[0], size)] == announced.hashes
    # the recorded trace, at the same block size
    path = tmp_path / "trace.jsonl"
    sched = tiny_scheduler(record_trace=str(path), record_trace_block_size=size, compile="off")
    sched.add_request(Req("r", prompt, SamplingParams(max_new_tokens=1, temperature=0)))
    while sched.has_work:
        sched.step()
    sched.close()
    (line,) = [json.loads(x) for x in path.read_text().splitlines()]
    assert line["hash_ids"] == announced.hashes
    # the planner's rehash of the prompt's tokens
    (planned,) = rehash([TraceRequest(0, len(prompt), 1, (0,), input_ids=tuple(prompt))], size)
    assert list(planned.hash_ids) == announced.hashes


def test_two_identities_share_a_directory_and_first_format_files_are_deleted(tmp_path):
    key = list(range(8))
    ours, pool = disk_cache(tmp_path)
    push_to_storage(ours, pool, key)
    ours.storage.close()
    theirs, pool2 = disk_cache(tmp_path, identity=b"another-model-00")
    push_to_storage(theirs, pool2, key)  # the same tokens: the same keys, in files of their own
    theirs.storage.close()
    names = sorted(p.name for p in tmp_path.glob(f"*{SUFFIX}"))
    assert {n.split("-")[0] for n in names} == {IDENTITY.hex(), b"another-model-00".hex()}
    old = tmp_path / f"{'ab' * 16}{SUFFIX}"
    old.write_bytes(b"RKVP1\n\x02\x00\x00\x00{}")  # the first format: keyed by another hash
    again, _ = disk_cache(tmp_path)
    assert not old.exists() and again.storage.counters["corrupt_files"] == 0
    assert again.storage.foreign_files == sum(n.startswith(b"another-model-00".hex()) for n in names)
    assert set(chain(root(None), key, 2)) <= set(again.storage._index)
    assert sorted(p.name for p in tmp_path.glob(f"*{SUFFIX}")) == names
    again.storage.close()
