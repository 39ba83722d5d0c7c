"""`benchmarks/kv_quant.py` and `benchmarks/host_tier_replay.py` on small settings."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def script(name, *args):
    return subprocess.run([sys.executable, str(BENCH / name), *args], capture_output=True, text=True,
                          timeout=600, cwd=BENCH)


@pytest.mark.slow  # 15-28 s of model runs; each format's quality bounds run in CI in tests/model/test_kv_quant_quality.py
def test_kv_quant_reports_capacity_and_quality_per_format(tmp_path):
    out = tmp_path / "q.json"
    proc = script("kv_quant.py", "--formats", "auto,int8,int4", "--prompts", "1", "--new-tokens", "4",
                  "--text-tokens", "64", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["format"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"auto", "int8", "int4"}
    assert rows["auto"]["greedy_agreement"] == 1.0 and rows["auto"]["mean_kl"] == 0.0
    assert rows["int4"]["tokens_in_budget"] > rows["int8"]["tokens_in_budget"] > 3 * rows["auto"]["tokens_in_budget"]
    assert rows["int4"]["mean_kl"] > rows["int8"]["mean_kl"] > 0
    assert out.with_suffix(".png").stat().st_size > 10_000


def test_kv_quant_rejects_an_unknown_format():
    proc = script("kv_quant.py", "--formats", "int3")
    assert proc.returncode == 2 and "--formats" in proc.stderr


@pytest.mark.slow  # 24 s (two processes, the whole trace parsed); the split itself runs in CI in tests/workloads/test_replay.py
def test_host_tier_replay_splits_hits_by_tier(tmp_path):
    out = tmp_path / "h.json"
    proc = script("host_tier_replay.py", "--limit", "400", "--capacity-tokens", "1000000", "--host-multipliers",
                  "0,2", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["host_multiplier"] for r in rows] == [0, 2]
    assert rows[0]["host_hit_tokens"] == 0 < rows[1]["host_hit_tokens"]
    assert rows[1]["host_copy_seconds"] < rows[1]["recompute_seconds"]
    assert "host %" in proc.stdout
    proc = script("host_tier_replay.py", "--host-multipliers", "x")
    assert proc.returncode == 2 and "--host-multipliers" in proc.stderr


@pytest.mark.slow  # 30 s; jump-forward and masks are also tested in tests/sched/test_constrained.py
def test_constrained_benchmark_measures_masks_and_jump_forward(tmp_path):
    out = tmp_path / "c.json"
    proc = script("constrained.py", "--batch", "1", "--tokens", "8", "--repeats", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert 0 < report["mask_cost"]["batch 1"]["mask_share_pct"] < 50
    jump = report["jump_forward"]
    assert jump["on"]["forced"] > 0 and jump["on"]["steps"] < jump["off"]["steps"]
    assert script("constrained.py", "--tokens", "2").returncode == 2


def test_storage_tier_benchmark_refuses_bad_settings_and_measures_the_disk(tmp_path):
    proc = script("storage_tier.py", "--prompt-tokens", "4")
    assert proc.returncode == 2 and "--prompt-tokens" in proc.stderr
    sys.path.insert(0, str(BENCH))
    try:
        import storage_tier
    finally:
        sys.path.remove(str(BENCH))
    disk = storage_tier.disk_bandwidth(tmp_path, 4)
    assert min(disk["write_gbs"], disk["read_cold_gbs"], disk["read_warm_gbs"]) > 0
    assert not list(tmp_path.iterdir())  # its file is gone


def test_memory_efficiency_measures_paging_and_sharing_and_refuses_bad_settings(tmp_path, capsys):
    out = tmp_path / "m.json"
    trace = tmp_path / "t.jsonl"
    lines = (BENCH / "data" / "mooncake_conversation_trace.jsonl").read_text().splitlines()[:400]
    trace.write_text("\n".join(lines) + "\n")
    proc = script("memory_efficiency.py", "--skip-engine", "--trace", str(trace), "--budget", "2GiB",
                  "--windows", "4", "--concurrency", "1,16", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = result["allocation"]["rows"]
    assert rows["static"]["max_len"] == result["allocation"]["max_request_tokens"]
    assert rows["paged-1"]["utilisation"] == 1.0 > rows["paged-128"]["utilisation"] > rows["static"]["utilisation"]
    assert rows["paged-16"]["mean_concurrent_requests"] > rows["static"]["mean_concurrent_requests"]
    one, sixteen = result["sharing"]["rows"]
    assert one["saved"] == 0 and one["pages_shared"] == one["pages_unshared"] == (1024 + 512) // 16
    assert sixteen["pages_shared"] == 1024 // 16 + 16 * 512 // 16  # the system prompt's pages once
    assert out.with_suffix(".png").stat().st_size > 10_000
    sys.path.insert(0, str(BENCH))
    try:
        import memory_efficiency  # (its flags checked in this process: no interpreter start per case)
    finally:
        sys.path.remove(str(BENCH))
    for bad in (["--page-sizes", "0"], ["--budget", "lots"], ["--formats", "fp7"], ["--windows", "0"]):
        with pytest.raises(SystemExit) as exit_:
            memory_efficiency.parse_args(["--skip-engine", *bad])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert bad[0] in err or bad[1] in err, err


@pytest.mark.slow  # 20 s of engine runs; the formats' pools and quality run in CI in tests/model
def test_memory_efficiency_runs_more_requests_at_once_in_smaller_formats(tmp_path):
    out = tmp_path / "m.json"
    proc = script("memory_efficiency.py", "--formats", "auto,int4", "--requests", "24", "--new-tokens", "4",
                  "--windows", "2", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    auto, int4 = json.loads(out.read_text())["formats"]["rows"]
    assert int4["pool_tokens"] > 4 * auto["pool_tokens"]
    assert int4["max_running_requests"] == 24 > auto["max_running_requests"]
