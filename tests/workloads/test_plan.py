"""`radixkv plan`: the curve agrees with the simulator's own replays at every capacity it reports,
targets are met by the capacity found (and missed just below it), the knee and the working set
are where they should be, and the command line writes the JSON and refuses bad input."""

import json
from pathlib import Path

import pytest

from radixkv.workloads.plan import PlanConfig, PlanPoint, knee, plan
from radixkv.workloads.replay import replay
from radixkv.workloads.trace import load_trace

MOONCAKE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "mooncake_conversation_trace.jsonl"
needs_trace = pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"{MOONCAKE} not present")


@pytest.fixture(scope="module")
def head():
    return load_trace(MOONCAKE, limit=400)


@needs_trace
def test_the_curve_agrees_with_replays_and_meets_its_targets(head):
    config = PlanConfig(page_size=512, tolerance=0.2)
    report = plan(head, config, capacities=[100_000, 400_000, 2_000_000], targets=[0.1, 0.99],
                  bytes_per_token={"fp16": 1000, "int8": 520})
    assert [p["capacity_tokens"] for p in report["curve"]] == [99_840, 399_872, 1_999_872]  # whole pages
    for p in report["curve"]:
        r = replay(head, "lru", p["capacity_tokens"], page_size=512)
        assert p["hit_rate"] == r.hit_rate and p["hit_tokens"] == r.hit_tokens
        assert p["prefill_saved"] == pytest.approx(r.prefill_work_saved / r.prefill_work)
        assert p["memory_bytes"] == {"fp16": 1000 * p["capacity_tokens"], "int8": 520 * p["capacity_tokens"]}
    top = replay(head, "inf", page_size=512)
    ws = report["working_set"]
    assert ws["hit_rate"] == top.hit_rate and ws["capacity_tokens"] == top.prompt_tokens - top.hit_tokens
    reached, unreachable = report["targets"]
    assert unreachable["capacity_tokens"] is None  # above the working set's hit rate
    cap = reached["capacity_tokens"]
    assert replay(head, "lru", cap, page_size=512).hit_rate >= 0.1 == reached["hit_rate"]
    below = (cap - max(512, int(0.2 * cap)) - 512) // 512 * 512
    assert replay(head, "lru", below, page_size=512).hit_rate < 0.1
    assert report["tokens_per_gb"] == {"fp16": 1_000_000, "int8": 1_923_076}


@needs_trace
def test_the_default_sweep_spans_the_working_set_with_tiers(head):
    head = head[:300]
    config = PlanConfig(page_size=512, host_capacity_tokens=200_000, storage_capacity_tokens=400_000)
    report = plan(head, config, points=5)
    caps = [p["capacity_tokens"] for p in report["curve"]]
    assert caps == sorted(caps) and len(caps) == 5
    assert caps[-1] == report["working_set"]["capacity_tokens"] // 512 * 512
    assert caps[0] <= caps[-1] // 200
    small = report["curve"][0]
    assert small["host_hit_tokens"] + small["storage_hit_tokens"] > 0  # the tiers served what the pool could not
    r = replay(head, "lru", caps[0], page_size=512, host_capacity_tokens=200_000, storage_capacity_tokens=400_000)
    assert (small["hit_tokens"], small["storage_hit_tokens"]) == (r.hit_tokens, r.storage_hit_tokens)


def test_the_knee_is_where_the_curve_bends():
    def curve(rates):
        return [PlanPoint(1000 * 2**i, r, r, 0, 0, 0, 0) for i, r in enumerate(rates)]

    assert knee(curve([0.1, 0.5, 0.6, 0.62, 0.63])) == 1
    assert knee(curve([0.0, 0.01, 0.02, 0.3, 0.6])) is None  # still climbing: no knee yet
    assert knee(curve([0.2, 0.2, 0.2])) is None and knee(curve([0.1, 0.2])) is None


def test_bad_plan_settings_are_refused():
    with pytest.raises(ValueError, match="host tier"):
        PlanConfig(storage_capacity_tokens=512)
    with pytest.raises(ValueError, match="page_size"):
        PlanConfig(page_size=0)


@needs_trace
def test_the_command_writes_the_plan_and_refuses_bad_input(run_cli, tmp_path):
    out = tmp_path / "plan.json"
    r = run_cli("plan", str(MOONCAKE), "--limit", "200", "--capacity-tokens", "64k", "1M", "--kv-dtype", "fp16,int4",
                "--target-hit-rate", "0.03", "--json", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert {"curve", "knee", "working_set", "targets", "bytes_per_token"} <= set(report)
    assert [p["capacity_tokens"] for p in report["curve"]] == [64_000, 999_936]
    assert set(report["bytes_per_token"]) == {"fp16", "int4"}
    assert report["bytes_per_token"]["fp16"] == 30 * 2 * 3 * 64 * 2  # SmolLM2-135M: 30 layers, 3 KV heads x 64
    assert "hit rate" in r.stdout and "64,000" in r.stdout and "hit rate 3.0%" in r.stdout
    for argv, field in ((["--capacity-tokens", "lots"], "--capacity-tokens"), (["--target-hit-rate", "2"],
                        "--target-hit-rate"), (["--page-size", "0"], "--page-size")):
        r = run_cli("plan", str(MOONCAKE), "--limit", "5", "--no-progress", *argv)
        assert r.returncode == 2 and field in r.stderr, r.stderr
    r = run_cli("plan", str(tmp_path / "missing.jsonl"))
    assert r.returncode == 2 and "missing.jsonl" in r.stderr
