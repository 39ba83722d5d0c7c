"""Multi-turn chat through real servers, closed loop and open loop, radixkv against its peers.

- Closed loop: `--users` concurrent users, `--turns` turns each; each turn's prompt is the
  conversation so far + the model's own answer (as it returned it) + a new message (~340-token
  first prompts, ~65-token follow-ups, `--answer-tokens` answers).
- Open loop: a synthetic multi-turn chat trace (`radixkv.workloads.chat`: shared system prompts,
  Zipf conversation popularity, Poisson arrivals at `--rate` requests/s), each request sent at
  its arrival time whatever is still running.

Engines, one at a time on the machine, in one run: radixkv (lpm and fcfs with the radix cache,
lpm without it), vLLM (prefix caching, block 32 and 128, both cores), and for the closed loop
transformers `generate` batched per turn. Throughput, TTFT p50/p90/p99, cache hit rate.

    python benchmarks/multiturn.py
    python benchmarks/multiturn.py --skip vllm --users 4
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import httpx
from tqdm import tqdm

from _load import complete, summary
from _report import RESULTS, machine, same_mkl, save_figure, save_json
from _servers import start_engine

PROSE = Path(__file__).resolve().parent / "data" / "prose.txt"
ENGINES = ("radixkv-lpm", "radixkv-fcfs", "radixkv-no-cache", "vllm-b32", "vllm-b128", "transformers")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--users", type=int, default=8, help="closed loop: concurrent users (default 8)")
    p.add_argument("--turns", type=int, default=4, help="closed loop: turns per user (default 4)")
    p.add_argument("--answer-tokens", type=int, default=32, help="tokens per answer (default 32)")
    p.add_argument("--open-requests", type=int, default=48, help="open loop: requests (default 48)")
    p.add_argument("--rate", type=float, default=1.0, help="open loop: arrivals per second (default 1.0)")
    p.add_argument("--skip", default="", help=f"engines to leave out: {','.join(ENGINES)} (or 'vllm')")
    p.add_argument("--json", type=Path, default=RESULTS / "multiturn.json", help="results file")
    args = p.parse_args(argv)
    args.skip = {e for s in args.skip.split(",") if s for e in ENGINES if e.startswith(s)}
    return args


def closed_workload(tokenizer, users: int, turns: int):
    ids = tokenizer.encode_segment(PROSE.read_text()) * 8
    firsts = [ids[i * 211: i * 211 + 340] for i in range(users)]
    follow = [[ids[3000 + (i * turns + t) * 97: 3000 + (i * turns + t) * 97 + 65] for t in range(turns - 1)]
              for i in range(users)]
    return firsts, follow


def open_workload(requests: int, rate: float, vocab: int):
    from radixkv.workloads.chat import ChatTraceConfig, generate_chat_trace

    cfg = ChatTraceConfig(num_requests=requests, num_conversations=max(4, requests // 4), num_groups=2,
                          system_tokens=256, user_tokens=(48, 80), answer_tokens=(24, 40), request_rate=rate,
                          vocab_high=vocab, seed=7)
    return [(r["timestamp"] / 1000.0, list(r["input_ids"])) for r in generate_chat_trace(cfg)]


async def closed_loop(url, model, tokenizer, firsts, follow, answer_tokens, bar):
    async with httpx.AsyncClient(base_url=url, timeout=900, limits=httpx.Limits(max_connections=64)) as c:
        replies = []

        async def user(i):
            conv = list(firsts[i])
            for t in range(len(follow[i]) + 1):
                if t:
                    conv += follow[i][t - 1]
                reply = await complete(c, model, conv, answer_tokens)
                replies.append(reply)
                conv += tokenizer.encode_segment(reply.text)  # the model's own answer, as it returned it
                bar.update(1)

        start = time.perf_counter()
        await asyncio.gather(*(user(i) for i in range(len(firsts))))
        return summary(replies, time.perf_counter() - start)


async def open_loop(url, model, requests, answer_tokens, bar):
    async with httpx.AsyncClient(base_url=url, timeout=900, limits=httpx.Limits(max_connections=256)) as c:
        start = time.perf_counter()

        async def one(at, ids):
            await asyncio.sleep(max(0.0, at - (time.perf_counter() - start)))
            reply = await complete(c, model, ids, answer_tokens)
            bar.update(1)
            return reply

        replies = await asyncio.gather(*(one(at, ids) for at, ids in requests))
        return summary(replies, time.perf_counter() - start)


def transformers_closed(model_dir, tokenizer, firsts, follow, answer_tokens, bar) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    convs = [list(f) for f in firsts]
    start = time.perf_counter()
    for t in range(len(follow[0]) + 1):
        if t:
            convs = [c + f[t - 1] for c, f in zip(convs, follow)]
        width = max(map(len, convs))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in convs])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in convs])
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=answer_tokens,
                                 min_new_tokens=answer_tokens, do_sample=False, pad_token_id=0)
        convs = [c + tokenizer.encode_segment(tokenizer.decode(o[width:].tolist())) for c, o in zip(convs, out)]
        bar.update(len(convs))
    wall = time.perf_counter() - start
    n = len(firsts) * (len(follow[0]) + 1)
    return {"requests": n, "seconds": wall, "requests_per_s": n / wall, "output_tok_s": n * answer_tokens / wall,
            "ttft_p50": None, "ttft_p90": None, "ttft_p99": None, "hit_rate": 0.0}


def plot(closed: dict, opened: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(closed)
    a.bar(range(len(names)), [closed[n]["seconds"] for n in names])
    a.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    a.set_ylabel("wall time (s)")
    a.set_title("closed loop (lower is better)")
    names = list(opened)
    b.bar([i - 0.2 for i in range(len(names))], [opened[n]["ttft_p50"] for n in names], 0.4, label="p50")
    b.bar([i + 0.2 for i in range(len(names))], [opened[n]["ttft_p90"] for n in names], 0.4, label="p90")
    b.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    b.set_ylabel("time to first token (s)")
    b.set_title("open loop, Poisson arrivals")
    b.legend()
    save_figure(fig, path)


def main(argv=None) -> int:
    args = parse_args(argv)
    same_mkl()  # the transformers peer runs in this process
    from radixkv.model.loader import resolve_model_dir
    from radixkv.tokenizer import Tokenizer

    model_dir = str(resolve_model_dir(None))
    tokenizer = Tokenizer(model_dir)
    firsts, follow = closed_workload(tokenizer, args.users, args.turns)
    requests = open_workload(args.open_requests, args.rate, tokenizer.vocab_size)
    engines = [e for e in ENGINES if e not in args.skip]
    per_engine = args.users * args.turns + len(requests)
    closed, opened, skipped = {}, {}, {}
    bar = tqdm(total=len(engines) * per_engine, desc="multi-turn", unit="request")
    for engine in engines:
        if engine == "transformers":
            closed[engine] = transformers_closed(model_dir, tokenizer, firsts, follow, args.answer_tokens, bar)
            bar.update(len(requests))
            continue
        policy = "fcfs" if engine.endswith("fcfs") else "lpm"
        server, reason = start_engine(engine, model_dir, "--max-total-tokens", "65536", "--schedule-policy", policy)
        if server is None:
            skipped[engine] = reason
            print(f"\n{engine}: not run: {reason[:400]}", flush=True)
            bar.update(per_engine)
            continue
        try:
            closed[engine] = asyncio.run(closed_loop(server.url, server.model, tokenizer, firsts, follow,
                                                     args.answer_tokens, bar))
            opened[engine] = asyncio.run(open_loop(server.url, server.model, requests, args.answer_tokens, bar))
        finally:
            server.stop()
    bar.close()
    for title, rows in (("closed loop", closed), ("open loop", opened)):
        print(f"\n{title}: {'engine':<18}{'wall s':>8}{'out tok/s':>10}{'TTFT p50':>9}{'p90':>7}{'p99':>7}{'hit':>7}")
        for name, r in rows.items():
            f = [f"{r[k]:.2f}" if r[k] is not None else "-" for k in ("ttft_p50", "ttft_p90", "ttft_p99")]
            hit = f"{r['hit_rate']:.0%}" if r["hit_rate"] is not None else "-"
            print(f"{'':<13}{name:<18}{r['seconds']:>8.1f}{r['output_tok_s']:>10.1f}{f[0]:>9}{f[1]:>7}{f[2]:>7}{hit:>7}")
    vllm = [n for n in closed if n.startswith("vllm")]
    ratios = {}
    if vllm and "radixkv-lpm" in closed:
        best = min(vllm, key=lambda n: closed[n]["seconds"])
        ours, theirs = closed["radixkv-lpm"], closed[best]
        ratios = {"vs": best, "closed_wall_ratio": ours["seconds"] / theirs["seconds"],
                  "closed_throughput_ratio": ours["output_tok_s"] / theirs["output_tok_s"],
                  "closed_ttft_p50_ratio": ours["ttft_p50"] / theirs["ttft_p50"]}
        print(f"\nradixkv (lpm) closed loop vs {best}: throughput {ratios['closed_throughput_ratio']:.2f}x "
              f"(goal >= 1.4x), TTFT p50 {ratios['closed_ttft_p50_ratio']:.2f}x (goal <= 0.9x)")
    for name, why in skipped.items():
        print(f"{name}: not run ({why[:200]})")
    save_json(args.json, {**machine(), "args": {k: v for k, v in vars(args).items() if k != "json"},
                          "closed_loop": closed, "open_loop": opened, "skipped": skipped, "ratios": ratios})
    if closed:
        plot(closed, opened, args.json.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
