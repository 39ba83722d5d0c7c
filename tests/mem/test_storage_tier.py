"""The storage tier under the host tier: write-back on host eviction, matching by page keys,
prefetch and install, its own LRU budget, and the files on disk (round trip bit for bit,
restart, crash and corruption handling, a full or read-only directory)."""

import time

import pytest
import torch

from radixkv.mem import PageAllocator
from radixkv.mem.cache_factory import block_shapes
from radixkv.mem.disk_storage import SUFFIX, DiskKVStorage
from radixkv.mem.host_tier import HostKVTier, HostTier, HostTierConfig
from radixkv.mem.kv_pool import KVLayout, make_kv_pool
from radixkv.mem.block_hash import chain, root
from radixkv.mem.storage_identity import storage_identity
from radixkv.mem import RadixCache
from radixkv.mem.storage_tier import StorageTier, StorageTierConfig

A = list(range(100, 108))
B = list(range(200, 208))
C = list(range(300, 308))
IDENTITY = b"test-identity-01"


def sim_cache(device_pages=8, host_pages=8, storage_pages=64, page_size=1, per_block=1, **storage_options):
    host = HostTier(HostTierConfig(host_pages, page_size))
    storage = StorageTier(StorageTierConfig(storage_pages, page_size * per_block, **storage_options))
    return RadixCache(PageAllocator(device_pages, page_size), "lru", host_tier=host, storage=storage)


def cache_tokens(cache, key):
    """A request for `key` that evicts for its pages, then is cached (what the replay does)."""
    assert cache.serve_and_cache(key, cache.match_prefix(key))


def served(cache, key):
    """A request's admission the way the scheduler does it, storage prefetch included: the
    tokens it found on the device, on the host, and in storage."""
    match = cache.peek(key)
    device = match.num_tokens
    match = cache.load_from_storage(match)
    host_total = match.host_tokens
    loaded = cache.load_back(cache.settle(match))
    return device, host_total - loaded.from_storage, loaded.from_storage


def test_pages_the_host_tier_lets_go_are_written_to_storage_and_come_back():
    cache = sim_cache()
    cache_tokens(cache, A)
    cache_tokens(cache, B)  # A goes to the host
    assert cache.storage.stored_pages == 0
    cache_tokens(cache, C)  # B to the host, which lets A go: A to storage
    assert cache.storage.stored_pages == 8
    assert (cache.peek(A).host_tokens, cache.peek(A).storage_tokens) == (0, 8)
    assert served(cache, A) == (0, 0, 8)
    assert cache.stats_storage_hit_tokens == 8
    cache.check_invariants(inflight_pages=0)


def test_a_match_continues_from_the_tree_into_storage_past_a_divergence():
    cache = sim_cache(device_pages=16, host_pages=16)
    cache_tokens(cache, A + B)
    cache_tokens(cache, A + C)  # the tree: A, then B and C below it
    for filler in range(4):
        cache_tokens(cache, list(range(1000 * (filler + 1), 1000 * (filler + 1) + 8)))
    assert cache.storage.stored_pages > 0
    device, host, storage = served(cache, A + B)
    assert device + host + storage == 16 and storage > 0
    cache.check_invariants(inflight_pages=0)


def test_keys_depend_on_the_whole_prefix_and_the_namespace():
    start = root(None)
    assert list(chain(start, [1, 2, 3, 4], 2))[1] != list(chain(start, [9, 9, 3, 4], 2))[1]  # same page, other prefix
    assert list(chain(start, [1, 2], 2)) != list(chain(root("salt"), [1, 2], 2))
    assert list(chain(start, [1, 2, 3], 2)) == list(chain(start, [1, 2], 2))  # whole pages only


@pytest.mark.parametrize("per_block", [1, 4])
def test_another_namespace_does_not_hit_stored_pages(per_block):
    cache = sim_cache(per_block=per_block)
    for key in (A, B, C, list(range(400, 408))):
        cache_tokens(cache, key)
    assert cache.peek(A).storage_tokens == 8
    assert cache.peek(A, "tenant-b").storage_tokens == 0


def test_storage_keeps_its_budget_by_dropping_the_least_recently_used_runs():
    tier = StorageTier(StorageTierConfig(num_pages=4, page_size=1))
    keys = [bytes([i]) * 16 for i in range(6)]
    tier.write(keys[0:2])
    tier.write(keys[2:4])
    tier.fetch(keys[0:2])  # touched: now the most recent
    tier.write(keys[4:6])  # over budget: the run of keys 2-3 goes
    assert [tier.holds(k) for k in keys] == [True, True, False, False, True, True]
    assert tier.counters["evicted_pages"] == 2 and tier.stored_pages == 4
    assert tier.write(keys[0:2]) == 0  # held already: nothing written twice


def test_write_through_selective_writes_a_node_once_it_is_hot():
    cache = sim_cache(device_pages=32, write_policy="write-through-selective", hit_threshold=2)
    cache_tokens(cache, A)
    cache.match_prefix(A)
    assert cache.storage.stored_pages == 0
    cache.match_prefix(A)  # the second hit
    assert cache.storage.stored_pages == 8  # on disk while still on the device


def test_write_through_writes_as_soon_as_cached_and_what_it_skipped_at_eviction():
    cache = sim_cache(device_pages=32, write_policy="write-through")
    cache_tokens(cache, A)
    assert cache.storage.stored_pages == 8  # cached once, never hit: stored already
    cache.storage.enabled = False  # (a store away: this write is skipped)
    cache_tokens(cache, B)
    cache.storage.enabled = True
    assert cache.storage.stored_pages == 8
    for i in range(6):  # B goes down through the host tier, which writes what storage lacks
        cache_tokens(cache, [900 + 10 * i + j for j in range(8)])
    assert cache.storage.held_run(chain(root(None), B, 1)) == 8


# -- on disk ---------------------------------------------------------------------------------------
LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=4, page_size=2)


def disk_cache(directory, identity=IDENTITY, device_pages=4, host_pages=4, storage_pages=64, layout=LAYOUT,
               per_block=1):
    pool = make_kv_pool(layout, device_pages)
    host = HostKVTier(HostTierConfig(host_pages, layout.page_size), pool)
    storage = DiskKVStorage(StorageTierConfig(storage_pages, layout.page_size * per_block), directory, identity,
                            block_shapes(pool, per_block))
    cache = RadixCache(PageAllocator(device_pages, layout.page_size), "lru", host_tier=host,
                               storage=storage)
    return cache, pool


def compute(cache, pool, key, seed):
    """A request computing `key`: its pages get recognisable random KV, then it is cached."""
    match = cache.match_prefix(key)
    cache.lock(match.last_node)
    from radixkv.mem import SeqPages

    seq = SeqPages.from_prefix(cache.allocator, match.pages, match.num_tokens)
    need = seq.pages_needed(len(key) - match.num_tokens)
    if cache.allocator.free_pages < need:
        cache.evict((need - cache.allocator.free_pages) * cache.page_size)
    seq.extend(len(key) - match.num_tokens)
    new = torch.tensor(seq.pages[len(match.pages):], dtype=torch.int64)
    g = torch.Generator().manual_seed(seed)
    data = [torch.randn((len(new), *shape), generator=g).to(dtype) for shape, dtype in pool.page_shapes()]
    pool.write_pages(new, data)
    written = {p: [d[i].clone() for d in data] for i, p in enumerate(new.tolist())}
    cache.cache_finished(list(key), seq, match.last_node)
    return [written[p] for p in seq_pages_of(cache, key)]


def seq_pages_of(cache, key):
    return cache.peek(key).pages


def page_data(pool, pages):
    rows = pool.read_pages(torch.tensor(pages, dtype=torch.int64))
    return [[r[i] for r in rows] for i in range(len(pages))]


def push_to_storage(cache, pool, key, seed=0):
    """Compute `key`, then push it down through host to storage with other prompts."""
    expected = compute(cache, pool, key, seed)
    for i in range(6):
        compute(cache, pool, [5000 + 10 * i + j for j in range(8)], seed + i + 1)
    cache.storage.flush()
    assert cache.peek(key).num_tokens == 0 and cache.peek(key).host_tokens == 0
    return expected


def wait(fetch):
    deadline = time.monotonic() + 30
    while not fetch.done:
        assert time.monotonic() < deadline
        time.sleep(0.001)


def load(cache, key):
    match = cache.load_from_storage(cache.peek(key))
    loaded = cache.load_back(cache.settle(match))
    return loaded


def test_pages_the_disk_tier_evicts_become_ghosts_from_its_writer_thread(tmp_path):
    from radixkv.mem.miss_causes import GhostIndex, explain

    cache, pool = disk_cache(tmp_path, storage_pages=4)  # one 8-token prefix on disk at a time
    cache.ghosts = GhostIndex()
    key = list(range(100, 108))
    push_to_storage(cache, pool, key)  # key's run is written, then the next runs push it out
    cache.storage.flush()
    assert cache.peek(key).storage_tokens == 0 and cache.storage.counters["evicted_pages"] > 0
    causes = explain(cache, key, None, 0)
    assert causes["evicted"] == 8 and causes["new"] == 0, causes
    cache.storage.close()


def test_a_prefix_through_host_to_disk_and_back_is_bit_identical(tmp_path):
    cache, pool = disk_cache(tmp_path)
    key = list(range(8))
    expected = push_to_storage(cache, pool, key)
    assert list(tmp_path.glob(f"*{SUFFIX}"))
    assert cache.peek(key).storage_tokens == 8
    loaded = load(cache, key)
    assert loaded.num_tokens == 8 and loaded.from_storage == 8
    for got, want in zip(page_data(pool, loaded.pages), expected):
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    cache.check_invariants(inflight_pages=0)
    cache.storage.close()


def test_a_new_process_on_the_same_directory_hits_without_reading_pages(tmp_path):
    cache, pool = disk_cache(tmp_path)
    key = list(range(8))
    expected = push_to_storage(cache, pool, key)
    cache.storage.close()
    again, pool2 = disk_cache(tmp_path)  # a restart: an empty tree, the directory's index
    assert again.storage.stored_pages > 0 and again.storage.counters["read_pages"] == 0
    loaded = load(again, key)
    assert loaded.from_storage == 8
    for got, want in zip(page_data(pool2, loaded.pages), expected):
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    again.storage.close()


def test_files_of_another_identity_or_layout_are_ignored(tmp_path, caplog):
    cache, pool = disk_cache(tmp_path)
    push_to_storage(cache, pool, list(range(8)))
    cache.storage.close()
    files = sorted(tmp_path.glob(f"*{SUFFIX}"))
    other, _ = disk_cache(tmp_path, identity=b"another-model-00")
    assert other.storage.stored_pages == 0 and other.storage.foreign_files == len(files)
    assert sorted(tmp_path.glob(f"*{SUFFIX}")) == files  # not ours, so not deleted
    other.storage.close()
    wider = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, page_size=2)
    third, _ = disk_cache(tmp_path, layout=wider)
    assert third.storage.stored_pages == 0 and third.storage.foreign_files == len(files)
    third.storage.close()


def test_torn_corrupt_and_half_written_files_are_misses_never_loaded(tmp_path):
    cache, pool = disk_cache(tmp_path)
    key = list(range(8))
    push_to_storage(cache, pool, key)
    cache.storage.close()
    files = sorted(tmp_path.glob(f"*{SUFFIX}"))
    assert len(files) >= 2
    truncated, corrupt = files[0], files[1]
    truncated.write_bytes(truncated.read_bytes()[:-5])
    data = bytearray(corrupt.read_bytes())
    data[-3] ^= 0xFF  # a flipped byte in the last page: the header still parses
    corrupt.write_bytes(bytes(data))
    (tmp_path / f"{'ab' * 16}{SUFFIX}.tmp12345").write_bytes(b"half a file")
    broken = tmp_path / f"{IDENTITY.hex()}-{'cd' * 16}{SUFFIX}"
    broken.write_bytes(b"RKVP2\n\xff\xff")
    again, pool2 = disk_cache(tmp_path)
    assert not truncated.exists() and not (tmp_path / f"{'ab' * 16}{SUFFIX}.tmp12345").exists()
    assert not broken.exists()
    assert again.storage.counters["corrupt_files"] == 2
    corrupt_keys = [k for k, (run, _) in again.storage._index.items() if run.id == corrupt.name]
    assert corrupt_keys  # indexed from its header: pages are checked when read
    fetch = again.storage.fetch(corrupt_keys)  # the read stops at the bad page and deletes the file
    wait(fetch)
    assert not fetch.complete and not corrupt.exists()
    assert not any(again.storage.holds(k) for k in corrupt_keys)
    assert again.storage.counters["corrupt_files"] == 3
    again.storage.close()


def test_a_directory_that_cannot_be_written_turns_the_tier_off_and_serving_goes_on(tmp_path, caplog):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the directory should be")  # (root ignores read-only modes)
    cache, pool = disk_cache(blocked)
    assert not cache.storage.enabled and "turned off" in caplog.text
    compute(cache, pool, list(range(8)), 0)
    for i in range(6):
        compute(cache, pool, [5000 + 10 * i + j for j in range(8)], i + 1)
    assert cache.storage.stored_pages == 0
    cache.check_invariants(inflight_pages=0)
    cache.storage.close()


def test_a_failed_write_turns_the_tier_off_with_a_warning(tmp_path, caplog, monkeypatch):
    cache, pool = disk_cache(tmp_path)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache.storage, "_write_file", full)
    compute(cache, pool, list(range(8)), 0)
    for i in range(6):
        compute(cache, pool, [5000 + 10 * i + j for j in range(8)], i + 1)
    cache.storage.flush()
    assert not cache.storage.enabled and cache.storage.counters["write_errors"] >= 1
    assert "turned off" in caplog.text
    assert cache.peek(list(range(8))).storage_tokens == 0
    cache.check_invariants(inflight_pages=0)
    cache.storage.close()


def test_identity_names_model_format_page_size_and_layout():
    shapes = [((2, 4, 8), torch.float32)]
    base = storage_identity({"config": "x"}, "auto", 16, shapes)
    assert base != storage_identity({"config": "y"}, "auto", 16, shapes)
    assert base != storage_identity({"config": "x"}, "int8", 16, shapes)
    assert base != storage_identity({"config": "x"}, "auto", 32, shapes)
    assert base != storage_identity({"config": "x"}, "auto", 16, [((2, 4, 8), torch.bfloat16)])


def test_a_second_process_on_the_same_directory_runs_without_the_tier(tmp_path, caplog):
    first, _ = disk_cache(tmp_path)
    import subprocess
    import sys

    code = ("import sys, torch; from radixkv.mem.disk_storage import DiskKVStorage; "
            "from radixkv.mem.storage_tier import StorageTierConfig; "
            f"s = DiskKVStorage(StorageTierConfig(8, 2), {str(tmp_path)!r}, b'x' * 16, [((2,), torch.float32)]); "
            "sys.exit(0 if not s.enabled else 3)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
    assert first.storage.enabled
    first.storage.close()


# -- found in review -------------------------------------------------------------------------------
def test_broken_headers_and_foreign_names_never_stop_a_start_and_others_files_stay(tmp_path):
    """A header that is valid JSON but not an object, or holds a key that is not hex, raised at
    start-up; a directory named like a temporary file raised on unlink; any file with ".tmp" in
    its name was deleted, the user's included; a file not named by its first key was indexed."""
    cache, pool = disk_cache(tmp_path)
    push_to_storage(cache, pool, list(range(8)))
    cache.storage.close()
    good = sorted(tmp_path.glob(f"*{SUFFIX}"))
    import json as _json
    import struct as _struct

    def header_file(name, header):
        body = _json.dumps(header).encode()
        (tmp_path / name).write_bytes(b"RKVP2\n" + _struct.pack("<I", len(body)) + body)

    ident = IDENTITY.hex()
    header_file(f"{ident}-{'11' * 16}{SUFFIX}", [1, 2, 3])
    header_file(f"{ident}-{'22' * 16}{SUFFIX}", {"identity": ident, "page_size": 2, "page_bytes": disk_page_bytes(pool),
                                          "keys": ["zz" * 16], "crc": [0]})
    (tmp_path / f"{'33' * 16}{SUFFIX}.tmp99").mkdir()
    (tmp_path / "notes.tmp").write_text("the user's")
    misnamed = tmp_path / f"{ident}-{'44' * 16}{SUFFIX}"
    misnamed.write_bytes(good[0].read_bytes())  # a copy under another name: its keys are another file's
    again, _ = disk_cache(tmp_path)
    assert again.storage.enabled and again.storage.stored_pages > 0
    assert not (tmp_path / f"{ident}-{'11' * 16}{SUFFIX}").exists()
    assert not (tmp_path / f"{ident}-{'22' * 16}{SUFFIX}").exists()
    assert not misnamed.exists() and (tmp_path / "notes.tmp").exists()
    assert all(p.exists() for p in good)
    again.storage.close()


def disk_page_bytes(pool):
    return sum(int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
               for shape, dtype in pool.page_shapes())


def test_a_run_evicted_while_being_read_is_a_plain_miss_not_corruption(tmp_path):
    """It was counted (and logged) as a corrupt file."""
    cache, pool = disk_cache(tmp_path)
    push_to_storage(cache, pool, list(range(8)))
    storage = cache.storage
    key, (run, _) = next(iter(storage._index.items()))
    real = storage._read_pages

    def evicted_meanwhile(run, first, n, files):  # the writer evicts the run after the reader looked it up
        storage._drop_run(run)
        return real(run, first, n, files)

    storage._read_pages = evicted_meanwhile
    corrupt = storage.counters["corrupt_files"]
    fetch = storage.fetch([key])
    wait(fetch)
    assert fetch.arrived == 0 and storage.counters["corrupt_files"] == corrupt
    storage.close()


def test_writes_past_the_pending_cap_are_skipped_or_wait(tmp_path):
    import threading

    cache, pool = disk_cache(tmp_path)
    storage = cache.storage
    release = threading.Event()
    real = storage._write_file
    storage._write_file = lambda keys, rows: (release.wait(30), real(keys, rows))
    storage.max_pending_bytes = storage.page_bytes  # one page in flight at most
    rows = [torch.zeros((1, *shape), dtype=dtype) for shape, dtype in pool.page_shapes()]
    assert storage.write([b"a" * 16], rows) == 1
    assert storage.write([b"b" * 16], rows) == 0 and storage.counters["skipped_pages"] == 1
    done = []
    waiter = threading.Thread(target=lambda: done.append(storage.write([b"c" * 16], rows, wait=True)))
    waiter.start()
    time.sleep(0.2)
    assert not done  # waits for room instead of skipping (persist at shutdown)
    release.set()
    waiter.join(30)
    storage.flush()
    assert done == [1] and storage.holds(b"a" * 16) and storage.holds(b"c" * 16)
    storage.close()


def test_retrained_weights_of_the_same_size_change_the_identity(tmp_path):
    from radixkv.mem.storage_identity import model_fingerprint

    (tmp_path / "config.json").write_text("{}")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(bytes(1 << 20))
    before = model_fingerprint(tmp_path)
    weights.write_bytes(bytes([1]) * (1 << 20))  # the same size and name, every weight changed
    assert model_fingerprint(tmp_path) != before
    weights.write_bytes(bytes(1 << 20))
    assert model_fingerprint(tmp_path) == before  # (slices are sampled: a key is stable across starts)


def test_best_effort_waits_for_a_first_page_then_goes_with_what_has_arrived():
    from radixkv.mem.storage_tier import Fetch

    fetch = Fetch([b"k" * 16, b"l" * 16])
    assert not fetch.ready("best_effort", 0.0)  # nothing yet: admitting now would use nothing
    fetch.arrived = 1
    assert fetch.ready("best_effort", 0.0) and not fetch.ready("wait_complete", 0.0)
    assert fetch.ready("timeout", 0.0) and not fetch.ready("timeout", 60.0)
    fetch.done = True
    assert fetch.ready("wait_complete", 0.0)


# -- stored pages larger than device pages ---------------------------------------------------------
def test_blocks_of_device_pages_round_trip_bit_for_bit_from_a_fresh_process(tmp_path):
    cache, pool = disk_cache(tmp_path, per_block=2)  # 4-token stored pages over 2-token device pages
    key = list(range(8))
    expected = push_to_storage(cache, pool, key)
    assert cache.storage.page_size == 4 and cache.storage.stored_pages >= 2
    cache.storage.close()
    again, pool2 = disk_cache(tmp_path, per_block=2)
    assert again.peek(key).storage_tokens == 8
    loaded = load(again, key)
    assert loaded.num_tokens == 8 and loaded.from_storage == 8
    for got, want in zip(page_data(pool2, loaded.pages), expected):
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert again.storage.counters["read_pages"] == 2  # one read and one check per block, not per page
    again.check_invariants(inflight_pages=0)
    again.storage.close()


def test_a_read_that_begins_inside_a_block_skips_what_the_tree_holds(tmp_path):
    cache, pool = disk_cache(tmp_path, per_block=2, device_pages=6)
    key = list(range(8))
    expected = push_to_storage(cache, pool, key)
    compute(cache, pool, key[:2], seed=99)  # the tree now holds the first device page of the first block
    assert cache.peek(key).num_tokens == 2
    assert cache.peek(key).storage_tokens == 6  # the first block's second page, and the second block
    loaded = load(cache, key)
    assert loaded.num_tokens == 8 and loaded.from_storage == 6
    for got, want in zip(page_data(pool, loaded.pages[1:]), expected[1:]):
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    cache.check_invariants(inflight_pages=0)
    cache.storage.close()


def test_a_block_the_disk_tier_evicts_is_a_ghost_for_the_miss_causes(tmp_path):
    from radixkv.mem.miss_causes import GhostIndex, explain

    cache, pool = disk_cache(tmp_path, storage_pages=2, per_block=2)  # one 8-token prefix on disk
    cache.ghosts = GhostIndex()
    key = list(range(100, 108))
    push_to_storage(cache, pool, key)
    cache.storage.flush()
    assert cache.peek(key).storage_tokens == 0 and cache.storage.counters["evicted_pages"] > 0
    causes = explain(cache, key, None, 0)
    assert causes["evicted"] == 8 and causes["new"] == 0, causes
    cache.storage.close()


def test_stored_page_size_must_be_whole_device_pages():
    from radixkv.errors import ConfigError
    from radixkv.mem.storage_tier import block_tokens

    assert block_tokens(None, 1) == 64 and block_tokens(None, 16) == 64 and block_tokens(None, 48) == 96
    assert block_tokens(32, 16) == 32
    with pytest.raises(ConfigError, match="kv_storage_block_size"):
        block_tokens(24, 16)
