"""The `auto` prefetch policy: a request waits for its storage read while reading the rest is
expected to cost less than computing it, from the bandwidth the tier's reads get and the
prefill speed the scheduler measures; it waits before either is measured, and stops waiting
on a read that stalls."""

from types import SimpleNamespace

from radixkv.mem.storage_tier import Fetch, Prefetch, StorageTier, StorageTierConfig
from radixkv.sched.prefetch import STALL_SECONDS, Prefetcher
from radixkv.sched.stats import SchedulerStats


def setup(bandwidth, rate, pages=10, arrived=0):
    storage = StorageTier(StorageTierConfig(num_pages=100, page_size=64))
    storage.page_bytes, storage.read_bandwidth = 64 * 80_000, bandwidth  # 80 kB a token (a 360M model, fp32)
    prefetcher = Prefetcher(SimpleNamespace(storage=storage), "auto", 1.0, lambda: rate)
    fetch = Fetch([bytes([i]) * 16 for i in range(pages)])
    for _ in range(arrived):
        fetch.add(None)
    return prefetcher, Prefetch(fetch, (), None, 0)


def test_it_waits_when_the_disk_reads_faster_than_the_model_computes():
    prefetcher, read = setup(bandwidth=2e9, rate=600.0)  # 2 GB/s: 64 tokens in 2.6 ms, computed in 107 ms
    assert prefetcher.worth_waiting(read, read.fetch.last_arrival)


def test_it_goes_without_the_read_when_computing_is_faster():
    prefetcher, read = setup(bandwidth=20e6, rate=50_000.0)  # a slow disk under a fast GPU
    assert not prefetcher.worth_waiting(read, read.fetch.last_arrival)


def test_it_waits_before_anything_is_measured_and_not_on_a_stalled_read():
    prefetcher, read = setup(bandwidth=None, rate=None, arrived=3)
    now = read.fetch.last_arrival
    assert prefetcher.worth_waiting(read, now)
    assert not prefetcher.worth_waiting(read, now + STALL_SECONDS + 0.1)


def test_nothing_left_to_read_is_not_waited_for():
    prefetcher, read = setup(bandwidth=2e9, rate=600.0, pages=2, arrived=2)
    assert not prefetcher.worth_waiting(read, read.fetch.last_arrival)


def test_the_prefill_rate_comes_from_extend_steps_only():
    stats = SchedulerStats()
    assert stats.prefill_rate() is None
    stats.record_step(num_decode=4, prefill_tokens=0, seconds=0.5, forward=0.5)
    assert stats.prefill_rate() is None  # a decode step says nothing of prefill speed
    stats.record_step(num_decode=0, prefill_tokens=1000, seconds=2.0, forward=1.9)
    assert stats.prefill_rate() == 500.0
