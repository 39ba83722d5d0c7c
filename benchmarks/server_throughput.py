"""The server against the in-process Engine on the same work, in one run.

1. Multi-turn chat: `--conversations` concurrent conversations x `--turns` turns, closed loop
   (each turn's prompt is the conversation so far + the model's own answer + the next user
   message; ~340-token first prompts, ~65-token follow-ups, `--answer-tokens` answers). Through
   the server: one HTTP client per conversation (`/generate` with input_ids). Through the
   Engine: one thread per conversation. Throughput and cache hit rate for both.
2. Added latency per request: `--latency-requests` sequential 1-token answers to a short
   prompt. What the server's layers add (HTTP, tokenizer manager, two ZMQ hops, detokenizer)
   is the client-side wall time minus the scheduler's own arrival-to-finish time of the same
   request (median); the difference to the Engine's median wall time is reported too (it also
   holds the scheduler process's own step time, which differs from the Engine's).

The Engine lives in this process and idles while the server runs (and the other way round), so
the two never share the cores. Prints a table, writes results/server_throughput.json.

    python benchmarks/server_throughput.py
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from _report import RESULTS, bar_plot, machine, save_json

PROSE = Path(__file__).resolve().parent / "data" / "prose.txt"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conversations", type=int, default=8, help="concurrent conversations (default 8)")
    p.add_argument("--turns", type=int, default=4, help="turns per conversation (default 4)")
    p.add_argument("--answer-tokens", type=int, default=32, help="tokens per answer (default 32)")
    p.add_argument("--latency-requests", type=int, default=40, help="1-token requests timed (default 40)")
    p.add_argument("--port", type=int, default=30123, help="port for the server (default 30123)")
    p.add_argument("--json", type=Path, default=RESULTS / "server_throughput.json", help="results file")
    args = p.parse_args(argv)
    if min(args.conversations, args.turns, args.answer_tokens, args.latency_requests) < 1:
        p.error("every count must be >= 1")
    return args


def workload(tokenizer, conversations: int, turns: int) -> tuple[list[list[int]], list[list[list[int]]]]:
    ids = tokenizer.encode(PROSE.read_text()) * 8
    firsts = [ids[i * 211: i * 211 + 340] for i in range(conversations)]
    follow = [[ids[3000 + (i * turns + t) * 97: 3000 + (i * turns + t) * 97 + 65] for t in range(turns - 1)]
              for i in range(conversations)]
    return firsts, follow


def greedy(n: int) -> dict:
    return {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}


def engine_chat(engine, firsts, follow, answer_tokens) -> dict:
    stats0 = engine.get_stats()

    def conversation(i, out):
        conv = list(firsts[i])
        for t in range(len(follow[i]) + 1):
            if t:
                conv += follow[i][t - 1]
            conv += engine.generate(input_ids=conv, sampling_params=greedy(answer_tokens))["output_ids"]
        out[i] = conv

    results = {}
    start = time.perf_counter()
    threads = [threading.Thread(target=conversation, args=(i, results)) for i in range(len(firsts))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - start
    stats = engine.get_stats()
    prompt = stats["prompt_tokens"] - stats0["prompt_tokens"]
    cached = stats["cached_prompt_tokens"] - stats0["cached_prompt_tokens"]
    return {"seconds": wall, "hit_rate": cached / prompt, "conversations": results}


async def server_chat(url, firsts, follow, answer_tokens) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=64)) as client:
        prompt_tokens = cached_tokens = 0
        results = {}

        async def conversation(i):
            nonlocal prompt_tokens, cached_tokens
            conv = list(firsts[i])
            for t in range(len(follow[i]) + 1):
                if t:
                    conv += follow[i][t - 1]
                r = await client.post("/generate", json={"input_ids": conv, "sampling_params": greedy(answer_tokens)})
                r.raise_for_status()
                out = r.json()
                prompt_tokens += out["meta_info"]["prompt_tokens"]
                cached_tokens += out["meta_info"]["cached_tokens"]
                conv += out["output_ids"]
            results[i] = conv

        start = time.perf_counter()
        await asyncio.gather(*(conversation(i) for i in range(len(firsts))))
        return {"seconds": time.perf_counter() - start, "hit_rate": cached_tokens / prompt_tokens,
                "conversations": results}


def start_server(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "radixkv", "serve", "--port", str(port), "--log-level", "warning",
                             "--max-total-tokens", "65536"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if line.startswith("radixkv ready:"):
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc
    raise RuntimeError(f"the server did not start (exit {proc.wait()})")


def main(argv=None) -> int:
    args = parse_args(argv)
    from radixkv.engine import Engine

    engine = Engine(max_total_tokens=65536, log_level="warning")
    firsts, follow = workload(engine.tokenizer, args.conversations, args.turns)
    print("multi-turn chat through the Engine ...", flush=True)
    eng = engine_chat(engine, firsts, follow, args.answer_tokens)
    short = engine.tokenizer.encode("The capital of France is")
    engine.generate(input_ids=short, sampling_params=greedy(1))
    eng_lat = []
    for _ in range(args.latency_requests):
        start = time.perf_counter()
        engine.generate(input_ids=short, sampling_params=greedy(1))
        eng_lat.append(time.perf_counter() - start)
    print("starting the server ...", flush=True)
    server = start_server(args.port)
    url = f"http://127.0.0.1:{args.port}"
    try:
        print("multi-turn chat through the server ...", flush=True)
        srv = asyncio.run(server_chat(url, firsts, follow, args.answer_tokens))
        srv_lat, layers = [], []
        with httpx.Client(base_url=url, timeout=60) as c:
            c.post("/generate", json={"input_ids": short, "sampling_params": greedy(1)}).raise_for_status()
            for _ in range(args.latency_requests):
                start = time.perf_counter()
                r = c.post("/generate", json={"input_ids": short, "sampling_params": greedy(1)})
                wall = time.perf_counter() - start
                r.raise_for_status()
                srv_lat.append(wall)
                layers.append(wall - r.json()["meta_info"]["e2e_latency"])
    finally:
        server.terminate()
        server.wait(30)
        engine.shutdown()
    same = srv["conversations"] == eng["conversations"]
    tokens = args.conversations * args.turns * args.answer_tokens
    added_ms = statistics.median(layers) * 1e3
    vs_engine_ms = (statistics.median(srv_lat) - statistics.median(eng_lat)) * 1e3
    rows = {"engine_seconds": eng["seconds"], "server_seconds": srv["seconds"],
            "engine_output_tok_s": tokens / eng["seconds"], "server_output_tok_s": tokens / srv["seconds"],
            "server_vs_engine_throughput": eng["seconds"] / srv["seconds"],
            "engine_hit_rate": eng["hit_rate"], "server_hit_rate": srv["hit_rate"],
            "same_greedy_tokens": same, "engine_1token_median_ms": statistics.median(eng_lat) * 1e3,
            "server_1token_median_ms": statistics.median(srv_lat) * 1e3, "added_latency_median_ms": added_ms,
            "server_minus_engine_median_ms": vs_engine_ms,
            "server_1token_p90_ms": sorted(srv_lat)[int(0.9 * len(srv_lat))] * 1e3}
    print(f"\n{'':<34}{'Engine':>12}{'server':>12}")
    print(f"{'multi-turn wall (s)':<34}{eng['seconds']:>12.2f}{srv['seconds']:>12.2f}")
    print(f"{'output tokens/s':<34}{rows['engine_output_tok_s']:>12.1f}{rows['server_output_tok_s']:>12.1f}")
    print(f"{'cache hit rate':<34}{eng['hit_rate']:>12.1%}{srv['hit_rate']:>12.1%}")
    print(f"{'1-token request, median (ms)':<34}{rows['engine_1token_median_ms']:>12.1f}"
          f"{rows['server_1token_median_ms']:>12.1f}")
    print(f"server throughput = {rows['server_vs_engine_throughput']:.2f}x the Engine's; the server's layers "
          f"add {added_ms:.1f} ms per request at the median ({vs_engine_ms:.1f} ms over the Engine's wall "
          f"time); greedy tokens identical: {same}")
    save_json(args.json, {**machine(), "conversations": args.conversations, "turns": args.turns,
                          "answer_tokens": args.answer_tokens, **rows})
    bar_plot(args.json.with_suffix(".png"), "multi-turn through the server vs in process (lower is better)",
             "wall time (s)", {"Engine (in process)": eng["seconds"], "server (HTTP + ZMQ)": srv["seconds"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
