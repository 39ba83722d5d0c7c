"""Prefill/decode disaggregation: what it does to decode latency under prefill interference.

Requests decoding (`--streams` slots, each a short-prompt stream after another) are interrupted by long
prompts arriving while they decode (`--long` prompts of `--long-tokens` tokens, one every
`--gap` seconds). On one server every long prompt's prefill runs in the same forwards as the
decodes (chunked prefill) and the decoding streams stall; with prefill and decode on separate
servers the decode server only receives the prompts' pages. Measured from outside, streamed:

    itl       the decoding streams' gaps between chunks (p50, p99, max), ms
    ttft      the long prompts' time to first token (p50, max), s
    transfer  seconds and bytes the long prompts' pages took between the servers (PD only)

Setups on this machine's cores, each measured alone:
    colocated  one `radixkv serve` with its defaults, on every core
    chunked    the same with `--chunked-prefill-size 256` (smaller prefill chunks per forward: the
               colocated server's own lever against stalls)
    pd         `--disaggregation-mode prefill` on the first half of the cores and `decode` on
               the rest (`taskset`, `--num-threads`), behind `radixkv router --pd-disaggregation`

    python benchmarks/disaggregation.py
    python benchmarks/disaggregation.py --long 4 --long-tokens 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

import httpx

from _load import percentile
from _report import RESULTS, machine, save_json
from _servers import Server, free_port

VOCAB = (200, 20000)  # token ids the prompts are drawn from (SmolLM2's ordinary tokens)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=4, help="requests decoding throughout (default 4)")
    p.add_argument("--stream-tokens", type=int, default=64, help="tokens each decoding request asks for; a "
                   "stream that ends starts another until the long prompts are done (default 64)")
    p.add_argument("--long", type=int, default=6, help="long prompts arriving while they decode (default 6)")
    p.add_argument("--long-tokens", type=int, default=1500, help="tokens per long prompt (default 1500)")
    p.add_argument("--gap", type=float, default=1.5, help="seconds between long prompts (default 1.5)")
    p.add_argument("--setups", default="colocated,chunked,pd", help="which setups (default colocated,chunked,pd)")
    p.add_argument("--json", type=Path, default=RESULTS / "disaggregation.json", help="results file")
    args = p.parse_args(argv)
    args.setups = [s for s in args.setups.split(",") if s]
    if not set(args.setups) <= {"colocated", "chunked", "pd"} or args.streams < 1 or args.long < 1 or args.long_tokens < 64:
        p.error("--setups from colocated,chunked,pd; --streams >= 1, --long >= 1, --long-tokens >= 64")
    return args


def radixkv(name: str, cores: list[int] | None, *args: str) -> Server:
    port = free_port()
    head = ["taskset", "-c", ",".join(map(str, cores))] if cores else []
    threads = ["--num-threads", str(len(cores))] if cores else []
    cmd = [*head, sys.executable, "-m", "radixkv", "serve", "--port", str(port), "--log-level", "warning",
           "--served-model-name", "model", *threads, *args]
    return Server(name, cmd, port, model="model")


def router(prefill: Server, bootstrap: int, decode: Server) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "radixkv", "router", "--pd-disaggregation", "--prefill", prefill.url, str(bootstrap),
           "--decode", decode.url, "--port", str(port), "--log-level", "warning"]
    return Server("router", cmd, port)


def ready(*servers: Server) -> None:
    for s in servers:
        reason = s.wait_ready("/health", 600)
        if reason:
            raise RuntimeError(reason)


async def stream(client: httpx.AsyncClient, ids: list[int], max_new: int) -> dict:
    """One streamed /generate: when it started, each chunk's arrival, the tokens of each."""
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": max_new, "temperature": 0.0, "ignore_eos": True}}
    start, arrivals, counts, seen = time.perf_counter(), [], [], 0
    async with client.stream("POST", "/generate", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"/generate answered {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"a stream failed: {event['error']}")
            n = len(event["output_ids"])
            if n > seen:
                arrivals.append(time.perf_counter())
                counts.append(n - seen)
                seen = n
    return {"start": start, "arrivals": arrivals, "counts": counts}


async def decoder(client: httpx.AsyncClient, rng: random.Random, tokens: int, done: asyncio.Event) -> list[dict]:
    """One stream slot: a new short-prompt request each time the last one ends, until `done`."""
    runs = []
    while not done.is_set():
        runs.append(await stream(client, [rng.randrange(*VOCAB) for _ in range(48)], tokens))
    return runs


async def workload(url: str, args, rng: random.Random) -> dict:
    longs = [[rng.randrange(*VOCAB) for _ in range(args.long_tokens)] for _ in range(args.long)]
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await stream(client, [rng.randrange(*VOCAB) for _ in range(16)], 4)  # warm: first-request costs out
        done = asyncio.Event()
        slots = [asyncio.create_task(decoder(client, random.Random(i), args.stream_tokens, done))
                 for i in range(args.streams)]
        await asyncio.sleep(2.0)
        arriving = []
        for ids in longs:
            arriving.append(asyncio.create_task(stream(client, ids, 16)))
            await asyncio.sleep(args.gap)
        prompted = await asyncio.gather(*arriving)
        done.set()
        decoded = [run for runs in await asyncio.gather(*slots) for run in runs]
    first_long = min(p["start"] for p in prompted)
    last_long = max(p["arrivals"][0] for p in prompted)
    gaps = [b - a for d in decoded for a, b, in zip(d["arrivals"], d["arrivals"][1:])
            if first_long <= b <= last_long]  # while the long prompts arrive and prefill
    ttft = [p["arrivals"][0] - p["start"] for p in prompted]
    tokens = sum(1 for d in decoded for a in d["arrivals"] if first_long <= a <= last_long)
    wall = last_long - first_long
    return {"itl_p50_ms": 1000 * percentile(gaps, 0.5), "itl_p99_ms": 1000 * percentile(gaps, 0.99),
            "itl_max_ms": 1000 * max(gaps), "itl_samples": len(gaps),
            "ttft_p50_s": percentile(ttft, 0.5), "ttft_max_s": max(ttft),
            "decode_chunks_per_s": tokens / wall,
            "tokens_per_chunk": sum(sum(d["counts"]) for d in decoded) / sum(len(d["counts"]) for d in decoded)}


def disagg_stats(server: Server) -> dict:
    return httpx.get(server.url + "/server_info", timeout=30).json()["disaggregation"] or {}


def run_setup(name: str, args) -> dict:
    cores = sorted(os.sched_getaffinity(0))
    rng = random.Random(0)
    if name in ("colocated", "chunked"):
        flags = ["--chunked-prefill-size", "256"] if name == "chunked" else []
        server = radixkv(name, None, *flags)
        try:
            ready(server)
            return {"setup": name, "flags": " ".join(flags) or "defaults, every core",
                    **asyncio.run(workload(server.url, args, rng))}
        finally:
            server.stop()
    half = max(1, len(cores) // 2)
    bootstrap = free_port()
    prefill = radixkv("prefill", cores[:half], "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port",
                      str(bootstrap))
    decode = radixkv("decode", cores[half:] or cores[:1], "--disaggregation-mode", "decode")
    front = None
    try:
        ready(prefill, decode)
        front = router(prefill, bootstrap, decode)
        ready(front)
        before = disagg_stats(decode)
        result = asyncio.run(workload(front.url, args, rng))
        after = disagg_stats(decode)
        moved = {k: after[k] - before.get(k, 0) for k in ("disagg_transfers", "disagg_transferred_tokens",
                                                          "disagg_transferred_bytes", "disagg_transfer_seconds")}
        seconds = moved["disagg_transfer_seconds"]
        return {"setup": name, "flags": f"prefill on cores {cores[:half]}, decode on {cores[half:] or cores[:1]}, "
                                        "radixkv router --pd-disaggregation", **result, **moved,
                "transfer_ms_per_prompt": 1000 * seconds / max(1, moved["disagg_transfers"]),
                "transfer_gb_per_s": moved["disagg_transferred_bytes"] / seconds / 1e9 if seconds else None}
    finally:
        for s in (front, decode, prefill):
            if s is not None:
                s.stop()


def table(report: dict, measured: str = "") -> str:
    """The results as a Markdown table (run_all renders it into docs/disaggregation.md)."""
    w = report["workload"]
    head = (f"{w['streams']} decoding streams, {w['long']} prompts of {w['long_tokens']:,} tokens arriving "
            f"{w['gap']} s apart; ITL over the streams while the prompts arrive and prefill.\n\n")
    rows = ["| setup | decode ITL p50 / p99 / max (ms) | ITL p99 vs colocated | long-prompt TTFT p50 / max (s) | "
            "TTFT p50 vs colocated | decode chunks/s | pages moved |", "|---|---|---|---|---|---|---|"]
    base = next((r for r in report["results"] if r["setup"] == "colocated"), None)
    for r in report["results"]:
        p99 = f"{r['itl_p99_ms'] / base['itl_p99_ms']:.2f}x" if base else "-"
        ttft = f"{r['ttft_p50_s'] / base['ttft_p50_s']:.2f}x" if base else "-"
        moved = (f"{r['disagg_transferred_tokens']:,} tokens, {r['disagg_transferred_bytes'] / 1e6:.0f} MB, "
                 f"{r['transfer_ms_per_prompt']:.0f} ms/prompt" if "disagg_transfers" in r else "-")
        rows.append(f"| {r['setup']} ({r['flags']}) | {r['itl_p50_ms']:.0f} / {r['itl_p99_ms']:.0f} / "
                    f"{r['itl_max_ms']:.0f} | {p99} | {r['ttft_p50_s']:.2f} / {r['ttft_max_s']:.2f} | {ttft} | "
                    f"{r['decode_chunks_per_s']:.1f} | {moved} |")
    tail = f"\n\n`python benchmarks/disaggregation.py`, {measured}.\n" if measured else "\n"
    return head + "\n".join(rows) + tail


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    results = []
    for name in args.setups:
        print(f"== {name}", flush=True)
        results.append(run_setup(name, args))
        print(json.dumps(results[-1], indent=1), flush=True)
    report = {**machine(), "workload": {k: getattr(args, k) for k in
                                                 ("streams", "stream_tokens", "long", "long_tokens", "gap")},
              "results": results}
    print(table(report, report["date"][:10]))
    save_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
