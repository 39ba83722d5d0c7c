import json
import subprocess
import sys
from pathlib import Path

from radixkv.workloads.chat import ChatTraceConfig, generate_chat_trace, write_trace

REPO = Path(__file__).resolve().parents[2]
FIELDS = {"policy", "page_size", "capacity_tokens", "requests", "prompt_tokens", "hit_tokens",
          "hit_rate", "seconds", "tokens_per_second"}


def run(*args):
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "trace_hit_rate.py"), *args],
                          capture_output=True, text=True, timeout=300)


def test_cli_sweeps_policies_saves_json_and_plot(tmp_path):
    trace = tmp_path / "chat.jsonl"
    write_trace(generate_chat_trace(ChatTraceConfig(num_requests=60, num_conversations=8)), trace)
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    proc = run("--trace", str(trace), "--page-size", "16", "--capacity-tokens", "2000,8000",
               "--policy", "lru,lfu,fifo,belady,inf,none", "--json", str(out), "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(out.read_text())["runs"]
    assert {(r["policy"], r["capacity_tokens"] if r["policy"] not in ("inf", "none") else 0)
            for r in runs} >= {("lru", 2000), ("belady", 8000), ("inf", 0), ("none", 0)}
    assert len(runs) == 4 * 2 + 2
    assert all(FIELDS <= set(r) for r in runs)
    assert png.stat().st_size > 10_000
    assert "lru" in proc.stdout and "hit rate" in proc.stdout


def test_cli_rejects_bad_flags_with_the_flag_named(tmp_path):
    proc = run("--policy", "mru")
    assert proc.returncode == 2 and "--policy" in proc.stderr and "mru" in proc.stderr
    proc = run("--trace", str(tmp_path / "nope.jsonl"))
    assert proc.returncode == 2 and "--trace" in proc.stderr
    proc = run("--capacity-tokens", "0")
    assert proc.returncode == 2 and "--capacity-tokens" in proc.stderr
