"""The storage tier on a real Mooncake Store (a `mooncake_master` on loopback): what one replica
writes another finds, bit for bit, keyed by model identity and namespace; a damaged object is a
miss and goes; the master missing at start, killed and restarted: lookups miss, writes are
skipped, nothing fails, and the store is picked up again."""

import logging
import time

import pytest
import torch

from radixkv.config.store_backend import MooncakeSettings
from radixkv.mem import PageAllocator, RadixCache
from radixkv.mem.cache_factory import block_shapes
from radixkv.mem.host_tier import HostKVTier, HostTierConfig
from radixkv.mem.kv_pool import make_kv_pool
from radixkv.mem.storage_tier import StorageTierConfig
from tests.mem.test_storage_tier import IDENTITY, LAYOUT, compute, load, page_data
from tests.mooncake_helpers import start_master

pytestmark = pytest.mark.timeout(180)


def replica(master_address, identity=IDENTITY, per_block=1, device_pages=8, host_pages=8):
    """One server's cache over a Mooncake tier (write-through: what the mooncake backend defaults to)."""
    from radixkv.mem.mooncake_storage import MooncakeKVStorage

    pool = make_kv_pool(LAYOUT, device_pages)
    host = HostKVTier(HostTierConfig(host_pages, LAYOUT.page_size), pool)
    settings = MooncakeSettings(master_address, global_segment_size=64 << 20, local_buffer_size=32 << 20)
    storage = MooncakeKVStorage(StorageTierConfig(1024, LAYOUT.page_size * per_block, "write-through"), settings,
                                identity, block_shapes(pool, per_block))
    cache = RadixCache(PageAllocator(device_pages, LAYOUT.page_size), "lru", host_tier=host, storage=storage)
    return cache, pool


def until(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def master(tmp_path):
    m = start_master(tmp_path)
    yield m
    m.stop()


def connected(cache):
    until(lambda: cache.storage.available, 30, "the store to connect")
    return cache


@pytest.mark.parametrize("per_block", [1, 2])
def test_what_one_replica_caches_another_loads_bit_for_bit(master, per_block):
    a, pool_a = replica(master.address, per_block=per_block)
    b, pool_b = replica(master.address, per_block=per_block)
    connected(a), connected(b)
    key = list(range(8))
    expected = compute(a, pool_a, key, seed=3)  # cached in A: written through at once
    a.storage.flush()
    assert a.storage.counters["written_pages"] == 8 // (LAYOUT.page_size * per_block)
    assert b.peek(key).storage_tokens == 8  # B never computed it
    loaded = load(b, key)
    assert loaded.num_tokens == 8 and loaded.from_storage == 8
    for got, want in zip(page_data(pool_b, loaded.pages), expected):
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert b.storage.stats()["storage_read_gbs"] is not None
    b.check_invariants(inflight_pages=0)
    for c in (a, b):
        c.storage.close()


class LeaseRunsOut:
    """The real store's client, but a batch get of more than `most` objects fails for all of them,
    as the master answers when its lease ran out before a large batch finished moving (what a
    loaded machine did to a 100 ms lease in CI)."""

    def __init__(self, client, most):
        self.client, self.most, self.failed = client, most, 0

    def batch_get_into(self, names, buffers, sizes):
        if len(names) > self.most:
            self.failed += 1
            return [-1] * len(names)
        return self.client.batch_get_into(names, buffers, sizes)

    def __getattr__(self, name):
        return getattr(self.client, name)


def test_a_batch_whose_lease_ran_out_is_read_again_in_smaller_batches(master):
    a, pool_a = replica(master.address, device_pages=16, host_pages=16)
    b, pool_b = replica(master.address, device_pages=16, host_pages=16)
    connected(a), connected(b)
    key = list(range(32))
    expected = compute(a, pool_a, key, seed=5)
    a.storage.flush()
    b.storage._client = fault = LeaseRunsOut(b.storage._client, most=3)
    loaded = load(b, key)
    assert loaded.num_tokens == 32 and loaded.from_storage == 32  # (the batch halved until it fit)
    assert fault.failed >= 1 and b.storage.counters["read_retries"] == fault.failed
    for got, want in zip(page_data(pool_b, loaded.pages), expected):
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    b.storage._client = fault.client
    for c in (a, b):
        c.storage.close()


def test_other_models_and_namespaces_find_nothing(master):
    a, pool_a = replica(master.address)
    other_model, _ = replica(master.address, identity=b"another-model-01")
    connected(a), connected(other_model)
    key = list(range(8))
    compute(a, pool_a, key, seed=1)
    a.storage.flush()
    assert a.peek(key, "tenant-b").storage_tokens == 0  # the namespace seeds the block hash
    assert other_model.peek(key).storage_tokens == 0  # the identity is in the object's name
    for c in (a, other_model):
        c.storage.close()


def test_a_damaged_object_is_a_miss_and_is_removed(master, caplog):
    a, pool_a = replica(master.address)
    b, pool_b = replica(master.address)
    connected(a), connected(b)
    key = list(range(8))
    compute(a, pool_a, key, seed=5)
    a.storage.flush()
    from radixkv.mem import block_hash

    keys = list(block_hash.chain(block_hash.root(None), key, LAYOUT.page_size))
    name = a.storage._name(keys[1])  # the second page's object
    raw = a.storage._client
    value = bytearray(raw.get(name))
    value[-1] ^= 0xFF  # one bit of its payload
    assert raw.remove(name, True) == 0 and raw.put(name, bytes(value)) == 0
    with caplog.at_level(logging.WARNING):
        loaded = load(b, key)
    assert loaded.from_storage == LAYOUT.page_size  # the first page only: the damaged one is a miss
    assert b.storage.counters["corrupt_files"] == 1 and "failed its check" in caplog.text
    assert raw.is_exist(name) == 0  # removed: no replica reads it again
    b.check_invariants(inflight_pages=0)
    for c in (a, b):
        c.storage.close()


def test_no_master_at_start_then_it_comes_and_goes_and_comes_back(tmp_path, caplog):
    from tests.mooncake_helpers import Master, _free_port

    master = Master(_free_port(), _free_port(), tmp_path / "master.log")  # not started yet
    logging.getLogger("radixkv").setLevel(logging.WARNING)  # (as a server's logging leaves it: failed before)
    caplog.set_level(logging.INFO, logger="radixkv.mem.mooncake_storage")
    a, pool_a = replica(master.address)
    until(lambda: "is unavailable" in caplog.text, 30, "the warning")
    key = list(range(8))
    compute(a, pool_a, key, seed=2)  # serving goes on: the write is skipped, not failed
    assert not a.storage.available and a.storage.counters["skipped_pages"] >= 1
    assert a.peek(key).num_tokens == 8 and a.peek(key).storage_tokens == 0
    master.start()
    try:
        b, _ = replica(master.address)
        connected(a), connected(b)
        other = list(range(50, 58))
        compute(a, pool_a, other, seed=4)
        a.storage.flush()
        assert b.peek(other).storage_tokens == 8
        master.stop()  # gone mid-run
        until(lambda: not a.storage.available, 30, "the loss to be noticed")
        assert b.peek(other).storage_tokens == 0 or not b.storage.available
        compute(a, pool_a, list(range(70, 78)), seed=6)  # still serving
        assert caplog.text.count("is unavailable") == 3  # A at start (not per retry), A and B on the loss
        master.start()  # back (empty: a restarted master lost its objects)
        until(lambda: a.storage.available, 60, "the store to be picked up again")
        again = list(range(90, 98))
        compute(a, pool_a, again, seed=7)
        a.storage.flush()
        until(lambda: b.storage.available, 60, "B to reconnect")
        assert b.peek(again).storage_tokens == 8
        assert "connected again" in caplog.text
        for c in (a, b):
            c.storage.close()
    finally:
        master.stop()


def test_a_hung_master_holds_a_lookup_for_a_second_at_most_once(master):
    import os
    import signal

    a, pool_a = replica(master.address)
    connected(a)
    key = list(range(8))
    os.kill(master.proc.pid, signal.SIGSTOP)  # alive, answering nothing
    try:
        started = time.monotonic()
        assert a.peek(key).storage_tokens == 0
        assert time.monotonic() - started < 3  # Mooncake's default would be 30 s, on the scheduler's thread
        assert not a.storage.available
        started = time.monotonic()
        for _ in range(20):  # later looks cost nothing while it is away
            a.peek(key)
        assert time.monotonic() - started < 0.5
    finally:
        os.kill(master.proc.pid, signal.SIGCONT)
    until(lambda: a.storage.available, 30, "the store to answer again")
    compute(a, pool_a, key, seed=9)
    a.storage.flush()
    assert a.storage.counters["written_pages"] == 4
    a.storage.close()
