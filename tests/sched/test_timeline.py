"""The scheduler's timeline file and its time-to-first-token breakdown in get_stats()."""

import json

import pytest

from radixkv.errors import ConfigError
from radixkv.sampling_params import SamplingParams
from radixkv.sched import Req
from tests.sched.conftest import workload


def test_timeline_lines_up_requests_and_the_steps_that_ran_them(tiny_scheduler, tmp_path):
    path = tmp_path / "timeline.jsonl"
    sched = tiny_scheduler(max_running_requests=3, timeline_file=str(path))
    prompts = workload()
    for i, p in enumerate(prompts):
        sched.add_request(Req(f"r{i}", p, SamplingParams(max_new_tokens=5, temperature=0)))
    steps = 0
    while sched.has_work:
        sched.step()
        steps += 1
    stats = sched.get_stats()
    sched.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    ran = [r for r in records if r["event"] == "step"]
    done = {r["rid"]: r for r in records if r["event"] == "request"}
    assert len(ran) == steps == stats["extend_steps"] + stats["decode_steps"]
    assert sum(s["prefill_tokens"] for s in ran) == stats["prefill_tokens"]
    assert sorted(done) == [f"r{i}" for i in range(len(prompts))]
    for rid, r in done.items():
        assert r["arrival"] <= r["admitted"] <= r["first_token"] <= r["finished"]
        assert r["output_tokens"] == 5 and r["prompt_tokens"] == len(prompts[int(rid[1:])])
        mine = [s for s in ran if rid in s["rids"]]
        assert mine[0]["start"] >= r["admitted"] and len(mine) >= 4  # prefill (chunks) + 4 decode steps
    # with 3 rows at most, later requests queued behind the first ones
    assert stats["first_tokens"] == len(prompts)
    queued = [done[rid]["admitted"] - done[rid]["arrival"] for rid in done]
    assert stats["queue_seconds"] == pytest.approx(sum(queued), abs=1e-6)
    assert stats["mean_queue_seconds"] == pytest.approx(sum(queued) / len(prompts), abs=1e-6)
    assert stats["mean_queue_seconds"] > 0 and stats["mean_prefill_seconds"] > 0


def test_a_timeline_file_that_cannot_be_written_names_the_option(tiny_scheduler, tmp_path):
    with pytest.raises(ConfigError, match="timeline_file="):
        tiny_scheduler(timeline_file=str(tmp_path / "no" / "such" / "dir" / "t.jsonl"))
