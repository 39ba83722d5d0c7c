"""`record_trace`: the scheduler writes what it served as a Mooncake trace (arrival order, no
token ids), whose hash ids share exactly the prompts' shared blocks, and which replays."""

import json

import pytest

from radixkv.errors import ConfigError
from radixkv.mem.block_hash import block_ids
from radixkv.sampling_params import SamplingParams
from radixkv.sched import Req
from radixkv.workloads.replay import replay
from radixkv.workloads.trace import load_trace
from tests.sched.conftest import SYSTEM, workload


def test_the_recorded_trace_names_shared_blocks_alike_in_arrival_order(tiny_scheduler, tmp_path):
    path = tmp_path / "served.jsonl"
    sched = tiny_scheduler(max_running_requests=8, record_trace=str(path), record_trace_block_size=8,
                           compile="off")
    prompts = workload()
    lengths = [9, 1, 5, 2, 7, 3]  # finishing out of arrival order
    for i, (p, n) in enumerate(zip(prompts, lengths)):
        sched.add_request(Req(f"r{i}", p, SamplingParams(max_new_tokens=n, temperature=0)))
    while sched.has_work:
        sched.step()
    sched.add_request(Req("late", SYSTEM + [9] * 30, SamplingParams(max_new_tokens=50, temperature=0)))
    sched.step()  # still running at close: written with what it generated
    sched.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == len(prompts) + 1
    assert set(lines[0]) == {"timestamp", "input_length", "output_length", "hash_ids", "block_size"}
    assert [r["input_length"] for r in lines] == [len(p) for p in prompts] + [54]
    assert [r["output_length"] for r in lines[:-1]] == lengths and 0 < lines[-1]["output_length"] < 50
    stamps = [r["timestamp"] for r in lines]
    assert stamps[0] == 0 and stamps == sorted(stamps)
    for r, p in zip(lines, prompts):
        assert len(r["hash_ids"]) == -(-len(p) // 8) and all(0 <= h < 2**63 for h in r["hash_ids"])
    # blocks of the 24-token system prompt are alike wherever they appear; the rest differ
    system = lines[0]["hash_ids"][:3]
    assert all(r["hash_ids"][:3] == system for r in lines[:5] + lines[6:])
    assert lines[5]["hash_ids"][0] not in system
    assert lines[0]["hash_ids"][3] != lines[1]["hash_ids"][3]  # [100, 101, 102] vs [100, 101, 103, 104]
    # it replays: a page-8 cache with room for it all hits the shared whole blocks
    trace = load_trace(path)
    result = replay(trace, "inf", page_size=8, block_size=8)
    assert result.hit_tokens == 24 * 5  # the system prompt, for every request after the first
    assert sum(t.input_length for t in trace) == result.prompt_tokens


def test_two_recordings_name_a_block_alike_and_namespaces_apart(tiny_scheduler, tmp_path):
    """The ids are the block hash's (the ones the KV events announce and the store keys by), no
    longer keyed by a per-recording secret (issue 36: one block hash); a namespace still
    separates them."""
    ids = []
    for name, namespace in (("a", None), ("b", None), ("c", "tenant-b")):
        path = tmp_path / f"{name}.jsonl"
        sched = tiny_scheduler(record_trace=str(path), compile="off")
        req = Req("r", SYSTEM, SamplingParams(max_new_tokens=1))
        req.namespace = namespace
        sched.add_request(req)
        while sched.has_work:
            sched.step()
        sched.close()
        ids.append(json.loads(path.read_text())["hash_ids"])
    assert ids[0] == ids[1] == block_ids(None, SYSTEM, 16, partial=True)
    assert set(ids[2]).isdisjoint(ids[0])


def test_a_rid_used_again_keeps_every_line(tiny_scheduler, tmp_path):
    """Found in CI: lines were keyed by rid, then by id(req), and a finished request's line,
    still waiting for an older request, was overwritten by a later request with the same rid
    (or a new object at the freed object's address)."""
    path = tmp_path / "again.jsonl"
    sched = tiny_scheduler(record_trace=str(path), record_trace_block_size=8, compile="off")
    sched.add_request(Req("long", SYSTEM, SamplingParams(max_new_tokens=200, temperature=0)))
    for extra in range(1, 11):  # one after another, each finished while "long" still runs
        sched.add_request(Req("x", SYSTEM + [7] * extra, SamplingParams(max_new_tokens=1, temperature=0)))
        while "x" in sched.scheduler.reqs:
            sched.step()
    assert "long" in sched.scheduler.reqs
    sched.close()  # writes "long" with what it generated, then the ten behind it
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["input_length"] for r in lines] == [24, *range(25, 35)]


def test_bad_recording_settings_name_the_option(tiny_scheduler, tmp_path):
    with pytest.raises(ConfigError, match="record_trace="):
        tiny_scheduler(record_trace=str(tmp_path / "no" / "such" / "dir" / "t.jsonl"), compile="off")
    with pytest.raises(ConfigError, match="record_trace_block_size"):
        tiny_scheduler(record_trace=str(tmp_path / "t.jsonl"), record_trace_block_size=0)
