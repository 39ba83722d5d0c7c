"""The Mooncake conversation trace replayed end to end against the real server, and the hit rate
the cache simulator predicts for the same requests and capacity.

The trace is scaled to this machine: each 512-token block becomes `--block` tokens (4:
synthetic token ids drawn from the block's prefix id, so equal prefixes stay equal token for
token), the first `--requests` requests, arrival times multiplied by `--time-scale`. Each
request asks for one token, so what the server caches is exactly the prompt, as in the
simulator. The server runs FCFS (file order, like the simulator) with pages of `--block` tokens
and a KV pool of `--capacity` tokens, so LRU eviction decides the hit rate in both.

    python benchmarks/mooncake_e2e.py
    python benchmarks/mooncake_e2e.py --requests 1000 --capacity 8192

The defaults (600 requests, 4-token blocks, a 16,384-token pool, real-time arrivals) keep the
server just under its capacity on 2 cores (about 200 s) and put the cache under pressure: the
simulator predicts 8.3% at this capacity and 17.1% with unlimited memory.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import httpx
import numpy as np
from tqdm import tqdm

from _load import complete, summary
from _report import RESULTS, machine, save_figure, save_json
from _servers import start_radixkv

TRACE = Path(__file__).resolve().parent / "data" / "mooncake_conversation_trace.jsonl"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, default=TRACE, help="Mooncake-format trace (default: %(default)s)")
    p.add_argument("--requests", type=int, default=600, help="first K requests (default 600)")
    p.add_argument("--block", type=int, default=4, help="tokens per 512-token trace block (default 4)")
    p.add_argument("--capacity", type=int, default=16384, help="KV pool in tokens, server and simulator "
                   "(default 16384)")
    p.add_argument("--time-scale", type=float, default=1.0, help="multiply arrival times (default 1.0: "
                   "real time; < 1 compresses)")
    p.add_argument("--json", type=Path, default=RESULTS / "mooncake_e2e.json", help="results file")
    args = p.parse_args(argv)
    if args.requests < 1 or args.block < 1 or args.capacity < args.block or args.time_scale <= 0:
        p.error("--requests, --block >= 1; --capacity >= --block; --time-scale > 0")
    if not args.trace.is_file():
        p.error(f"--trace: no such file: {args.trace}")
    return args


def scaled_trace(path: Path, limit: int, block: int, vocab: int):
    """The trace with `block` synthetic tokens per 512-token block (the last one in proportion)."""
    from radixkv.workloads.trace import BLOCK_SIZE, TraceRequest, load_trace

    blocks: dict[int, list[int]] = {}

    def tokens_of(h: int) -> list[int]:
        if h not in blocks:
            blocks[h] = np.random.default_rng(h).integers(100, vocab, size=block).tolist()
        return blocks[h]

    out = []
    for req in load_trace(path, limit):
        last = req.input_length - BLOCK_SIZE * (len(req.hash_ids) - 1)
        ids = [t for h in req.hash_ids for t in tokens_of(h)]
        ids = ids[: block * (len(req.hash_ids) - 1) + max(1, round(last * block / BLOCK_SIZE))]
        out.append(TraceRequest(req.timestamp, len(ids), 1, req.hash_ids, tuple(ids)))
    return out


async def replay_on_server(url: str, model: str, trace, time_scale: float, bar) -> list:
    async with httpx.AsyncClient(base_url=url, timeout=3600, limits=httpx.Limits(max_connections=512)) as c:
        start = time.perf_counter()

        async def one(req):
            await asyncio.sleep(max(0.0, req.timestamp / 1000 * time_scale - (time.perf_counter() - start)))
            reply = await complete(c, model, list(req.input_ids), 1)
            bar.update(1)
            return reply

        return await asyncio.gather(*(one(r) for r in trace))


def simulator_curve(trace, capacity: int, block: int, step: int = 50) -> list[tuple[int, float]]:
    """Cumulative simulated hit rate after the first k requests (replay is prefix-closed)."""
    from radixkv.workloads.replay import replay

    ks = sorted({*range(step, len(trace), step), len(trace)})
    return [(k, replay(trace[:k], "lru", capacity_tokens=capacity, page_size=block, block_size=block).hit_rate)
            for k in ks]


def plot(replies, curve, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    cached = np.cumsum([r.cached_tokens or 0 for r in replies])
    prompt = np.cumsum([r.prompt_tokens for r in replies])
    a.plot(range(1, len(replies) + 1), cached / prompt * 100, label="server (measured)")
    a.plot([k for k, _ in curve], [h * 100 for _, h in curve], "o--", label="simulator (predicted)")
    a.set_xlabel("requests replayed")
    a.set_ylabel("cumulative token hit rate (%)")
    a.set_title("hit rate: server vs simulator")
    a.legend()
    t0 = min(r.sent for r in replies)
    b.scatter([r.sent - t0 for r in replies], [r.ttft for r in replies], s=4,
              c=[(r.cached_tokens or 0) / max(1, r.prompt_tokens) for r in replies], cmap="viridis")
    b.set_xlabel("sent at (s)")
    b.set_ylabel("time to first token (s)")
    b.set_title("TTFT per request (colour: cached share)")
    save_figure(fig, path)


def main(argv=None) -> int:
    args = parse_args(argv)
    from radixkv.model.loader import resolve_model_dir
    from radixkv.tokenizer import Tokenizer
    from radixkv.workloads.replay import replay

    vocab = Tokenizer(resolve_model_dir(None)).vocab_size
    trace = scaled_trace(args.trace, args.requests, args.block, vocab)
    predicted = replay(trace, "lru", capacity_tokens=args.capacity, page_size=args.block, block_size=args.block)
    everything = sum(r.input_length for r in trace) + args.block * len(trace)  # room for every page
    unlimited = replay(trace, "lru", capacity_tokens=everything, page_size=args.block, block_size=args.block)
    prompt_tokens = sum(r.input_length for r in trace)
    span = trace[-1].timestamp / 1000 * args.time_scale
    print(f"{len(trace)} requests, {prompt_tokens} prompt tokens ({prompt_tokens / len(trace):.0f} a request), "
          f"arriving over {span:.0f} s; simulator: hit rate {predicted.hit_rate:.1%} at {args.capacity} tokens "
          f"({unlimited.hit_rate:.1%} unlimited)",
          flush=True)
    server = start_radixkv("--page-size", str(args.block), "--max-total-tokens", str(args.capacity),
                           "--schedule-policy", "fcfs", "--context-length", "8192")
    try:
        with tqdm(total=len(trace), desc="mooncake replay", unit="request") as bar:
            start = time.perf_counter()
            replies = asyncio.run(replay_on_server(server.url, server.model, trace, args.time_scale, bar))
            wall = time.perf_counter() - start
    finally:
        server.stop()
    measured = summary(replies, wall)
    gap = (measured["hit_rate"] - predicted.hit_rate) * 100
    print(f"\nserver: hit rate {measured['hit_rate']:.1%} (simulator {predicted.hit_rate:.1%}: {gap:+.2f} points); "
          f"TTFT p50 {measured['ttft_p50']:.2f} s, p90 {measured['ttft_p90']:.2f} s, p99 {measured['ttft_p99']:.2f} s; "
          f"{wall:.0f} s for {span:.0f} s of arrivals")
    save_json(args.json, {**machine(), "args": {k: str(v) for k, v in vars(args).items() if k != "json"},
                          "prompt_tokens": prompt_tokens, "arrival_span_s": span,
                          "predicted_hit_rate": predicted.hit_rate,
                          "unlimited_hit_rate": unlimited.hit_rate, "server": measured, "gap_points": gap,
                          "per_request": [{"prompt": r.prompt_tokens, "cached": r.cached_tokens, "ttft": r.ttft}
                                          for r in replies]})
    plot(replies, simulator_curve(trace, args.capacity, args.block), args.json.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
