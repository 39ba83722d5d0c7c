"""The side-by-side benchmark scripts: trace scaling, the docs' summary table, and real runs on small
settings (a real radixkv server; the vLLM peer is not installed in CI and is skipped by flag)."""

import datetime
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
sys.path.insert(0, str(BENCH))

import mooncake_e2e  # noqa: E402
import run_all  # noqa: E402


def script(name, *args, timeout=600):
    return subprocess.run([sys.executable, str(BENCH / name), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=BENCH)


def test_scaled_trace_keeps_shared_prefixes_equal_token_for_token():
    trace = mooncake_e2e.scaled_trace(mooncake_e2e.TRACE, 200, 4, 49152)
    assert len(trace) == 200
    by_hash = {}
    for req in trace:
        assert len(req.input_ids) == req.input_length
        assert 4 * (len(req.hash_ids) - 1) < req.input_length <= 4 * len(req.hash_ids)
        for i, h in enumerate(req.hash_ids[:-1]):
            block = req.input_ids[4 * i: 4 * i + 4]
            assert by_hash.setdefault(h, block) == block
    shared = [r for r in trace if any(h in by_hash for h in r.hash_ids[:1])]
    assert len(shared) > 1


def test_simulator_curve_ends_at_the_whole_replay():
    from radixkv.workloads.replay import replay

    trace = mooncake_e2e.scaled_trace(mooncake_e2e.TRACE, 120, 4, 49152)
    curve = mooncake_e2e.simulator_curve(trace, 4096, 4, step=50)
    assert [k for k, _ in curve] == [50, 100, 120]
    assert curve[-1][1] == replay(trace, "lru", capacity_tokens=4096, page_size=4, block_size=4).hit_rate


def test_mooncake_cli_rejects_bad_flags():
    proc = script("mooncake_e2e.py", "--capacity", "2", "--block", "4")
    assert proc.returncode == 2 and "--capacity" in proc.stderr
    proc = script("mooncake_e2e.py", "--trace", "/nonexistent.jsonl")
    assert proc.returncode == 2 and "--trace" in proc.stderr


@pytest.mark.slow
def test_mooncake_replay_against_the_real_server(tmp_path):
    out = tmp_path / "m.json"
    proc = script("mooncake_e2e.py", "--requests", "40", "--time-scale", "0.02", "--capacity", "4096",
                  "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert len(report["per_request"]) == 40
    assert all(r["ttft"] > 0 and 0 <= r["cached"] <= r["prompt"] for r in report["per_request"])
    assert 0 <= report["server"]["hit_rate"] <= report["unlimited_hit_rate"] + 0.01
    assert report["cpu"] and report["threads"] >= 1
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert "simulator" in proc.stdout


@pytest.mark.slow
def test_customer_service_runs_small_without_peers(tmp_path):
    out = tmp_path / "cs.json"
    proc = script("customer_service.py", "--system-tokens", "200", "--user-tokens", "20", "--concurrency", "2",
                  "--repeats", "1", "--answer-tokens", "2", "--skip", "vllm,transformers", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())["results"]
    assert set(res) == {"radixkv", "radixkv-no-cache"}
    assert res["radixkv"]["concurrent"]["hit_rate"] > 0.5 and res["radixkv-no-cache"]["concurrent"]["hit_rate"] == 0


def test_table_names_the_command_and_date_of_every_row(tmp_path, monkeypatch):
    results = tmp_path / "results"
    shutil.copytree(BENCH / "results", results)
    monkeypatch.setattr(run_all, "RESULTS", results)
    text = run_all.table()
    rows = [line for line in text.splitlines()[2:] if line.startswith("|")]
    assert len(rows) >= 8
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 7
        assert cells[5].startswith("`python benchmarks/")
        measured = datetime.date.fromisoformat(cells[6][:10])  # the date each figure was measured on
        assert datetime.date(2025, 1, 1) <= measured <= datetime.date.today(), cells[6]
    assert "vllm" in text and "transformers" in text


def test_table_leaves_out_what_has_not_run_and_rewrites_only_between_markers(tmp_path, monkeypatch):
    monkeypatch.setattr(run_all, "RESULTS", tmp_path)
    assert run_all.table().count("\n") == 2  # the header alone
    page = tmp_path / "benchmarks.md"
    page.write_text(f"intro\n{run_all.BEGIN}\nold\n{run_all.END}\noutro\n")
    monkeypatch.setattr(run_all, "DOCS", tmp_path)
    run_all.rewrite_performance("| new |\n")
    assert page.read_text() == f"intro\n{run_all.BEGIN}\n| new |\n{run_all.END}\noutro\n"


def test_every_generated_table_has_one_place_in_the_docs():
    # run_all writes each table between its markers in the docs page that holds them: a page
    # that lost its markers would keep stale figures, two pages holding them could disagree
    for name in ["performance", *run_all.SECTIONS]:
        pages = run_all.pages_with(name)
        assert len(pages) == 1, (name, pages)
    assert run_all.pages_with("performance")[0].name == "benchmarks.md"
    assert "performance:begin" not in (REPO / "README.md").read_text()


@pytest.mark.slow
def test_disaggregation_benchmark_runs_small(tmp_path):
    pytest.importorskip("mooncake.engine", reason="the Mooncake extra")
    out = tmp_path / "pd.json"
    proc = script("disaggregation.py", "--setups", "colocated,pd", "--streams", "2", "--stream-tokens", "16",
                  "--long", "2", "--long-tokens", "300", "--gap", "0.3", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {r["setup"]: r for r in report["results"]}
    assert set(rows) == {"colocated", "pd"} and report["cpu"]
    assert rows["pd"]["disagg_transferred_tokens"] >= 2 * 299 and rows["pd"]["disagg_transferred_bytes"] > 0
    assert all(r["itl_samples"] > 0 and r["ttft_p50_s"] > 0 for r in rows.values())
    assert "ITL p99 vs colocated" in proc.stdout
