"""Under memory pressure the cache decides: radixkv and vLLM with the same small KV budget.

Many more concurrent conversations than the KV pool holds, several turns each (the closed loop
of `multiturn.py`: each turn is the conversation so far + the model's own answer + a new
message), both engines given the same budget in tokens: radixkv `--max-total-tokens B`, vLLM
`--num-gpu-blocks-override B/32` at block 32 (its prefix caching on). radixkv runs its defaults
first; tuned settings are extra rows naming their flags. Reports hit rate (cached prompt
tokens / prompt tokens, as each server reports them), output throughput and TTFT p50/p90 side
by side, and the ratios against vLLM.

    python benchmarks/memory_pressure.py
    python benchmarks/memory_pressure.py --users 24 --budget 4096 --skip vllm
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import httpx
from tqdm import tqdm

from _report import RESULTS, machine, save_json
from _servers import start_radixkv, start_vllm
from multiturn import closed_loop, closed_workload

BLOCK = 32
ROWS = {"radixkv (defaults)": [], "radixkv --hold-finished-seconds 0": ["--hold-finished-seconds", "0"],
        "radixkv --schedule-policy fcfs": ["--schedule-policy", "fcfs"]}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--users", type=int, default=16, help="concurrent conversations (default 16)")
    p.add_argument("--turns", type=int, default=4, help="turns per conversation (default 4)")
    p.add_argument("--answer-tokens", type=int, default=32, help="tokens per answer (default 32)")
    p.add_argument("--budget", type=int, default=4096, help=f"KV tokens for each engine (a multiple of {BLOCK}; "
                   "default 4096)")
    p.add_argument("--skip", default="", help="rows to leave out: 'vllm', 'fcfs', 'hold'")
    p.add_argument("--json", type=Path, default=RESULTS / "memory_pressure.json", help="results file")
    args = p.parse_args(argv)
    if args.budget % BLOCK or args.budget < 1024 or args.users < 1 or args.turns < 1:
        p.error(f"--budget must be a multiple of {BLOCK} and >= 1024; --users and --turns >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from radixkv.model.loader import resolve_model_dir
    from radixkv.tokenizer import Tokenizer

    model_dir = str(resolve_model_dir(None))
    tokenizer = Tokenizer(model_dir)
    firsts, follow = closed_workload(tokenizer, args.users, args.turns)
    rows = {name: flags for name, flags in ROWS.items() if not any(s and s in name for s in args.skip.split(","))}
    if "vllm" not in args.skip:
        rows[f"vllm (block {BLOCK}, --num-gpu-blocks-override {args.budget // BLOCK})"] = None
    results, skipped = {}, {}
    bar = tqdm(total=len(rows) * args.users * args.turns, desc="memory pressure", unit="request")
    for name, flags in rows.items():
        if flags is None:
            server, why = start_vllm(model_dir, BLOCK, max_model_len=args.budget // 2,  # (vLLM keeps one block
                                     extra=("--num-gpu-blocks-override", str(args.budget // BLOCK)))  # back)
        else:
            server, why = start_radixkv("--max-total-tokens", str(args.budget), *flags), None
        if server is None:
            skipped[name] = why
            print(f"\n{name}: not run: {why[:400]}", flush=True)
            bar.update(args.users * args.turns)
            continue
        try:
            results[name] = asyncio.run(closed_loop(server.url, server.model, tokenizer, firsts, follow,
                                                    args.answer_tokens, bar))
            if flags is not None:  # how the scheduler coped: retractions, batch sizes, where time went
                info = httpx.get(server.url + "/server_info", timeout=30).json()
                stats = info.get("stats", info)
                results[name]["server"] = {k: stats.get(k) for k in (
                    "retractions", "decode_steps", "extend_steps", "mixed_steps", "decode_batch_tokens",
                    "prefill_tokens", "decode_tokens", "step_seconds", "cache_causes", "holds_taken",
                    "holds_claimed", "holds_expired", "holds_yielded", "holds_skipped")}
        finally:
            server.stop()
    bar.close()
    print(f"\n{args.users} conversations x {args.turns} turns, {args.budget:,} KV tokens each")
    print(f"{'engine':<52}{'hit':>7}{'out tok/s':>11}{'TTFT p50':>10}{'p90':>7}")
    for name, r in results.items():
        hit = f"{r['hit_rate']:.1%}" if r["hit_rate"] is not None else "-"
        print(f"{name:<52}{hit:>7}{r['output_tok_s']:>11.1f}{r['ttft_p50']:>10.2f}{r['ttft_p90']:>7.2f}")
    ratios = {}
    vllm = next((n for n in results if n.startswith("vllm")), None)
    if vllm is not None and "radixkv (defaults)" in results:
        ours, theirs = results["radixkv (defaults)"], results[vllm]
        ratios = {"throughput": ours["output_tok_s"] / theirs["output_tok_s"],
                  "ttft_p50": ours["ttft_p50"] / theirs["ttft_p50"],
                  "hit_rate": (ours["hit_rate"], theirs["hit_rate"])}
        print(f"radixkv (defaults) vs vLLM: throughput {ratios['throughput']:.2f}x (goal >= 1.4x), TTFT p50 "
              f"{ratios['ttft_p50']:.2f}x, hit rate {ours['hit_rate']:.1%} vs {theirs['hit_rate']:.1%}")
    save_json(args.json, {**machine(), "args": {k: v for k, v in vars(args).items() if k != "json"},
                          "results": results, "ratios": ratios, "skipped": skipped})
    return 0


if __name__ == "__main__":
    sys.exit(main())
